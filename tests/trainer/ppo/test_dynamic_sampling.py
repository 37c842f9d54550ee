"""Dynamic sampling (algorithm.filter_groups): the group filter, the accumulator, the refill size and
the generate-until-full loop over the synchronous rollout source, on hand-made batches."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hybridflow.config.algorithm import FilterGroupsConfig
from hybridflow.config.convert import omega_conf_to_dataclass
from hybridflow.protocol import DataProto
from hybridflow.trainer.ppo.dynamic_sampling import (
    EpochCycler,
    GroupAccumulator,
    fill_with_informative_groups,
    group_metric_values,
    informative_rows,
    merge_round_metrics,
    prompt_batches_for_next_round,
)
from hybridflow.trainer.ppo.rollout_source import SyncRolloutSource


def scored(uids, scores, **extra) -> DataProto:
    """Rows with a uid and a sequence score placed on the last of 3 response positions."""
    n = len(uids)
    tls = torch.zeros(n, 3)
    tls[:, -1] = torch.tensor(scores, dtype=torch.float32)
    non_tensor = {"uid": np.array(uids, dtype=object), **{k: np.array(v, dtype=object) for k, v in extra.items()}}
    return DataProto.from_dict(tensors={"token_level_scores": tls, "row": torch.arange(n)}, non_tensors=non_tensor)


def test_informative_rows_by_hand():
    uids = ["a", "a", "b", "b", "c", "d", "d", "d"]
    vals = [1.0, 1.0, 0.0, 1.0, 5.0, 0.3, 0.3, 0.30000001]
    # a: all 1 -> dropped; b: 0/1 -> kept; c: a single response -> kept; d: differ in the 8th digit -> kept
    assert informative_rows(uids, vals).tolist() == [False, False, True, True, True, True, True, True]
    # groups need not be contiguous
    assert informative_rows(["x", "y", "x", "y"], [2, 1, 2, 3]).tolist() == [False, True, False, True]


def test_exact_equality_not_float_std():
    # np.std([0.1] * 3) is ~1.4e-17, not 0: a std test would keep this uniform group
    assert np.std([0.1, 0.1, 0.1]) != 0.0
    assert informative_rows(["g"] * 3, [0.1, 0.1, 0.1]).tolist() == [False] * 3


def test_group_metric_values_reward_and_extra_fields():
    batch = scored(["a", "a"], [0.5, 2.0], acc=[True, False])
    assert group_metric_values(batch, "reward").tolist() == [0.5, 2.0]  # the summed token scores
    assert group_metric_values(batch, "acc").tolist() == [1.0, 0.0]
    with pytest.raises(KeyError, match=r"metric='seq_reward'.*'acc'"):
        group_metric_values(batch, "seq_reward")


def test_accumulator_keeps_informative_groups_in_order_and_trims_the_surplus():
    acc = GroupAccumulator(target_groups=3)
    # batch 1: g0 uniform, g1 informative; batch 2: g2, g3 informative, g4 uniform; batch 3: g5 informative
    acc.add(scored(["g0", "g0", "g1", "g1"], [1, 1, 0, 1]))
    assert (acc.groups_kept, acc.missing, acc.full) == (1, 2, False)
    acc.add(scored(["g2", "g2", "g3", "g3", "g4", "g4"], [0, 2, 3, 1, 0, 0]))
    assert acc.full and acc.groups_kept == 3
    acc.add(scored(["g5", "g5"], [0, 1]))  # one more arrives before the batch is taken: surplus
    out = acc.take()
    assert out.non_tensor_batch["uid"].tolist() == ["g1", "g1", "g2", "g2", "g3", "g3"]
    assert out.batch["token_level_scores"].sum(-1).tolist() == [0, 1, 0, 2, 3, 1]
    assert acc.metrics() == {
        "training/filter_groups/num_gen_batches": 3.0,
        "training/filter_groups/groups_seen": 6.0,
        "training/filter_groups/evicted_samples": 2.0,
        "training/filter_groups/discarded_surplus_samples": 1.0,
        "training/filter_groups/kept_groups": 4.0,
    }
    with pytest.raises(RuntimeError, match="0 of 3 groups held"):
        acc.take()  # released after take


def test_accumulator_refuses_a_group_seen_twice():
    acc = GroupAccumulator(target_groups=4)
    acc.add(scored(["s_0", "s_0"], [0, 1]))
    with pytest.raises(ValueError, match="its own uids"):
        acc.add(scored(["s_0", "s_0"], [1, 0]))


@pytest.mark.parametrize(
    "missing, batch, inflight, generated, limit, expected",
    [
        (1, 8, 4, 1, 0, 1),  # 2 × 1 missing = 2 prompts: one batch
        (8, 8, 4, 1, 0, 2),  # 16 prompts: two batches
        (8, 8, 1, 1, 0, 1),  # at most max_inflight_gen_batches
        (30, 8, 4, 1, 0, 4),  # ceil(60 / 8) = 8, capped at 4
        (30, 8, 4, 3, 5, 2),  # budget 5, 3 used: 2 left
        (1, 8, 4, 5, 5, 0),  # budget spent
    ],
)
def test_prompt_batches_for_next_round(missing, batch, inflight, generated, limit, expected):
    assert prompt_batches_for_next_round(missing, batch, inflight, generated, limit) == expected


@pytest.mark.parametrize(
    "section, message",
    [
        ({"enable": True, "metric": None}, "metric must name"),
        ({"enable": "yes"}, "enable must be true or false"),
        ({"max_num_gen_batches": 1.5}, "max_num_gen_batches must be an integer"),
        ({"max_inflight_gen_batches": 0}, "max_inflight_gen_batches must be >= 1"),
    ],
)
def test_settings_refuse_bad_values(section, message):
    with pytest.raises(ValueError, match="algorithm.filter_groups") as err:
        omega_conf_to_dataclass(section, FilterGroupsConfig, path="algorithm.filter_groups")
    assert message in str(err.value)


class FakeManager:
    """The agent loop manager for prompts whose one token is the prompt id: every trajectory answers
    with its prompt id as field 'p'."""

    def __init__(self):
        self.calls: list[list[int]] = []

    def generate_sequences(self, prompts: DataProto) -> DataProto:
        ids = prompts.batch["input_ids"][:, 0]
        self.calls.append(ids[::2].tolist())  # n = 2 rows per prompt
        return DataProto.from_dict(tensors={"p": ids.clone()}, meta_info={"metrics": {}})


class Loader:
    """Prompt batches of one-token prompts whose token is the prompt id: 0, 1, 2, ..."""

    def __init__(self, batch_size: int):
        self.batch_size = batch_size

    def __iter__(self):
        for start in range(0, 10_000, self.batch_size):
            ids = torch.arange(start, start + self.batch_size)[:, None]
            yield {"input_ids": ids, "attention_mask": torch.ones_like(ids), "position_ids": torch.zeros_like(ids)}

    def state_dict(self) -> dict:
        return {"epoch": 0}


def run_dynamic_sampling(scores: dict, settings: FilterGroupsConfig, batch_size: int = 4, gen_batch_size=None):
    """The synchronous source and the one dynamic-sampling loop, wired as ``train_step`` wires them; the
    score of both responses of prompt p is ``scores[p]`` (a pair, or one number for a uniform group).
    ``gen_batch_size``: the loader's batches (data.gen_batch_size), ``batch_size`` the groups a step trains."""
    manager = FakeManager()
    loader = Loader(gen_batch_size or batch_size)
    source = SyncRolloutSource(
        manager,
        EpochCycler(loader),
        2,
        True,
        None,
        batch_size,
        settings.max_inflight_gen_batches,
        False,
        gen_batch_size,
    )

    def score(batch: DataProto) -> DataProto:
        values = []
        for p in batch.batch["p"].tolist()[::2]:
            values += list(scores[p] if isinstance(scores[p], tuple) else (scores[p],) * 2)
        out = scored(list(batch.non_tensor_batch["uid"]), values)
        out.batch["p"] = batch.batch["p"]
        return out

    def refill(missing_groups: int, batches_so_far: int):
        more, count = source.refill(missing_groups, batches_so_far, settings.max_num_gen_batches, {}, {}, 1, 0)
        return score(more), count

    first = score(source.generate(next(source.inputs(1, 0)), {}, {}, 1, 0))
    out, metrics = fill_with_informative_groups(first, batch_size, settings, refill)
    return out, metrics, manager.calls


