"""The Rollouter against a hand-driven manager: veRL's start budget, the lag bound, prompt order,
weight syncs with and without partial rollouts, errors and the groups a checkpoint must keep."""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future

import numpy as np
import pytest
import torch

from hybridflow.protocol import DataProto
from hybridflow.trainer.ppo.rollouter import PromptGroup, Rollouter, staleness_bound

N = 2  # samples per prompt


class HandManager:
    """Records every submitted group; the test finishes them (in any order) with ``finish``."""

    def __init__(self):
        self.submitted: list[tuple[int, Future]] = []  # (gen position, future)
        self.calls: list[str] = []
        self.lock = threading.Lock()

    def submit(self, request: DataProto) -> Future:
        future = Future()
        with self.lock:
            self.submitted.append((int(request.non_tensor_batch["pos"][0]), future))
        return future

    def finish(self, pos: int, version: int = 0) -> None:
        future = dict(self.submitted)[pos]
        out = DataProto.from_dict(
            tensors={"responses": torch.full((N, 1), pos)},
            non_tensors={"min_weight_version": np.array([version] * N, dtype=object)},
        )
        future.set_result(out)

    def pause(self):
        self.calls.append("pause")

    def abort(self):
        self.calls.append("abort")

    def resume(self):
        self.calls.append("resume")


