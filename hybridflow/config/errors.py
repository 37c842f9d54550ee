"""The one error type of configuration: a key that cannot be right (unknown, wrong type, a value out of
range or refused). It is a ValueError so that callers written against veRL's asserts/ValueErrors catch it;
``hybridflow.utils.config.ConfigError`` is the same class."""

from __future__ import annotations

__all__ = ["ConfigError", "check_one_of", "check_at_least"]


class ConfigError(ValueError):
    """A configuration that cannot be right: unknown key, wrong type, inconsistent values."""


def check_one_of(key: str, value: object, choices: tuple) -> None:
    """ConfigError naming ``key`` and the choices when ``value`` is not one of them."""
    if value not in choices:
        raise ConfigError(f"{key}={value!r} is not one of {', '.join(choices)}")


def check_at_least(path: str, section: object, keys: tuple[str, ...], low: int, nullable: bool = False) -> None:
    """ConfigError naming ``path.key`` for the first of ``keys`` below ``low`` (None passes when ``nullable``)."""
    for key in keys:
        value = getattr(section, key)
        if not (nullable and value is None) and value < low:
            raise ConfigError(f"{path}.{key} must be >= {low}{' or null' if nullable else ''}, got {value}")
