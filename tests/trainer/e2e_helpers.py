"""Shared pieces of the PPO end-to-end tests: a dense toy reward, small override lists, metric readers.

The tiny model scores 0 on the arithmetic task, so every run uses a dense toy reward (the share of
digit characters in the response): scores differ within a group and advantages are non-zero.
"""

from __future__ import annotations

import json
import math
import os

TOY_REWARD = '''
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    """Dense toy reward: the share of digit characters in the response."""
    s = solution_str or ""
    return sum(c.isdigit() for c in s) / max(len(s), 1)
'''

# every metric the issue asks a PPO/GRPO step to log
REQUIRED_STEP_METRICS = (
    "actor/pg_loss",
    "actor/pg_clipfrac",
    "actor/ppo_kl",
    "actor/entropy",
    "actor/grad_norm",
    "critic/score/mean",
    "critic/advantages/mean",
    "response_length/mean",
    "response_length/clip_ratio",
    "timing_s/gen",
    "timing_s/update_actor",
    "timing_s/step",
    "perf/throughput",
    "timing_s/update_weights",
    "training/rollout_probs_diff_mean",
    "training/rollout_probs_diff_max",
    "training/rollout_probs_diff_std",
    "agent/num_turns/mean",
)


def write_toy_reward(tmp_path) -> str:
    path = os.path.join(str(tmp_path), "toy_reward.py")
    with open(path, "w") as f:
        f.write(TOY_REWARD)
    return path


def base_overrides(
    model_dir: str,
    data_dir: str,
    tmp_path,
    *,
    estimator: str = "grpo",
    n: int = 2,
    batch: int = 4,
    steps: int = 2,
    response_length: int = 8,
    world: int = 1,
    backend: str = "ray",
    mini_batch: int | None = None,
) -> list[str]:
    """A small run: `batch` prompts × `n` samples, `steps` steps, jsonl metrics under tmp_path/ckpt.

    ``mini_batch`` (prompts, default batch // 2) gives two optimizer steps per update, so the second
    mini-batch sees a moved policy (ppo_kl, clipfrac can be non-zero)."""
    out = str(tmp_path)
    mini_batch = mini_batch or max(1, batch // 2)
    per_rank = batch * n // world
    return [
        f"algorithm.adv_estimator={estimator}",
        f"data.train_files={data_dir}/train.parquet",
        f"data.val_files={data_dir}/test.parquet",
        f"data.train_batch_size={batch}",
        "data.max_prompt_length=128",
        f"data.max_response_length={response_length}",
        "data.dataloader_num_workers=0",
        f"actor_rollout_ref.model.path={model_dir}",
        "actor_rollout_ref.model.enable_gradient_checkpointing=False",
        "actor_rollout_ref.actor.optim.lr=1e-3",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={mini_batch}",
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={mini_batch * n // world}",
        f"actor_rollout_ref.rollout.n={n}",
        "actor_rollout_ref.rollout.agent.num_workers=1",
        f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={per_rank}",
        f"actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu={per_rank}",
        f"critic.model.path={model_dir}",
        "critic.model.enable_gradient_checkpointing=False",
        "critic.optim.lr=1e-3",
        f"critic.ppo_micro_batch_size_per_gpu={mini_batch * n // world}",
        f"custom_reward_function.path={write_toy_reward(tmp_path)}",
        f"trainer.total_training_steps={steps}",
        f"trainer.test_freq={steps}",
        "trainer.save_freq=-1",
        "trainer.val_before_train=False",
        "trainer.logger=['console','file']",
        f"trainer.default_local_dir={out}/ckpt",
        f"trainer.n_gpus_per_node={world}",
        f"trainer.backend={backend}",
        "trainer.device=cpu",
    ]


def read_metrics(tmp_path) -> list[dict]:
    """Every logged step's metrics, from the jsonl file logger (one dict per logged step)."""
    path = os.path.join(str(tmp_path), "ckpt", "metrics.jsonl")
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def assert_finite(metrics: dict) -> None:
    bad = {k: v for k, v in metrics.items() if not isinstance(v, (int, float)) or not math.isfinite(v)}
    assert not bad, f"non-finite metrics: {bad}"


def missing(metrics: dict, required) -> list[str]:
    return [k for k in required if k not in metrics]