def test_dynamic_sampling_generates_until_full_and_trims():
    # prompts 0-3: 1 informative (0); 4-7: 2 informative (5, 6); 8-11: all informative
    informative = {0, 5, 6, 8, 9, 10, 11}
    scores = {p: (0.0, 1.0) if p in informative else 1.0 for p in range(100)}
    out, metrics, calls = run_dynamic_sampling(scores, FilterGroupsConfig(enable=True, metric="reward"))
    # round 1: 1 kept, 3 missing -> ceil(6/4) = 2 batches wanted, max_inflight 1 -> one batch (4-7);
    # round 2: 3 kept, 1 missing -> one batch (8-11): full with 7, first 4 groups taken
    assert calls == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
    assert out.batch["p"].tolist() == [0, 0, 5, 5, 6, 6, 8, 8]
    assert len(set(out.non_tensor_batch["uid"])) == 4  # uids numbered across rounds: never shared
    assert metrics["training/filter_groups/num_gen_batches"] == 3.0
    assert metrics["training/filter_groups/evicted_samples"] == 5.0  # 3 + 2 uniform groups
    assert metrics["training/filter_groups/discarded_surplus_samples"] == 3.0  # 9, 10, 11


def test_dynamic_sampling_in_flight_refills_several_batches_at_once():
    scores = {p: (0.0, 1.0) if p >= 8 else 2.0 for p in range(100)}
    out, metrics, calls = run_dynamic_sampling(
        scores, FilterGroupsConfig(enable=True, metric="reward", max_inflight_gen_batches=3)
    )
    # round 1 keeps nothing: 2 × 4 missing = 8 prompts = 2 batches in one round (4-11); 8-11 fill it
    assert calls == [[0, 1, 2, 3], list(range(4, 12))]
    assert out.batch["p"].tolist() == [8, 8, 9, 9, 10, 10, 11, 11]
    assert metrics["training/filter_groups/num_gen_batches"] == 3.0  # prompt batches, over 2 rounds


