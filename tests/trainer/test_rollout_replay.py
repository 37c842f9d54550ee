"""Rollout dump → replay end to end (in-process backend, tiny model).

Run A trains 2 GRPO steps and dumps them (trainer.rollout_data_dir). Run B uses ANOTHER data seed, so
its dataloader would hand step 1 other prompts, and replays A's step 1 (skip.rollout). B's step 1 must
then be A's step 1 bit for bit: the same tokens and masks reach the reward, the same scores come out
of it, and — same initial weights — the same losses and gradient norm. Were the replay ignored, B would
generate for other prompts and every comparison would fail.
"""

from __future__ import annotations

import logging
import os

import pytest
import torch

from hybridflow.config.loader import load_config
from hybridflow.main_ppo import run_ppo
from hybridflow.trainer.ppo import ray_trainer, rollout_dump
from tests.trainer.e2e_helpers import base_overrides

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py

COMPARED = ("critic/score/mean", "actor/pg_loss", "actor/entropy", "actor/grad_norm", "response_length/mean")
SEEN_BY_REWARD = ("prompts", "responses", "input_ids", "attention_mask", "position_ids", "response_mask")


@pytest.fixture
def recorder(monkeypatch):
    """Per step: the tensors the reward phase received, the token scores it produced, the step's metrics."""
    seen: dict[int, dict] = {}
    reward, step = ray_trainer.RayPPOTrainer.compute_reward, ray_trainer.RayPPOTrainer.train_step

    def compute_reward(trainer, batch, metrics):
        out = reward(trainer, batch, metrics)
        seen[trainer.global_steps] = {k: batch.batch[k].clone() for k in (*SEEN_BY_REWARD, "token_level_scores")}
        seen[trainer.global_steps]["index"] = list(batch.non_tensor_batch["index"])
        seen[trainer.global_steps]["uid"] = list(batch.non_tensor_batch["uid"])
        return out

    def train_step(trainer, batch):
        metrics = step(trainer, batch)
        seen[trainer.global_steps]["metrics"] = metrics
        return metrics

    def balance_batch(trainer, batch, metrics):  # after the reward (the sample phase scores): the rows' new order
        balance(trainer, batch, metrics)
        seen[trainer.global_steps]["balance_order"] = batch.meta_info.get("balance_order")

    balance = ray_trainer.RayPPOTrainer._balance_batch
    monkeypatch.setattr(ray_trainer.RayPPOTrainer, "compute_reward", compute_reward)
    monkeypatch.setattr(ray_trainer.RayPPOTrainer, "train_step", train_step)
    monkeypatch.setattr(ray_trainer.RayPPOTrainer, "_balance_batch", balance_batch)
    return seen


def _run(tiny_model_dir, tiny_data_dir, tmp_path, name, *extra, steps=2):
    overrides = base_overrides(tiny_model_dir, tiny_data_dir, tmp_path, steps=steps, backend="inprocess")
    overrides += [
        f"trainer.default_local_dir={tmp_path}/{name}",
        "trainer.test_freq=-1",
        "trainer.logger=['console']",
        "trainer.resume_mode=disable",
        *extra,
    ]
    return run_ppo(load_config("ppo_trainer", overrides))


def test_replayed_step_trains_on_exactly_the_dumped_tokens_and_scores(
    tiny_model_dir, tiny_data_dir, tmp_path, recorder, caplog
):
    caplog.set_level(logging.INFO, logger="hybridflow")
    dump_dir = tmp_path / "rollouts"
    _run(tiny_model_dir, tiny_data_dir, tmp_path, "a", f"trainer.rollout_data_dir={dump_dir}")
    a = dict(recorder)
    assert rollout_dump.dumped_steps(str(dump_dir)) == [1, 2]

    # the dump holds what the step trained on: 4 prompts × 2 samples, the reward's scores and tokens
    rows = rollout_dump.read_rows(rollout_dump.step_file(str(dump_dir), 1))
    assert len(rows) == 8 and {r["step"] for r in rows} == {1}
    assert [r["score"] for r in rows] == pytest.approx(a[1]["token_level_scores"].sum(-1).tolist())
    for i, r in enumerate(rows):
        length = int(a[1]["attention_mask"][i, -a[1]["responses"].shape[-1] :].sum())
        assert r["response_ids"] == a[1]["responses"][i, :length].tolist()
        assert len(r["advantages"]) == len(r["response_mask"]) == length
        assert r["non_tensor"]["index"] == a[1]["index"][i]

    recorder.clear()
    caplog.clear()
    _run(
        tiny_model_dir,
        tiny_data_dir,
        tmp_path,
        "b",
        "data.seed=12345",
        "skip.rollout.enable=True",
        f"skip.rollout.dump_dir={dump_dir}",
        "skip.rollout.steps=[1]",
        steps=1,
    )
    b = dict(recorder)
    out = caplog.text
    assert "[skip.rollout] step 1: replayed 8 samples" in out
    assert "holds other prompts than this step's dataloader batch" in out  # data.seed moved B's prompts
    for key in SEEN_BY_REWARD:
        assert torch.equal(b[1][key], a[1][key]), key
    assert torch.equal(b[1]["token_level_scores"], a[1]["token_level_scores"])
    assert b[1]["index"] == a[1]["index"]
    for key in COMPARED:
        assert b[1]["metrics"][key] == a[1]["metrics"][key], key


