"""veRL's ``verl.utils.config`` import path: the config loader lives in ``hybridflow.config.loader``."""

from hybridflow.config.loader import (
    ConfigError,
    available_configs,
    check_overrides,
    config_dir,
    default_config,
    load_config,
    main_entry,
    omega_conf_to_dataclass,
    parse_cli,
    raw_default_config,
    suggest_keys,
)

__all__ = [
    "ConfigError",
    "config_dir",
    "available_configs",
    "default_config",
    "raw_default_config",
    "check_overrides",
    "suggest_keys",
    "load_config",
    "parse_cli",
    "main_entry",
    "omega_conf_to_dataclass",
]
