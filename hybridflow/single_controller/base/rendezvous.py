"""How the ranks of a Ray worker group meet for torch.distributed without a port race.

A port picked free and bound later can be taken in between by any other process (CI failed so once,
EADDRINUSE). So rank 0 binds its store at once on a port the kernel gives (``port=0``), as soon as its
worker starts, and publishes that port in Ray's key-value store under the group's rendezvous id
(``HYBRIDFLOW_RENDEZVOUS_ID``, fresh per group); the other ranks read it there when they join. Rank 0
removes the entry once its group is up (every rank has connected by then).

A process holds at most one such store: roles fused into one worker process share it.
"""

from __future__ import annotations

import os
import time
from datetime import timedelta

__all__ = ["ID_ENV", "NAMESPACE", "publishing", "open_rank0_store", "join_store", "forget"]

ID_ENV = "HYBRIDFLOW_RENDEZVOUS_ID"
NAMESPACE = "hybridflow_rendezvous"
_POLL_S = 0.05

_store = None  # rank 0's store in this process, until its group is up


def publishing() -> str | None:
    """The group's rendezvous id when this process meets its peers through Ray (None: a fixed MASTER_PORT)."""
    return os.environ.get(ID_ENV) or None


def open_rank0_store(host: str, world_size: int) -> int:
    """Rank 0: bind the store (once per process), publish its port, return it."""
    global _store
    if _store is None:
        import torch.distributed as dist
        from ray.experimental.internal_kv import _internal_kv_put

        _store = dist.TCPStore(host, 0, world_size, True, timeout=timedelta(seconds=600), wait_for_workers=False)
        _internal_kv_put(publishing().encode(), str(_store.port).encode(), overwrite=True, namespace=NAMESPACE)
    return int(_store.port)


def join_store(rank: int, world_size: int, host: str, timeout_s: float):
    """The store this rank's process group uses: rank 0's own, or a client of it once its port is known
    (waiting up to ``timeout_s`` for rank 0 to publish it). Sets MASTER_PORT to that port."""
    import torch.distributed as dist

    timeout = timedelta(seconds=timeout_s)
    if rank == 0:
        port = open_rank0_store(host, world_size)
        _store.set_timeout(timeout)
        os.environ["MASTER_PORT"] = str(port)
        return _store
    port = _published_port(timeout_s)
    os.environ["MASTER_PORT"] = str(port)
    return dist.TCPStore(host, port, world_size, False, timeout=timeout)


def _published_port(timeout_s: float) -> int:
    from ray.experimental.internal_kv import _internal_kv_get

    key, deadline = publishing(), time.monotonic() + timeout_s
    while True:
        value = _internal_kv_get(key.encode(), namespace=NAMESPACE)
        if value:
            return int(value)
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"rank 0 of worker group {os.environ.get('WG_PREFIX', '?')} did not publish its torch.distributed "
                f"store within {timeout_s:.0f} s (rendezvous id {key})"
            )
        time.sleep(_POLL_S)


def forget() -> None:
    """Rank 0, once its group is up: drop the published port and this process's reference to the store
    (the process group keeps the store alive)."""
    global _store
    _store = None
    key = publishing()
    if key:
        from ray.experimental.internal_kv import _internal_kv_del

        try:
            _internal_kv_del(key.encode(), namespace=NAMESPACE)
        except Exception:  # the entry is tiny; a failure to drop it must not fail the group
            pass
