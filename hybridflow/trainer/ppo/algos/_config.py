"""Reading a value from a config section that may be an object (dataclass, namespace) or a mapping
(dict, OmegaConf DictConfig). The one place where core_algos looks inside a config."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def cfg_get(config: Any, key: str, default: Any = None) -> Any:
    """``config[key]`` / ``config.key`` if present and not None, else ``default``."""
    if config is None:
        return default
    if isinstance(config, Mapping):
        value = config.get(key, None)
    else:
        value = getattr(config, key, None)
    return default if value is None else value
