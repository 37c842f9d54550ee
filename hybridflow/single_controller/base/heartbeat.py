"""Progress heartbeats: how a long phase (generation, a long update) tells the driver's watchdog
that it is moving, so its deadline is extended instead of firing.

Worker side: ``report_progress()`` (or ``Worker.report_progress()``) anywhere inside a registered
method, e.g. once per finished request or micro-batch. It is cheap: at most one write per
``MIN_INTERVAL_S`` per process. Driver side: ``read_progress(group, world_size)`` returns a value that
changes whenever any rank reported; the watchdog compares successive readings.

Ray workers write to Ray's internal key-value store (in the GCS, so the driver reads it without
calling the busy actor, on any node); in-process workers write to a dict in the driver's process.
"""

from __future__ import annotations

import os
import time

NAMESPACE = "hybridflow_progress"
MIN_INTERVAL_S = 0.5

_local: dict[tuple[str, int], int] = {}  # (group, rank) -> count, for the in-process backend
_count = 0
_last_write = 0.0


def _key(group: str, rank: int) -> bytes:
    return f"{group}:{rank}".encode()


def in_ray_worker() -> bool:
    import sys

    if "ray" not in sys.modules:
        return False
    import ray

    return ray.is_initialized() and ray._private.worker.global_worker.mode == ray.WORKER_MODE


def report_progress(group: str | None = None, rank: int | None = None) -> None:
    """Tell the driver this process made progress. ``group``/``rank`` default to the ones the
    WorkerGroup put in the environment (``WG_PREFIX``, ``RANK``)."""
    global _count, _last_write
    group = group or os.environ.get("WG_PREFIX", "inprocess")
    rank = int(os.environ.get("RANK", 0)) if rank is None else rank
    _count += 1
    _local[(group, rank)] = _count
    now = time.monotonic()
    if now - _last_write < MIN_INTERVAL_S or not in_ray_worker():
        return
    _last_write = now
    from ray.experimental.internal_kv import _internal_kv_put

    try:
        _internal_kv_put(_key(group, rank), str(_count).encode(), overwrite=True, namespace=NAMESPACE)
    except Exception:  # a heartbeat must never fail the work it reports on
        pass


def read_progress(group: str, world_size: int, use_ray: bool) -> tuple:
    """One reading per rank (None: never reported). Compare two readings to see progress."""
    if not use_ray:
        return tuple(_local.get((group, r)) for r in range(world_size))
    from ray.experimental.internal_kv import _internal_kv_get

    out = []
    for r in range(world_size):
        try:
            out.append(_internal_kv_get(_key(group, r), namespace=NAMESPACE))
        except Exception:
            out.append(None)
    return tuple(out)


def clear_progress(group: str, world_size: int, use_ray: bool) -> None:
    for r in range(world_size):
        _local.pop((group, r), None)
    if use_ray:
        from ray.experimental.internal_kv import _internal_kv_del

        for r in range(world_size):
            try:
                _internal_kv_del(_key(group, r), namespace=NAMESPACE)
            except Exception:
                pass
