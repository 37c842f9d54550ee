"""A rollout worker's per-request endpoint on Ray: requests in flight are coroutines on the worker's
"rollout" event loop, not one thread each (a 1024-thread pool whose threads each kept about 80 KiB once
used was the soak's worker memory growth, docs/measurements.md), and an abort still reaches them all."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from hybridflow.agent_loop.server_manager import ROLLOUT_CONCURRENCY_GROUP, SERVER_HANDLE
from hybridflow.rollout.sampling import SamplingParams
from hybridflow.rollout.server import ABORT, STOP
from hybridflow.single_controller.base import ClassWithInitArgs
from hybridflow.single_controller.factory import build_worker_group
from tests.agent_loop.latency_rollout import LatencyRolloutWorker

ray = pytest.importorskip("ray")  # absent where `pytest -m gpu` runs (benchmarks/gpu_check.sh)

IN_FLIGHT = 64


def _thread_count(actor) -> int:
    return ray.get(actor.__ray_call__.remote(lambda self: threading.active_count()))


def test_requests_in_flight_take_no_thread_each(ray_session):
    group = build_worker_group(
        "ray",
        {"rollout": ClassWithInitArgs(LatencyRolloutWorker, slow_s=120.0)},
        [1],
        name="endpoint",
        concurrency_groups={ROLLOUT_CONCURRENCY_GROUP: 1024},
    )
    rollout = group.spawn(prefix_set=["rollout"])["rollout"]
    (server,) = group.handles(SERVER_HANDLE, "rollout")
    params = SamplingParams(response_length=4)

    async def burst():
        assert (await server.generate([1], params, "warm")).stop_reason == STOP  # the group's loop exists now
        before = _thread_count(server.actor)
        slow = [asyncio.ensure_future(server.generate([101], params, f"slow{i}")) for i in range(IN_FLIGHT)]
        deadline = time.monotonic() + 60
        while rollout.waiting() < IN_FLIGHT:
            assert time.monotonic() < deadline, f"only {rollout.waiting()} of {IN_FLIGHT} requests reached the server"
            await asyncio.sleep(0.1)
        during = _thread_count(server.actor)
        rollout.abort_rollout()
        return before, during, await asyncio.gather(*slow)

    try:
        before, during, outs = asyncio.run(burst())
        assert during - before < 8, f"{during - before} more threads with {IN_FLIGHT} requests in flight"
        assert [(o.stop_reason, o.token_ids) for o in outs] == [(ABORT, [102])] * IN_FLIGHT
    finally:
        rollout.close_engine()
        group.shutdown()
