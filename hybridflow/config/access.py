"""Reading a value from a config section that may be an object (dataclass, namespace) or a mapping
(dict, OmegaConf DictConfig). ``require``: workers and settings classes read validated sections and a
missing key is an error (the yaml holds the defaults). ``cfg_get``: for veRL-compatible functions
whose callers may pass partial configs (core algorithms)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

_MISSING = object()


def _lookup(config: Any, key: str) -> Any:
    return config.get(key, _MISSING) if isinstance(config, Mapping) else getattr(config, key, _MISSING)


def cfg_get(config: Any, key: str, default: Any = None, keep_none: bool = False) -> Any:
    """``config[key]`` / ``config.key`` if present (and not None, unless ``keep_none``), else ``default``."""
    value = _MISSING if config is None else _lookup(config, key)
    if value is _MISSING or (value is None and not keep_none):
        return default
    return value


def require(config: Any, key: str, section: str) -> Any:
    """``config[key]`` (or ``config.key``) of a validated section; a missing key is a KeyError naming
    ``section.key``. Library code reads values this way: the defaults live in the yaml only."""
    value = _lookup(config, key)
    if value is _MISSING:
        raise KeyError(
            f"{section}.{key} is missing: pass the whole validated {section} section "
            f"(hybridflow.config.loader.load_config / default_config)"
        )
    return value
