"""A worker group that was shut down says so: a call on it (or on any role view sharing its workers)
raises ``WorkerGroupShutDownError`` naming the group, the reason and the method, never an IndexError
from an empty worker list; cleanup after a failure skips such a group, so the first error is the one
the user sees (issue 32)."""

import logging
import time

import pytest
import workers_for_tests as W

from hybridflow.single_controller.base import (
    ClassWithInitArgs,
    Watchdog,
    WorkerError,
    WorkerGroupShutDownError,
    WorkerHangError,
    cleanup_after_failure,
    is_shut_down,
)
from hybridflow.single_controller.factory import build_worker_group


@pytest.fixture
def colocated(backend):
    """One worker (two roles, actor and critic) on ``backend``, and its role views; shut down after."""
    if backend == "ray":
        import ray

        ray.cloudpickle.register_pickle_by_value(W)
    roles = {"actor": ClassWithInitArgs(W.EchoWorker), "critic": ClassWithInitArgs(W.CriticLikeWorker)}
    group = build_worker_group(backend, roles, [1], name=f"shut_{time.time_ns()}")
    views = group.spawn(prefix_set=["actor", "critic"])
    yield group, views
    group.shutdown()


def test_a_call_on_a_shut_down_group_names_the_group_the_reason_and_the_method(colocated):
    group, views = colocated
    actor = views["actor"]
    assert actor.set_value(3) == [0] and not is_shut_down(actor) and not actor.is_shut_down
    actor.shutdown(reason="a test shut it down")
    # the view, its sibling and the group behind them share one set of workers: all are down
    assert actor.is_shut_down and views["critic"].is_shut_down and group.is_shut_down and is_shut_down(group)
    assert group.shutdown_reason == "a test shut it down"
    with pytest.raises(WorkerGroupShutDownError) as info:
        actor.set_value(4)
    assert str(info.value) == (
        f"worker group {actor.name!r} was shut down (a test shut it down) and cannot run 'actor_set_value'"
    )
    assert isinstance(info.value, WorkerError) and info.value.reason == "a test shut it down"
    with pytest.raises(WorkerGroupShutDownError, match="was shut down \\(a test shut it down\\)"):
        views["critic"].pid()
    with pytest.raises(WorkerGroupShutDownError, match="cannot run 'actor_pid'"):
        group.execute_all_sync("actor_pid")
    group.shutdown()  # again (the trainer's final shutdown): harmless, and the first reason stays
    assert group.shutdown_reason == "a test shut it down"


def test_the_watchdog_shuts_a_hung_group_down_and_later_calls_say_why(inprocess_group, tmp_path):
    group = inprocess_group(ClassWithInitArgs(W.EchoWorker), name_prefix="hung")
    group.set_watchdog(Watchdog(timeout_s=1.0, report_dir=str(tmp_path)))
    with pytest.raises(WorkerHangError) as hang:
        group.sleep(30)
    assert group.is_shut_down
    with pytest.raises(WorkerGroupShutDownError) as info:
        group.set_value(1)
    msg = str(info.value)
    assert msg.startswith("worker group 'hung' was shut down (the watchdog found 'sleep' hung; report: ")
    assert hang.value.report_path in msg and msg.endswith("and cannot run 'set_value'")


def test_cleanup_after_failure_skips_a_shut_down_group_and_never_raises(inprocess_group, caplog):
    group = inprocess_group(ClassWithInitArgs(W.EchoWorker), name_prefix="cleanup")
    cleanup_after_failure(group, "set_value", 7)  # a live group: the call runs
    assert group.workers[0].value == 7
    with caplog.at_level(logging.WARNING, logger="hybridflow.single_controller.base.cleanup"):
        cleanup_after_failure(group, "fail_on", 0)  # it raises: logged, not raised
    assert "cleanup fail_on() after an earlier failure failed too (ignored): WorkerError:" in caplog.text
    group.shutdown(reason="the watchdog found it hung")
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="hybridflow.single_controller.base.cleanup"):
        cleanup_after_failure(group, "set_value", 8)  # skipped: no call, nothing to log
        cleanup_after_failure(None, "set_value", 8)
    assert caplog.text == "" and group.workers[0].value == 7


class _Group:
    """A stand-in rollout group that records the calls it gets."""

    def __init__(self, shut_down: bool):
        self.is_shut_down = shut_down
        self.calls: list[str] = []

    def release_rollout(self):
        self.calls.append("release_rollout")
        raise AssertionError("a call on a shut-down group")

    def shutdown_rollout(self):
        self.calls.append("shutdown_rollout")

    def shutdown(self, reason="shutdown() was called"):
        self.calls.append("shutdown")


def _hang():
    return WorkerHangError("rollout", "generate_sequences", 1, "rank 1 FROZEN", [1], "/tmp/report.txt")


def test_generate_sequences_raises_the_hang_not_the_release_of_the_engines():
    from hybridflow.agent_loop.manager import AgentLoopManager
    from hybridflow.protocol import DataProto

    manager = object.__new__(AgentLoopManager)
    manager.hybrid_engine, manager.rollout_wg, manager.engine = True, _Group(shut_down=True), "hf"
    manager.rollout_wg.prepare_rollout = lambda version: [{}]
    hang = _hang()

    def run_workers(prompts):
        raise hang

    manager._run_workers = run_workers
    with pytest.raises(WorkerHangError) as info:
        manager.generate_sequences(DataProto(meta_info={}))
    assert info.value is hang and info.value.__context__ is None  # nothing raised while handling it
    assert manager.rollout_wg.calls == []  # the shut-down group was not called


def test_trainer_shutdown_skips_groups_that_are_down_and_a_second_call_does_nothing():
    from hybridflow.trainer.ppo.ray_trainer import RayPPOTrainer

    class Manager:
        closed = 0

        def shutdown(self):
            Manager.closed += 1

    trainer = object.__new__(RayPPOTrainer)
    down, live = _Group(shut_down=True), _Group(shut_down=False)
    trainer.rollout_source, trainer.judge, trainer.async_rollout_manager = None, None, Manager()
    trainer.rollout_wg, trainer._all_groups = down, {"actor_rollout": down, "rollout": down, "critic": live}
    trainer.shutdown_workers()
    assert down.calls == ["shutdown"]  # no shutdown_rollout on a group the watchdog shut down; its pool freed
    assert live.calls == ["shutdown"] and Manager.closed == 1
    trainer.shutdown_workers()  # run_ppo's call after fit's: nothing left to repeat
    assert down.calls == ["shutdown"] and live.calls == ["shutdown"] and Manager.closed == 1


def test_a_failed_weight_push_is_the_error_the_rollouter_raises():
    from hybridflow.trainer.ppo.rollouter import Rollouter

    class Manager:
        def __init__(self):
            self.calls = []

        def pause(self):
            self.calls.append("pause")

        def abort(self):
            self.calls.append("abort")

        def resume(self):
            self.calls.append("resume")
            raise WorkerGroupShutDownError("rollout", "resume", "the watchdog found 'send_weights' hung")

    manager = Manager()
    rollouter = Rollouter(manager, iter([]), 1, 0.0, 1, partial_rollout=True)
    hang = _hang()

    def push():
        raise hang

    with pytest.raises(WorkerHangError) as info:
        rollouter.sync_weights(push, version=1)
    assert info.value is hang and info.value.__context__ is None
    assert manager.calls == ["pause", "abort", "resume"]  # resumed (best effort), the push's hang raised
    assert rollouter.version == 1 and not rollouter._holding
