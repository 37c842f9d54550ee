"""Direct handles: reaching one rank's worker outside the group's dispatch and collect.

Some callers talk to single ranks many times per step (an agent loop sends each request to one
rollout server; a trainer streams weight buckets to each rollout worker). They describe the handle
they want as a ``HandleKind``: one constructor per place a worker can live. The worker group picks
the constructor that fits its workers (``WorkerGroup.handles(kind, role)``), so the caller never asks
which backend it has.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class HandleKind:
    """``in_process(worker, rank)``: the worker object (the role's object inside a colocated worker)
    lives in this process. ``remote(actor, role, rank)``: the worker is a Ray actor; ``role`` names the
    role inside a colocated worker (reached through its ``call_role``), None for a plain one."""

    in_process: Callable[[Any, int], Any]
    remote: Callable[[Any, str | None, int], Any]


__all__ = ["HandleKind"]
