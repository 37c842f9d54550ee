"""trainer.v1.sampler.sync_refill_failed_groups: in synchronous mode a group whose agent loop raised is dropped and
exactly one new prompt from the stream replaces it; off (hybridflow's default), the failure stops the run naming
the sample. One in-process step of the tiny model."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch

from hybridflow.agent_loop.single_turn_agent import SingleTurnAgentLoop
from hybridflow.agent_loop.worker import KEEP_FAILED, ROLLOUT_ERROR
from hybridflow.protocol import DataProto
from hybridflow.trainer.ppo import ray_trainer
from hybridflow.trainer.ppo.dynamic_sampling import EpochCycler
from hybridflow.trainer.ppo.rollout_source import FAILED_GROUPS, SyncRolloutSource
from tests.trainer.test_async_training import run


class FailingManager:
    """Every trajectory of the prompts whose dataset index is in ``failing`` fails; records each call's prompts."""

    def __init__(self, failing):
        self.failing, self.calls = set(failing), []

    def generate_sequences(self, request):
        assert request.meta_info[KEEP_FAILED]
        index = list(request.non_tensor_batch["index"])
        self.calls.append(sorted(set(index)))
        errors = np.array(["ValueError()" if i in self.failing else None for i in index], dtype=object)
        out = DataProto.from_dict(
            tensors={"responses": torch.zeros(len(index), 1)}, non_tensors={ROLLOUT_ERROR: errors}
        )
        out.meta_info = {"metrics": {}}
        return out


class Loader(list):
    def state_dict(self):
        return {"epoch": 0}


def source_of(failing, batch_size=4):
    """A step trains 4 groups; its dataloader holds 3 batches of ``batch_size`` prompts (data.gen_batch_size)."""
    b = batch_size
    batches = [{"input_ids": torch.zeros(b, 2), "attention_mask": torch.ones(b, 2), "position_ids": torch.zeros(b, 2),
                "index": np.arange(b * i, b * i + b)} for i in range(3)]  # fmt: skip
    return SyncRolloutSource(
        FailingManager(failing), EpochCycler(Loader(batches)), 2, True, None, 4, 0, refill_failed=True, batch_size=b
    )


def test_the_source_drops_failed_groups_and_draws_one_prompt_each():
    source = source_of({1, 4})
    metrics, prompts = {}, next(source.inputs(1, 0))
    batch = source.generate(prompts, {}, metrics, 1, 0)
    assert (
        list(batch.non_tensor_batch["uid"]) == ["1_0", "1_0", "1_2", "1_2", "1_3", "1_3"]
        and ROLLOUT_ERROR not in batch.non_tensor_batch
    )
    assert metrics[FAILED_GROUPS] == 1
    more, rounds = source.refill(1, 1, 0, {}, metrics := {}, 1, 0)
    # prompt 4 (the next batch's first) failed alone: a batch of none left, so prompt 5 was drawn at once
    assert source.manager.calls == [[0, 1, 2, 3], [4], [5]] and metrics[FAILED_GROUPS] == 1 and rounds == 1
    assert list(more.non_tensor_batch["index"]) == [5, 5] and list(more.non_tensor_batch["uid"]) == ["1_5", "1_5"]
    assert list(source.data_state(1)["spare_prompts"].non_tensor_batch["index"]) == [6, 7]  # saved for the next refill


def test_more_failed_groups_than_a_step_trains_stop_the_run():
    source = source_of(range(12))
    with pytest.raises(RuntimeError, match=r"8 prompt groups failed in a step of 4 \(4 a batch\)"):
        source.generate(next(source.inputs(1, 0)), {}, {}, 1, 0)


def test_a_generation_batch_larger_than_the_step_may_lose_more_groups_than_the_step_trains():
    """DAPO's data.gen_batch_size=12 for a step of 4: 6 failed groups leave 6, more than the step needs."""
    source = source_of({0, 1, 2, 3, 4, 5}, batch_size=12)
    batch = source.generate(next(source.inputs(1, 0)), {}, metrics := {}, 1, 0)
    assert sorted(set(batch.non_tensor_batch["index"])) == [6, 7, 8, 9, 10, 11] and metrics[FAILED_GROUPS] == 6
    everything_fails = source_of(range(36), batch_size=12)  # a whole batch failed: as many new prompts, failed too
    with pytest.raises(RuntimeError, match=r"24 prompt groups failed in a step of 4 \(12 a batch\)"):
        everything_fails.generate(next(everything_fails.inputs(1, 0)), {}, {}, 1, 0)


FAILING = "train1:4"  # step 1, row 4: the first trajectory of the third prompt (uid 1_2; 4 prompts x n=2)


@pytest.fixture
def record(monkeypatch):
    """The agent loop raises on FAILING; records the prompts of every generation and the trained uids."""
    seen = {"generated": [], "trained": []}
    loop_run, generate, advantage = (
        SingleTurnAgentLoop.run,
        SyncRolloutSource.generate,
        ray_trainer.RayPPOTrainer._compute_advantage,
    )

    async def failing_run(self, params, **sample):
        if sample["request_id"] == FAILING:
            raise ValueError("the tool exploded")
        return await loop_run(self, params, **sample)

    def recording_generate(source, prompts, *args):
        seen["generated"].append(len(prompts))
        return generate(source, prompts, *args)

    def recording_advantage(trainer, batch):
        seen["trained"] = list(batch.non_tensor_batch["uid"])
        return advantage(trainer, batch)

    monkeypatch.setattr(SingleTurnAgentLoop, "run", failing_run)
    monkeypatch.setattr(SyncRolloutSource, "generate", recording_generate)
    monkeypatch.setattr(ray_trainer.RayPPOTrainer, "_compute_advantage", recording_advantage)
    return seen


@pytest.mark.usefixtures("one_torch_thread")  # in-process runs compute in this process
def test_a_failed_group_is_replaced_by_one_new_prompt(record, tiny_model_dir, tiny_data_dir, tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="hybridflow.agent_loop.worker"):
        rows = run(
            tiny_model_dir, tiny_data_dir, tmp_path, "trainer.v1.sampler.sync_refill_failed_groups=True", steps=1
        )
    assert len(rows) == 1 and rows[0]["training/rollout_failure/evicted_samples"] == 1
    assert record["generated"] == [4, 1]  # the step's batch, then exactly one replacement prompt
    assert sorted(record["trained"]) == sorted(["1_0", "1_1", "1_3", "1_4"] * 2)  # 1_2 dropped, 1_4 its successor
    assert any(FAILING in r.message and "the tool exploded" in r.message for r in caplog.records)


@pytest.mark.usefixtures("one_torch_thread")
def test_off_a_failed_trajectory_stops_the_run_naming_the_sample(record, tiny_model_dir, tiny_data_dir, tmp_path):
    with pytest.raises(ValueError, match="the tool exploded") as info:
        run(tiny_model_dir, tiny_data_dir, tmp_path, steps=1)
    assert any(f"sample 4 (request {FAILING!r})" in n for n in info.value.__notes__)
    assert record["generated"] == [4]