def groups(count: int = 100):
    for pos in range(count):
        batch_size = 2
        prompts = DataProto.from_dict(
            tensors={
                "input_ids": torch.zeros((N, 1), dtype=torch.long),
                "attention_mask": torch.ones((N, 1), dtype=torch.long),
                "position_ids": torch.zeros((N, 1), dtype=torch.long),
            },
            non_tensors={"pos": np.array([pos] * N, dtype=object)},
        )
        yield PromptGroup(gen_index=pos // batch_size + 1, position=pos % batch_size, epoch=0, prompts=prompts)


def started(manager: HandManager, expected: int, settle_s: float = 0.15) -> int:
    """Wait until ``expected`` groups were submitted, then a little longer to see that no more come."""
    deadline = time.time() + 10
    while len(manager.submitted) < expected and time.time() < deadline:
        time.sleep(0.01)
    time.sleep(settle_s)
    return len(manager.submitted)


def make(manager, staleness, trigger=1, partial=False, prompts_per_step=2, count=100):
    r = Rollouter(manager, groups(count), prompts_per_step, staleness, trigger, partial)
    r.start()
    return r


@pytest.mark.parametrize("staleness,trigger,budget", [(0, 1, 2), (1, 1, 4), (0.5, 2, 6), (0.25, 1, 2)])
def test_start_budget_is_verl_rule(staleness, trigger, budget):
    # budget = floor((1 + s) * prompts_per_step * trigger): 1*2*1, 2*2*1, 1.5*2*2, floor(1.25*2*1)
    m = HandManager()
    r = make(m, staleness, trigger)
    try:
        assert started(m, budget) == budget
    finally:
        r.stop()


def test_staleness_bound_by_hand():
    # max lag = trigger - 1 + ceil(s * trigger)
    assert staleness_bound(0, 1) == 0  # the synchronous schedule
    assert staleness_bound(1, 1) == 1  # one-step-off
    assert staleness_bound(0.5, 1) == 1
    assert staleness_bound(2, 1) == 2
    assert staleness_bound(0, 3) == 2  # weights every third step: the last step of a period lags 2
    assert staleness_bound(0.5, 2) == 2


def test_sync_resets_the_period_counting_groups_not_yet_trained():
    m = HandManager()
    r = make(m, staleness=1, partial=True)  # budget 4; partial: the sync does not wait for groups 2, 3
    try:
        assert started(m, 4) == 4
        m.finish(1), m.finish(0)
        taken, metrics = r.take(2, timeout_s=5)
        assert [t.group.gen_index * 10 + t.group.position for t in taken] == [10, 11]  # prompt order
        assert started(m, 4) == 4  # taking frees nothing: only a sync opens a new period
        pushed = []
        r.sync_weights(lambda: pushed.append(r.version) or {"x": 1.0}, version=1)
        assert pushed == [0] and r.version == 1
        # groups 2, 3 still count against the new period: 4 - 2 = 2 more may start
        assert started(m, 6) == 6
        assert [p for p, _ in m.submitted] == list(range(6))
        assert [g.position + 2 * (g.gen_index - 1) for g in r.pending()] == [2, 3, 4, 5]
    finally:
        r.stop()


def test_take_waits_for_a_group_that_would_exceed_the_lag_bound():
    """s=1 (max lag 1): groups 2, 3 started with version 0; after the sync groups 4, 5 (version 1) finish
    first. At actor version 1 the trainer must take 2, 3 (lag 1), not 4, 5, which would leave 2, 3 to be
    trained at version 2 (lag 2)."""
    m = HandManager()
    r = make(m, staleness=1, partial=True)
    try:
        started(m, 4)
        m.finish(0), m.finish(1)
        r.take(2, timeout_s=5, actor_version=0)
        r.sync_weights(lambda: {}, version=1)
        started(m, 6)
        m.finish(4, version=1), m.finish(5, version=1)
        result = {}
        waiter = threading.Thread(target=lambda: result.update(taken=r.take(2, timeout_s=10, actor_version=1)[0]))
        waiter.start()
        time.sleep(0.3)
        assert waiter.is_alive()  # two groups are ready, but the due ones are still generating
        m.finish(3), m.finish(2)
        waiter.join(10)
        assert [t.group.position + 2 * (t.group.gen_index - 1) for t in result["taken"]] == [2, 3]
        assert [t.started_at_version for t in result["taken"]] == [0, 0]
        # without the trainer's version the first ready groups are handed out (what a bare take does)
        taken, _ = r.take(2, timeout_s=5)
        assert [t.started_at_version for t in taken] == [1, 1]
    finally:
        r.stop()


def test_sync_without_partial_rollouts_waits_for_the_groups_in_flight():
    m = HandManager()
    r = make(m, staleness=0)
    try:
        started(m, 2)
        pushed = threading.Event()
        syncer = threading.Thread(target=lambda: r.sync_weights(lambda: pushed.set() or {}, version=1))
        syncer.start()
        time.sleep(0.2)
        assert not pushed.is_set()  # groups 0, 1 still generate with the old weights
        m.finish(0), m.finish(1)
        syncer.join(5)
        assert pushed.is_set() and m.calls == []
    finally:
        r.stop()


def test_sync_with_partial_rollouts_pauses_aborts_and_resumes():
    m = HandManager()
    r = make(m, staleness=0, partial=True)
    try:
        started(m, 2)
        order = []
        m.pause = lambda: order.append("pause")
        m.abort = lambda: order.append("abort")
        m.resume = lambda: order.append("resume")
        metrics = r.sync_weights(lambda: order.append("push") or {}, version=1)
        assert order == ["pause", "abort", "push", "resume"]  # no waiting for the groups in flight
        assert metrics["timing_s/sync_weights_total"] >= metrics["timing_s/rollout_hold"] >= 0
    finally:
        r.stop()


def test_a_failed_group_surfaces_in_take():
    m = HandManager()
    r = make(m, staleness=0)
    try:
        started(m, 2)
        dict(m.submitted)[0].set_exception(ValueError("engine died"))
        with pytest.raises(RuntimeError, match="asynchronous rollout failed") as info:
            r.take(2, timeout_s=5)
        assert isinstance(info.value.__cause__, ValueError)
    finally:
        r.stop()


def test_a_resumed_runs_pending_groups_start_first():
    m = HandManager()
    r = Rollouter(
        m, groups(3), prompts_per_step=2, staleness_threshold=1, trigger_parameter_sync_step=1, partial_rollout=False
    )
    restart = next(groups(1))
    restart.gen_index, restart.position = 0, 0
    r.start(pending=[restart])  # a resumed run's pending group starts before new ones
    try:
        assert started(m, 4) == 4
        assert [p for p, _ in m.submitted] == [0, 0, 1, 2]
        with pytest.raises(TimeoutError, match="produced 0 of 2 groups"):
            r.take(2, timeout_s=0.2)
    finally:
        r.stop()


def test_the_trainers_wait_ends_at_the_watchdog_deadline_and_groups_that_finish_push_it_back(tmp_path):
    """take() without a timeout waits under the watchdog: a finished group is progress, none for the
    idle deadline raises WorkerHangError (with its report) in the waiting thread."""
    from hybridflow.single_controller.base import Watchdog, WorkerHangError

    m = HandManager()
    r = Rollouter(
        m,
        groups(100),
        prompts_per_step=2,
        staleness_threshold=1,
        trigger_parameter_sync_step=1,
        partial_rollout=False,
        watchdog=Watchdog(timeout_s=1.0, report_dir=str(tmp_path), poll_s=0.1),
    )
    r.start()
    try:
        assert started(m, 4) == 4
        # one group finishes every 0.6 s: each is progress, so 2 groups in ~1.2 s pass a 1 s idle deadline
        finisher = threading.Thread(target=lambda: [time.sleep(0.6) or m.finish(pos) for pos in (0, 1)])
        finisher.start()
        taken, _ = r.take(2)
        finisher.join()
        assert len(taken) == 2
        start = time.monotonic()
        with pytest.raises(WorkerHangError, match="waiting for 2 finished rollout groups"):
            r.take(2)  # groups 2, 3 never finish
        assert 1.0 <= time.monotonic() - start < 10
    finally:
        r.stop()
