"""Reading a value from a config section that may be an object (dataclass, namespace) or a mapping
(dict, OmegaConf DictConfig). ``require``: workers and settings classes read validated sections and a
missing key is an error (the yaml holds the defaults). ``cfg_get``: for veRL-compatible functions
whose callers may pass partial configs (core algorithms)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

_MISSING = object()


def cfg_get(config: Any, key: str, default: Any = None, keep_none: bool = False) -> Any:
    """``config[key]`` / ``config.key`` if present (and not None, unless ``keep_none``), else ``default``."""
    if config is None:
        return default
    if isinstance(config, Mapping):
        value = config.get(key, _MISSING)
    else:
        value = getattr(config, key, _MISSING)
    if value is _MISSING or (value is None and not keep_none):
        return default
    return value


def require(config: Any, key: str, section: str) -> Any:
    """``config[key]`` (or ``config.key``) of a validated section; a missing key is a KeyError naming
    ``section.key``. Library code reads values this way: the defaults live in the yaml only."""
    if isinstance(config, Mapping):
        value = config.get(key, _MISSING)
    else:
        value = getattr(config, key, _MISSING)
    if value is _MISSING:
        raise KeyError(
            f"{section}.{key} is missing: pass the whole validated {section} section "
            f"(hybridflow.config.loader.load_config / default_config)"
        )
    return value
