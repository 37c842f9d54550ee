"""One small registry type for everything users extend (advantage estimators, policy losses,
reward scorers, reward managers, rollout engines, ...).

A ``Registry`` is a mutable mapping from name to object, so code written against veRL's module-level
dicts (``ADV_ESTIMATOR_REGISTRY``, ``POLICY_LOSS_REGISTRY``, ``REWARD_MANAGER_REGISTRY``) keeps
working: ``len``, ``keys``, ``items``, ``[]``, ``in``, ``clear``, ``pop``, ``del``. What it adds:

- registering through ``register`` (the decorators) the same object again under its name is a no-op
  (a module imported twice, a decorator run again); a *different* object under a taken name is an
  error ("... has already been registered", veRL's words), unless ``override=True`` asks to replace it
  on purpose. ``REGISTRY[name] = obj`` replaces, as a dict assignment does;
- an unknown name (``REGISTRY[name]``) raises ``UnknownNameError`` (a ``KeyError`` and a ``ValueError``,
  so both veRL's ``ValueError`` and dict-style ``KeyError`` handlers catch it) listing the known names;
  ``unknown=`` gives the message's start where veRL's lookup function words it its own way.

``registry.get(name)`` returns None for an unknown name and ``registry.get(name, default)`` the default,
as ``dict.get`` does; library lookups use ``registry[name]``.
"""

from __future__ import annotations

from collections.abc import Iterator, MutableMapping
from typing import Generic, TypeVar

T = TypeVar("T")

_MISSING = object()


class UnknownNameError(KeyError, ValueError):
    """A name that is not registered; the message lists the known ones."""

    def __str__(self) -> str:  # KeyError would show the message in quotes
        return str(self.args[0]) if self.args else ""


class Registry(MutableMapping, Generic[T]):
    def __init__(self, kind: str, unknown: str | None = None):
        self.kind = kind
        self._unknown_text = unknown or f"unknown {kind} {{name!r}}"
        self._entries: dict[str, T] = {}

    # --- registration -----------------------------------------------------------------------------
    def register(self, name: str, obj: T | None = None, *, override: bool = False):
        """Register ``obj`` under ``name``; without ``obj`` returns a decorator."""

        def add(item: T) -> T:
            current = self._entries.get(name, _MISSING)
            if current is not _MISSING and not override and not _same(current, item):
                raise ValueError(
                    f"{self.kind} {name} has already been registered: {_describe(current)} vs {_describe(item)}. "
                    "Pick another name or pass override=True to replace it."
                )
            self._entries[name] = item
            return item

        return add(obj) if obj is not None else add

    def __setitem__(self, name: str, obj: T) -> None:
        """``REGISTRY[name] = fn`` replaces, as assigning into veRL's dicts does."""
        self.register(name, obj, override=True)

    def __delitem__(self, name: str) -> None:
        try:
            del self._entries[name]
        except KeyError:
            raise self._unknown(name) from None

    # --- lookup -----------------------------------------------------------------------------------
    def __getitem__(self, name: str) -> T:
        try:
            return self._entries[name]
        except (KeyError, TypeError):
            raise self._unknown(name) from None

    def get(self, name: str, default=None):
        """``dict.get``: the object under ``name``, or ``default``."""
        try:
            return self._entries.get(name, default)
        except TypeError:  # unhashable
            return default

    def _unknown(self, name) -> UnknownNameError:
        known = ", ".join(sorted(self._entries)) or "(none)"
        return UnknownNameError(f"{self._unknown_text.format(name=name)}; known: {known}")

    def __contains__(self, name: object) -> bool:
        try:
            return name in self._entries
        except TypeError:  # unhashable
            return False

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)  # registration order, as the dict veRL exposes

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        self._entries.clear()

    def names(self) -> list[str]:
        return sorted(self._entries)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, {self.names()})"


def _same(a, b) -> bool:
    if a is b:
        return True
    try:
        return bool(a == b)
    except Exception:  # an `==` without a truth value (arrays, tensors)
        return False


def _describe(obj) -> str:
    module = getattr(obj, "__module__", None)
    name = getattr(obj, "__qualname__", None) or type(obj).__name__
    return f"{module}.{name}" if module else str(name)
