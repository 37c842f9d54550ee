"""The status of a config key, declared with the key (``doc(..., refused="why")``).

Statuses (what ``hybridflow.config.support.check_support`` does with them when a config is loaded):

- honoured (the default of every declared key): hybridflow reads the key and does what veRL does.
  ``values=(...)`` narrows it to the values hybridflow implements; others are refused.
- not supported (``refused="why"``): accepted at its default, refused by name with the reason when set.
- accepted with note (``note="why"``): a speed/memory setting of hardware or engines hybridflow does
  not use; a non-default value prints a note.

``KeyStatus`` values (built with ``honoured``, ``refused``, ``noted``) are what ``keys=`` dicts of
``doc``/``section`` hold: per-place statuses of keys below a place, and patterns for keys users add
with ``+`` (see ``hybridflow.config.keys``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

__all__ = ["HONOURED", "NOT_SUPPORTED", "NOTE", "KeyStatus", "OrYours", "honoured", "refused", "noted", "status_from"]

HONOURED = "honoured"
NOT_SUPPORTED = "not supported"
NOTE = "accepted with note"


@dataclass(frozen=True)
class KeyStatus:
    """``status`` with its ``reason`` (shown in messages and docs/config_keys.md) and, for an honoured
    key, the only ``values`` hybridflow implements."""

    status: str = HONOURED
    reason: str = ""
    values: tuple | None = None

    def __post_init__(self):
        if self.status not in (HONOURED, NOT_SUPPORTED, NOTE):
            raise ValueError(f"status must be one of {HONOURED!r}, {NOT_SUPPORTED!r}, {NOTE!r}, not {self.status!r}")
        if self.status != HONOURED and self.values is not None:
            raise ValueError("only an honoured key takes a list of supported values")
        if self.status != HONOURED and not self.reason:
            raise ValueError(f"a {self.status!r} key must say why (reason)")


class OrYours(tuple):
    """Supported values that users extend: the listed ones (shown in docs and messages), or any value
    ``also(value)`` accepts (a name a registry holds, a class path checked when the run starts)."""

    def __new__(cls, values: Iterable, also: Callable[[Any], bool]):
        made = super().__new__(cls, values)
        made.also = also
        return made

    def __contains__(self, value) -> bool:
        return tuple.__contains__(self, value) or bool(self.also(value))

    def __reduce__(self):  # a tuple subclass with an attribute: pickled with it
        return (OrYours, (tuple(self), self.also))


def honoured(reason: str = "", values: Iterable | None = None) -> KeyStatus:
    return KeyStatus(HONOURED, reason, values if isinstance(values, tuple) or values is None else tuple(values))


def refused(reason: str) -> KeyStatus:
    return KeyStatus(NOT_SUPPORTED, reason)


def noted(reason: str) -> KeyStatus:
    return KeyStatus(NOTE, reason)


def status_from(
    refused: str | None = None, note: str | None = None, values: Iterable | None = None, reason: str = ""
) -> KeyStatus | None:
    """The status ``doc``/``section`` keyword arguments declare (None: none declared)."""
    if refused is not None and note is not None:
        raise ValueError("a key is either refused or noted, not both")
    if refused is not None or note is not None:
        if values is not None or reason:
            raise ValueError("values= and reason= belong to an honoured key (refused/note carry their own reason)")
        return KeyStatus(NOT_SUPPORTED, refused) if refused is not None else KeyStatus(NOTE, note)
    if values is not None or reason:
        return honoured(reason, values)
    return None
