"""The backend factory and the questions every worker group answers (issue 23): direct handles,
driver-side helpers, start/stop of the backend. Here in process (cheap); the same calls run on Ray in
tests/agent_loop/test_agent_loop_worker.py::test_manager_on_each_backend and tests/trainer/test_backends_e2e.py."""

from __future__ import annotations

import asyncio
import os

import pytest

from hybridflow.single_controller.base import ClassWithInitArgs, Dispatch, Worker, register
from hybridflow.single_controller.base.direct import HandleKind
from hybridflow.single_controller.factory import build_worker_group, check_backend, pool_size_problem, start_backend

KIND = HandleKind(
    in_process=lambda worker, rank: ("here", worker, rank),
    remote=lambda actor, role, rank: ("there", actor, role, rank),
)


class RoleA(Worker):
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def name(self):
        return "a"


class RoleB(Worker):
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def name(self):
        return "b"


class Counter:
    """A helper: coroutine methods only."""

    def __init__(self, start: int):
        self.value = start

    async def bump(self, by: int) -> int:
        self.value += by
        return self.value

    async def hang(self) -> None:
        await asyncio.sleep(3600)


def test_unknown_backends_and_pools_too_big_for_the_driver_are_refused():
    with pytest.raises(ValueError, match="'ray' or 'inprocess', got 'slurm'"):
        check_backend("slurm")
    assert pool_size_problem("ray", 8) is None and pool_size_problem("inprocess", 1) is None
    assert "trainer.backend=ray" in pool_size_problem("inprocess", 2)
    with pytest.raises(ValueError, match=r"resource pool 'trainer' asks for 2 workers \(1\+1 per node\)"):
        build_worker_group("inprocess", ClassWithInitArgs(RoleA), [1, 1], name="trainer")


def test_inprocess_start_sets_the_workers_environment_here_and_stop_puts_it_back(monkeypatch):
    monkeypatch.delenv("HYBRIDFLOW_FACTORY_TEST", raising=False)
    stop = start_backend("inprocess", worker_env={"HYBRIDFLOW_FACTORY_TEST": "cpu"})
    assert os.environ["HYBRIDFLOW_FACTORY_TEST"] == "cpu"  # the in-process workers read it from this process
    stop()
    assert "HYBRIDFLOW_FACTORY_TEST" not in os.environ


def test_handles_reach_the_role_inside_a_colocated_worker():
    group = build_worker_group("inprocess", {"a": ClassWithInitArgs(RoleA), "b": ClassWithInitArgs(RoleB)}, [1])
    try:
        views = group.spawn(["a", "b"])
        assert views["b"].name() == ["b"]
        ((where, worker, rank),) = views["b"].handles(KIND, role="b")
        assert (where, rank, worker.name()) == ("here", 0, "b")  # the role's own object, not the colocated one
        ((_, whole, _),) = group.handles(KIND)
        assert whole is group.workers[0]
    finally:
        group.shutdown()


def test_inprocess_helpers_run_coroutines_off_the_callers_thread_and_close():
    group = build_worker_group("inprocess", ClassWithInitArgs(RoleA), [1])
    helpers = group.spawn_helpers(Counter, 2, 10)
    try:
        assert len(helpers) == 2
        assert helpers.future(0, "bump", 5).result(timeout=10) == 15
        assert helpers.call(1, "bump", 1).result(timeout=10) == 11
        assert [f.result(timeout=10) for f in helpers.call_all("bump", 1)] == [16, 12]
        stuck = helpers.future(0, "hang")
        with pytest.raises(TimeoutError, match="'hang'"):
            helpers.ask_all("hang", timeout_s=0.2)
    finally:
        helpers.close()
        group.shutdown()
    assert stuck.cancelled()  # closing cancels what the helpers still run
