"""trim_heap hands freed heap memory back to the OS (what keeps a long run's worker RSS flat)."""

import sys

import psutil
import pytest

from hybridflow.workers.utils.heap_trim import trim_heap


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim")
def test_trim_heap_returns_freed_chunks_below_the_heap_top():
    chunks = [bytearray(64 * 1024) for _ in range(3000)]  # ~190 MiB of heap chunks (below the mmap threshold)
    pin = bytearray(64 * 1024)  # allocated after them: free() alone cannot shrink the heap past it
    del chunks
    before = psutil.Process().memory_info().rss
    assert trim_heap()
    assert before - psutil.Process().memory_info().rss > 100 * 2**20
    del pin
