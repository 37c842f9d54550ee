"""Handing the heap's free pages back to the OS after a training step (glibc's ``malloc_trim``).

A CPU worker allocates and frees large tensors every step (KV caches, activations, gradients, weight
buckets) from many threads (Ray's, gloo's, the rollout executor's), each with its own glibc arena. Freed
memory in the middle of an arena is not returned to the OS, so the process's RSS creeps up step after
step although nothing is retained (the soak measured 60-85 MiB per 100 steps per Ray worker). Trimming
once per step releases those pages; it costs milliseconds and changes no computation.
"""

from __future__ import annotations

import ctypes
import functools
import sys


@functools.cache
def _malloc_trim():
    if not sys.platform.startswith("linux"):
        return None
    return getattr(ctypes.CDLL(None), "malloc_trim", None)  # absent outside glibc (musl)


def trim_heap() -> bool:
    """Return free heap pages of every arena to the OS; True when some were released."""
    trim = _malloc_trim()
    return bool(trim(0)) if trim is not None else False
