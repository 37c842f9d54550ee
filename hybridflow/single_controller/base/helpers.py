"""Helpers: a few driver-side objects of one class, hosted where the worker group's backend runs things.

The agent loop runs its workers (one asyncio task per trajectory) beside the driver: Ray actors with
the Ray backend, objects on an event loop thread of the driver in process. A ``HelperPool`` hides
which. The helper class's methods called through it are coroutine methods (a Ray actor with them is
an async actor; in process they run on the pool's own event loop).
"""

from __future__ import annotations

import concurrent.futures
from abc import ABC, abstractmethod
from typing import Any


class HelperPool(ABC):
    """``count`` helpers built with the same arguments; index ``i`` names one of them."""

    @abstractmethod
    def __len__(self) -> int: ...

    @abstractmethod
    def call(self, index: int, method: str, *args) -> Any:
        """Start ``method`` on helper ``index``; the handle is for ``wait_with_deadline``."""

    @abstractmethod
    def future(self, index: int, method: str, *args) -> concurrent.futures.Future:
        """Start ``method`` on helper ``index``; its answer as a concurrent Future."""

    def call_all(self, method: str, *args) -> list:
        return [self.call(i, method, *args) for i in range(len(self))]

    @abstractmethod
    def ask_all(self, method: str, timeout_s: float) -> list:
        """Every helper's answer to ``method`` within ``timeout_s``, else ``TimeoutError``."""

    @abstractmethod
    def close(self) -> None:
        """Stop the helpers (what they run is cancelled); idempotent."""


__all__ = ["HelperPool"]
