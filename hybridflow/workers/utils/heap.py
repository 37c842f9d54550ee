"""Hand glibc's freed heap back to the OS between phases of a worker's step."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import sys


@functools.cache
def _libc():
    return ctypes.CDLL(ctypes.util.find_library("c")) if sys.platform.startswith("linux") else None


def trim_heap() -> bool:
    """``malloc_trim(0)``: a step frees hundreds of MiB of activations and gradients, and glibc keeps the
    freed pages of its many arenas (Ray's, torch's, the rollout loop's threads) mapped, so a worker's RSS
    creeps up over its first steps. Linux (glibc) only; returns whether memory was released."""
    libc = _libc()
    return bool(getattr(libc, "malloc_trim", lambda _pad: 0)(0)) if libc is not None else False
