"""Reading a value from a config section that may be an object (dataclass, namespace) or a mapping
(dict, OmegaConf DictConfig): the one helper pure functions and workers use to look inside config."""

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
