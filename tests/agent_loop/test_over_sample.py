"""rollout.over_sample_rate: a training call keeps the first trajectories to finish and pads the rest;
a validation call keeps everything. The server's latencies are scripted (latency_rollout.py): prompts
ending in a token >= 100 are slow (they finish only when aborted, or after ``slow_s``)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hybridflow.agent_loop import agent_loop_settings
from hybridflow.agent_loop.manager import AgentLoopManager
from hybridflow.agent_loop.over_sample import over_sample_target
from hybridflow.agent_loop.server_manager import ROLLOUT_CONCURRENCY_GROUP
from hybridflow.config.loader import ConfigError, load_config
from hybridflow.protocol import DataProto
from hybridflow.single_controller.base import ClassWithInitArgs
from hybridflow.single_controller.factory import build_worker_group
from hybridflow.trainer.config_checks import validate_ppo_config
from tests.agent_loop.latency_rollout import PAD, LatencyRolloutWorker, PadOnlyTokenizer


def prompts(last_tokens, meta):
    ids = torch.tensor([[7, t] for t in last_tokens])
    mask = torch.ones_like(ids)
    return DataProto.from_dict(
        tensors={"input_ids": ids, "attention_mask": mask, "position_ids": mask.cumsum(-1) - 1},
        non_tensors={"index": np.arange(len(last_tokens))},
        meta_info=meta,
    )


@pytest.fixture
def manager_for():
    made = []

    def make(rate, slow_s, backend="inprocess"):
        group = build_worker_group(
            backend,
            ClassWithInitArgs(LatencyRolloutWorker, slow_s=slow_s),
            [1],
            name="latency",
            concurrency_groups={ROLLOUT_CONCURRENCY_GROUP: 16},
        )
        rollout = {
            "prompt_length": 2,
            "response_length": 4,
            "calculate_log_probs": True,
            "over_sample_rate": rate,
            "agent": {"num_workers": 2},
            "val_kwargs": {"do_sample": False, "temperature": 0},
        }
        manager = AgentLoopManager(agent_loop_settings(rollout), group, PadOnlyTokenizer(), role=None)
        made.append((manager, group))
        return manager, group

    yield make
    for manager, group in made:
        manager.shutdown()
        group.close_engine()
        group.shutdown()


FAST, SLOW = [1, 2, 3, 4], [101, 102, 103, 104]
ORDER = [1, 101, 2, 102, 3, 103, 4, 104]  # each of the two agent loop workers gets two of each


def test_the_slow_half_is_aborted_and_padded(manager_for, backend):
    # without the cut the slow ones take 30 s and are kept; the cut is counted over both agent loop workers
    manager, group = manager_for(rate=0.5, slow_s=30.0, backend=backend)
    out = manager.generate_sequences(prompts(ORDER, {"global_steps": 1}))
    assert len(out) == 8 and group.aborts() == 1
    for row, p in enumerate(ORDER):
        responses, mask = out.batch["responses"][row].tolist(), out.batch["response_mask"][row].tolist()
        attention = out.batch["attention_mask"][row].tolist()
        if p in FAST:  # kept as generated
            assert responses == [p + 1, p + 2, p + 3, PAD] and mask == [1, 1, 1, 0]
            assert attention == [1, 1, 1, 1, 1, 0]
            assert out.batch["rollout_log_probs"][row].tolist() == [-0.5, -0.5, -0.5, 0.0]
        else:  # padding: the prompt, no response, nothing for the loss (even the token the abort returned)
            assert responses == [PAD] * 4 and mask == [0] * 4
            assert attention == [1, 1, 0, 0, 0, 0] and out.batch["prompts"][row].tolist() == [7, p]
            assert out.batch["rollout_log_probs"][row].tolist() == [0.0] * 4
    assert out.meta_info["metrics"]["agent/over_sample/aborted_ratio"] == [0.5]


def test_validation_and_rate_zero_keep_every_sample(manager_for):
    manager, group = manager_for(rate=0.5, slow_s=0.2)
    val = manager.generate_sequences(prompts(ORDER, {"global_steps": 1, "validate": True}))
    assert [r[0] for r in val.batch["responses"].tolist()] == [p + 1 for p in ORDER]
    assert val.batch["response_mask"].sum().item() == 3 * 8 and group.aborts() == 0
    assert "agent/over_sample/aborted_ratio" not in val.meta_info["metrics"]

    manager, group = manager_for(rate=0.0, slow_s=0.2)
    train = manager.generate_sequences(prompts(ORDER, {"global_steps": 1}))
    assert train.batch["response_mask"].sum().item() == 3 * 8 and group.aborts() == 0


def test_request_ids_continue_the_steps_earlier_rows(manager_for):
    # a refill round of a step (sample_offset 8: eight trajectories came before it) over two agent loop
    # workers: its requests are train5:8..11, never the first round's train5:0..3 again
    manager, group = manager_for(rate=0.0, slow_s=0.2)
    manager.generate_sequences(prompts(FAST, {"global_steps": 5, "sample_offset": 8}))
    requests = sorted(r.split("/")[0] for r in group.request_ids())  # without the "/turn" suffix
    assert requests == sorted(f"train5:{i}" for i in range(8, 12))


def test_target_is_verl_formula_with_at_least_one():
    assert over_sample_target(8, 0.5) == 4
    assert over_sample_target(10, 0.25) == 7  # int(7.5)
    assert over_sample_target(10, 0.0) == 10
    assert over_sample_target(3, 0.9) == 1  # int(0.3) = 0: one is kept
    with pytest.raises(ValueError, match="over_sample_rate must be in"):
        over_sample_target(4, 1.0)


def test_config_refuses_bad_rates_and_async_modes():
    with pytest.raises(ConfigError, match=r"over_sample_rate must be in \[0, 1\).*got 1.0"):
        validate_ppo_config(
            load_config("ppo_trainer", ["actor_rollout_ref.rollout.over_sample_rate=1.0", "trainer.device=cpu"])
        )
    cfg = load_config(
        "ppo_trainer",
        [
            "actor_rollout_ref.rollout.over_sample_rate=0.2",
            "async_training.mode=one_step_off",
            "actor_rollout_ref.rollout.nnodes=1",
            "actor_rollout_ref.rollout.n_gpus_per_node=1",
            "trainer.device=cpu",
        ],
    )
    with pytest.raises(ConfigError, match="over_sample_rate=0.2 cuts the slowest trajectories"):
        validate_ppo_config(cfg)
