"""The one error type of configuration: a key that cannot be right (unknown, wrong type, a value out of
range or refused). It is a ValueError so that callers written against veRL's asserts/ValueErrors catch it;
``hybridflow.utils.config.ConfigError`` is the same class."""

from __future__ import annotations

__all__ = ["ConfigError"]


class ConfigError(ValueError):
    """A configuration that cannot be right: unknown key, wrong type, inconsistent values."""
