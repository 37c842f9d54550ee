"""trainer.v1.sampler against a hand-driven manager: the span counted by hand, drop evicts and refills one
prompt per evicted group, wait blocks on a group at the threshold, the bound holds over many steps with
groups finishing in random order, failed groups are replaced, a custom sampler is loaded from a file."""

from __future__ import annotations

import random
import time

import numpy as np
import pytest
import torch

from hybridflow.config.module import ModuleConfig
from hybridflow.config.trainer import ReplaySamplerConfig
from hybridflow.protocol import DataProto
from hybridflow.trainer.ppo.off_policy import OffPolicySampler, build_sampler, trajectory_version_metrics
from hybridflow.trainer.ppo.rollouter import Rollouter
from tests.trainer.ppo.test_rollouter import HandManager, groups, started


def make(manager, sampler, staleness=0.0, trigger=1, refill_failed=False):
    r = Rollouter(manager, groups(), 2, staleness, trigger, True, sampler=sampler, refill_failed=refill_failed)
    r.start()
    return r


def positions(taken) -> list[int]:
    return [t.group.position + 2 * (t.group.gen_index - 1) for t in taken]


def test_span_counts_weight_syncs_both_ends_included():
    # separate_async with parameter_sync_step=4: versions 0..3 are sync 0, 4..7 sync 1, ...
    s = OffPolicySampler(2, "drop", versions_per_cycle=4)
    assert s.span(0, 3) == 1  # started and trained within one cycle
    assert s.span(0, 4) == 2 and s.span(3, 7) == 2
    assert s.span(0, 8) == 3 and s.stale(0, 8) and not s.stale(0, 7)
    w = OffPolicySampler(2, "wait")
    assert w.blocks(0, 1) and not w.blocks(1, 1) and not w.stale(0, 5)  # wait never evicts
    assert not OffPolicySampler(None, "drop").stale(0, 100)  # null: no bound


def test_drop_evicts_the_stale_group_and_starts_one_new_prompt_for_it():
    m = HandManager()
    r = make(m, OffPolicySampler(1, "drop"))  # budget 2 a period; a group may span one version
    try:
        assert started(m, 2) == 2
        m.finish(0)
        assert positions(r.take(1, timeout_s=5, actor_version=0)[0]) == [0]
        r.sync_weights(dict, version=1)  # group 1 (version 0) still generating: 1 more may start
        assert started(m, 3) == 3
        m.finish(1), m.finish(2)
        taken, metrics = r.take(1, timeout_s=5, actor_version=1)
        assert positions(taken) == [2]  # group 1 spans versions 0..1 (2 > 1): evicted, not trained
        assert metrics["training/off_policy/evicted_samples"] == 1
        assert metrics["training/off_policy/evicted_samples_staleness/max"] == 2
        assert started(m, 4) == 4  # exactly one replacement prompt
        assert r.finished() == [] and [g.position + 2 * (g.gen_index - 1) for g in r.pending()] == [3]
    finally:
        r.stop()


def test_wait_blocks_while_a_group_at_the_threshold_is_generating():
    m = HandManager()
    r = make(m, OffPolicySampler(2, "wait"), staleness=1)  # budget 4
    try:
        assert started(m, 4) == 4
        for pos in (1, 2, 3):
            m.finish(pos)
        assert len(r.take(1, timeout_s=5, actor_version=0)[0]) == 1  # span 1 < 2: no wait
        r.sync_weights(dict, version=1)
        with pytest.raises(TimeoutError):  # group 0 (version 0) would span 2 versions: the trainer waits
            r.take(1, timeout_s=0.3, actor_version=1)
        m.finish(0)
        taken, metrics = r.take(2, timeout_s=5, actor_version=1)
        assert 0 in positions(taken) and metrics["training/off_policy/evicted_samples"] == 0  # trained, not dropped
    finally:
        r.stop()


