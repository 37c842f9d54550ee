"""PYTHONPATH for a test's child process: the given folders first, then the caller's own entries (a GPU
machine's carried wheels live there, benchmarks/gpu_check.sh), so the child imports what the test imports."""

from __future__ import annotations

import os


def pythonpath_with(*front: str) -> str:
    return os.pathsep.join(p for p in (*front, os.environ.get("PYTHONPATH", "")) if p)
