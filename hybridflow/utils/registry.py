"""One small registry type for everything users extend (advantage estimators, policy losses,
reward scorers, rollout engines, ...).

An unknown name lists the known ones; registering a name twice is an error (pass ``override=True``
to replace on purpose).
"""

from __future__ import annotations

from typing import Callable, Generic, Iterator, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    def __init__(self, kind: str):
        self.kind = kind
        self._entries: dict[str, T] = {}

    def register(self, name: str, obj: T | None = None, *, override: bool = False):
        """Register ``obj`` under ``name``; without ``obj`` returns a decorator."""

        def add(item: T) -> T:
            if name in self._entries and not override:
                raise ValueError(f"{self.kind} {name!r} is already registered; pass override=True to replace it")
            self._entries[name] = item
            return item

        return add(obj) if obj is not None else add

    def get(self, name: str) -> T:
        try:
            return self._entries[name]
        except KeyError:
            known = ", ".join(sorted(self._entries)) or "(none)"
            raise KeyError(f"unknown {self.kind} {name!r}; known: {known}") from None

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._entries))

    def names(self) -> list[str]:
        return sorted(self._entries)