def test_a_generation_batch_of_its_own_size():
    # data.gen_batch_size=12 for 4 groups a step: one batch of 12 usually holds them, the surplus trimmed
    informative = {0, 5, 6, 8, 9, 10, 11}
    scores = {p: (0.0, 1.0) if p in informative else 1.0 for p in range(100)}
    out, metrics, calls = run_dynamic_sampling(scores, FilterGroupsConfig(enable=True, metric="reward"), 4, 12)
    assert calls == [list(range(12))]
    assert out.batch["p"].tolist() == [0, 0, 5, 5, 6, 6, 8, 8]
    assert metrics["training/filter_groups/num_gen_batches"] == 1.0
    assert metrics["training/filter_groups/discarded_surplus_samples"] == 3.0  # 9, 10, 11
    # refills are counted in generation batches: 3 groups missing after 0-5 -> ceil(2 * 3 / 6) = 1 batch of 6
    # (counted in batches of the 4 groups a step trains it would be 2, which max_inflight 3 would allow)
    scores = {p: (0.0, 1.0) if p in {0, 7, 8, 9} else 1.0 for p in range(100)}
    settings = FilterGroupsConfig(enable=True, metric="reward", max_inflight_gen_batches=3)
    out, metrics, calls = run_dynamic_sampling(scores, settings, 4, 6)
    assert calls == [list(range(6)), list(range(6, 12))]
    assert out.batch["p"].tolist() == [0, 0, 7, 7, 8, 8, 9, 9]


def test_dynamic_sampling_fails_after_max_num_gen_batches():
    scores = {p: 1.0 for p in range(100)}  # every group uniform
    with pytest.raises(RuntimeError, match=r"3 prompt batches generated.*max_num_gen_batches=3.*0 of 4 groups"):
        run_dynamic_sampling(scores, FilterGroupsConfig(enable=True, metric="reward", max_num_gen_batches=3))


def test_epoch_cycler_continues_into_the_next_epoch():
    class Loader:  # two batches per epoch, counts epochs like the stateful loader
        epochs = 0

        def __iter__(self):
            Loader.epochs += 1
            return iter([f"e{Loader.epochs}b0", f"e{Loader.epochs}b1"])

    stream = EpochCycler(Loader())
    assert [next(stream) for _ in range(5)] == ["e1b0", "e1b1", "e2b0", "e2b1", "e3b0"]
    with pytest.raises(RuntimeError, match="yields no batch"):
        next(EpochCycler([]))


def test_merge_round_metrics():
    merged = merge_round_metrics(
        [{"timing_s/x": 1.0, "a/b": [1.0, 3.0], "rollout/w_mb": [4.0]}, {"timing_s/x": 2.0, "a/b": [5.0], "c": 7.0}]
    )
    assert merged == {"timing_s/x": 3.0, "a/b": [1.0, 3.0, 5.0], "rollout/w_mb": 4.0, "c": [7.0]}