def test_cache_miss_generates_and_writes_the_step_for_the_next_run(
    tiny_model_dir, tiny_data_dir, tmp_path, recorder, caplog
):
    caplog.set_level(logging.INFO, logger="hybridflow")
    skip_dir = tmp_path / "skip"
    _run(
        tiny_model_dir,
        tiny_data_dir,
        tmp_path,
        "c",
        "skip.rollout.enable=True",
        f"skip.rollout.dump_dir={skip_dir}",
        "skip.rollout.steps=[1]",
        steps=1,
    )
    assert "step 1: no dump in" in caplog.text
    rows = rollout_dump.read_rows(os.path.join(skip_dir, "1.jsonl"))
    assert [r["response_ids"] for r in rows] == [
        recorder[1]["responses"][i, : len(r["response_ids"])].tolist() for i, r in enumerate(rows)
    ]


def test_rollout_only_scores_and_dumps_without_training(tiny_model_dir, tiny_data_dir, tmp_path, recorder, monkeypatch):
    updates = []
    monkeypatch.setattr(ray_trainer.RayPPOTrainer, "_update_actor", lambda *a: updates.append("actor"))
    monkeypatch.setattr(ray_trainer.RayPPOTrainer, "_compute_old_log_prob", lambda *a: updates.append("old_log_prob"))
    dump_dir, val_dir = tmp_path / "ro", tmp_path / "val"
    last = _run(
        tiny_model_dir,
        tiny_data_dir,
        tmp_path,
        "d",
        "trainer.rollout_only=True",
        f"trainer.rollout_data_dir={dump_dir}",
        f"trainer.validation_data_dir={val_dir}",
        "trainer.test_freq=2",
    )
    assert updates == []
    assert sorted(recorder) == [1, 2] and "actor/pg_loss" not in last
    assert last["critic/score/mean"] == pytest.approx(recorder[2]["token_level_scores"].sum(-1).mean().item())
    rows = rollout_dump.read_rows(rollout_dump.step_file(str(dump_dir), 2))
    assert len(rows) == 8 and all("advantages" in r for r in rows)
    # the validation after step 2: every test prompt once (greedy), its scores behind the logged mean
    val_rows = rollout_dump.read_rows(rollout_dump.step_file(str(val_dir), 2))
    (val_key,) = [k for k in last if k.startswith("val-core/")]
    assert len(val_rows) == 32 and {r["step"] for r in val_rows} == {2}
    assert sum(r["score"] for r in val_rows) / 32 == pytest.approx(last[val_key])


@pytest.mark.slow
def test_replay_is_exact_through_batch_balancing_on_two_ray_workers(
    tiny_model_dir, tiny_data_dir, tmp_path, recorder, ray_session
):
    """Two ranks: trainer.balance_batch reorders each step's rows; the dump undoes that order, so the
    replay is balanced into the same order and the update is the same (~1-2 min: two Ray runs).

    On the session's shared Ray (a Ray started and stopped here would leave ray.init's variables and
    SIGTERM handler in this process)."""
    _two_ray_runs(tiny_model_dir, tiny_data_dir, tmp_path, recorder)


def _two_ray_runs(tiny_model_dir, tiny_data_dir, tmp_path, recorder):
    ray2 = [
        "trainer.backend=ray",
        "trainer.n_gpus_per_node=2",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4",
        "critic.ppo_micro_batch_size_per_gpu=2",
    ]
    dump_dir = tmp_path / "rollouts"
    _run(tiny_model_dir, tiny_data_dir, tmp_path, "a", *ray2, f"trainer.rollout_data_dir={dump_dir}", steps=1)
    a = dict(recorder)
    dumped = [r["non_tensor"]["uid"] for r in rollout_dump.read_rows(rollout_dump.step_file(str(dump_dir), 1))]
    # the reward scores rows in generation order (it is part of the sample phase); balancing then moved them,
    # and the dump undoes the move: it is in generation order
    order = a[1]["balance_order"]
    assert order is not None and order != sorted(order)
    assert dumped == sorted(dumped) == a[1]["uid"]
    recorder.clear()
    _run(
        tiny_model_dir,
        tiny_data_dir,
        tmp_path,
        "b",
        *ray2,
        "data.seed=12345",
        "skip.rollout.enable=True",
        f"skip.rollout.dump_dir={dump_dir}",
        "skip.rollout.steps=[1]",
        steps=1,
    )
    b = dict(recorder)
    assert b[1]["balance_order"] == order  # the replay is balanced into the same order
    for key in SEEN_BY_REWARD:
        assert torch.equal(b[1][key], a[1][key]), key
    for key in COMPARED:
        assert b[1]["metrics"][key] == a[1]["metrics"][key], key