@pytest.mark.parametrize("strategy,threshold", [("drop", 2), ("wait", 3)])
def test_the_off_policy_bound_holds_over_many_steps(strategy, threshold):
    """Groups finish in a random order, some only many steps later; every trained group spans at most
    the threshold (separate_async's units: parameter_sync_step=2 updates a version). ``wait`` never
    evicts, so it holds the bound when the threshold covers the batches generated ahead (1 + 2 here:
    a group is among the 3 batches outstanding when it starts); below that, finished groups wait their
    turn past it (a note at start-up says so)."""
    rng, trigger = random.Random(0), 2
    m = HandManager()
    r = make(m, OffPolicySampler(threshold, strategy, versions_per_cycle=trigger), staleness=2, trigger=trigger)
    spans, evicted = [], 0
    try:
        for version in range(24):
            for _ in range(1000):
                running = [pos for pos, f in m.submitted if not f.done()]
                for pos in rng.sample(running, k=min(len(running), 1 + len(running) // 3)):  # others stay in flight
                    m.finish(pos, version=r.version)
                try:
                    taken, metrics = r.take(2, timeout_s=0.05, actor_version=version)
                    break
                except TimeoutError:
                    continue
            else:
                raise AssertionError(f"no step could be taken at version {version}")
            evicted += metrics["training/off_policy/evicted_samples"]
            spans += [r.sampler.span(t.started_at_version, version) for t in taken]
            if (version + 1) % trigger == 0:
                r.sync_weights(dict, version=version + 1)
    finally:
        r.stop()
    assert max(spans) <= threshold, spans
    assert max(spans) == threshold  # the bound was reached, so the check above means something
    assert (evicted > 0) == (strategy == "drop")


def test_a_failed_group_is_replaced_by_one_new_prompt():
    m = HandManager()
    r = make(m, OffPolicySampler(None), refill_failed=True)
    try:
        assert started(m, 2) == 2
        m.submitted[0][1].set_exception(RuntimeError("a tool crashed"))
        assert started(m, 3) == 3
        m.finish(1), m.finish(2)
        taken, metrics = r.take(2, timeout_s=5, actor_version=0)
        assert positions(taken) == [1, 2] and metrics["training/rollout_failure/evicted_samples"] == 1
    finally:
        r.stop()


def test_dynamic_sampling_discards_are_replaced_one_prompt_each():
    m = HandManager()
    r = make(m, OffPolicySampler(None))
    try:
        assert started(m, 2) == 2
        r.replace(3)
        assert started(m, 5) == 5
    finally:
        r.stop()


CUSTOM = """
from hybridflow.trainer.ppo.off_policy import OffPolicySampler

class NewestFirst(OffPolicySampler):
    def __init__(self, threshold, strategy, versions_per_cycle, flag):
        super().__init__(threshold, strategy, versions_per_cycle)
        self.flag = flag

    def order(self, ready):
        return sorted(ready, key=lambda g: -g.finished_at)

class NotASampler:
    pass
"""


def test_custom_sampler_is_loaded_from_a_file_with_its_kwargs(tmp_path):
    path = tmp_path / "my_sampler.py"
    path.write_text(CUSTOM)
    settings = ReplaySamplerConfig(
        max_off_policy_threshold=3,
        custom_sampler=ModuleConfig(path=str(path), name="NewestFirst"),
        sampler_kwargs={"flag": 7},
    )
    sampler = build_sampler(settings, versions_per_cycle=2)
    assert type(sampler).__name__ == "NewestFirst" and sampler.flag == 7 and sampler.versions_per_cycle == 2
    m = HandManager()
    r = make(m, sampler)
    try:
        assert started(m, 2) == 2
        m.finish(0), time.sleep(0.01), m.finish(1)
        assert [t.group.position for t in r.take(1, timeout_s=5)[0]] == [1]  # the user's order, newest first
    finally:
        r.stop()
    other = ReplaySamplerConfig(custom_sampler=ModuleConfig(path=str(path), name="NotASampler"))
    with pytest.raises(TypeError, match="must subclass OffPolicySampler"):
        build_sampler(other, 1)


def test_trajectory_version_metrics_by_hand():
    batch = DataProto.from_dict(
        tensors={"x": torch.zeros(3, 1)},
        non_tensors={
            "min_weight_version": np.array([0, 2, 4], dtype=object),
            "max_weight_version": np.array([2, 2, 5], dtype=object),
        },
    )
    m = trajectory_version_metrics(batch, actor_version=6, versions_per_cycle=2)  # cycles: [0,1], [1,1], [2,2]; now 3
    assert m["training/off_policy/trajectory_spans/max"] == 2 and m["training/off_policy/trajectory_spans/min"] == 1
    assert m["training/off_policy/trajectory_staleness/mean"] == pytest.approx((2 + 2 + 1) / 3)
    assert m["training/off_policy/trajectory_staleness_worst/max"] == 3
