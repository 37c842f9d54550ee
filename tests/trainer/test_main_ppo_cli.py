"""``python -m hybridflow.main_ppo``: veRL's command line runs with only the module name changed,
and bad command lines fail before Ray starts, saying what is wrong."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from tests.subprocess_env import pythonpath_with
from tests.trainer.e2e_helpers import base_overrides

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _run(args: list[str], timeout: float, cwd: str | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env["PYTHONPATH"] = pythonpath_with(REPO_ROOT)
    env.update({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"})
    env.pop("RAY_ADDRESS", None)
    return subprocess.run(
        [sys.executable, "-m", "hybridflow.main_ppo", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=cwd,
    )


def _verl_quickstart(train: str, test: str, model: str) -> list[str]:
    """veRL's PPO quickstart (GSM8K, Qwen2.5-0.5B-Instruct), with the model and data pointed at tiny
    local copies and the sizes shrunk (train_batch_size 256→16, prompt 512→128, response 256→16,
    total_epochs → total_training_steps=1 after the original epochs key)."""
    return [
        f"data.train_files={train}",
        f"data.val_files={test}",
        "data.train_batch_size=16",
        "data.max_prompt_length=128",
        "data.max_response_length=16",
        f"actor_rollout_ref.model.path={model}",
        "actor_rollout_ref.actor.optim.lr=1e-6",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        "actor_rollout_ref.rollout.gpu_memory_utilization=0.4",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4",
        "critic.optim.lr=1e-5",
        f"critic.model.path={model}",
        "critic.ppo_micro_batch_size_per_gpu=4",
        "algorithm.kl_ctrl.kl_coef=0.001",
        "trainer.logger=console",
        "trainer.val_before_train=False",
        "trainer.n_gpus_per_node=1",
        "trainer.nnodes=1",
        "trainer.save_freq=10",
        "trainer.test_freq=10",
        "trainer.total_epochs=15",
        "trainer.total_training_steps=1",
    ]


@pytest.mark.slow
def test_verl_quickstart_command_line_runs(tiny_model_dir, tiny_data_dir, tmp_path):
    args = _verl_quickstart(f"{tiny_data_dir}/train.parquet", f"{tiny_data_dir}/test.parquet", tiny_model_dir)
    args.append(f"trainer.default_local_dir={tmp_path}/ckpt")
    proc = _run(args, timeout=300, cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    step_lines = [line for line in proc.stdout.splitlines() if line.startswith("step:1 ")]
    assert len(step_lines) == 1, proc.stdout[-3000:]
    for key in ("critic/vf_loss:", "actor/pg_loss:", "critic/score/mean:", "timing_s/step:"):
        assert key in step_lines[0], key


def test_unknown_key_fails_before_ray_naming_the_closest_key(tmp_path):
    args = base_overrides("/nonexistent/model", "/nonexistent/data", tmp_path)
    args.append("actor_rollout_ref.actor.ppo_mini_batch_sise=2")
    start = time.perf_counter()
    proc = _run(args, timeout=120)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "actor_rollout_ref.actor.ppo_mini_batch_sise" in proc.stderr
    assert "actor_rollout_ref.actor.ppo_mini_batch_size" in proc.stderr.replace("ppo_mini_batch_sise", "")
    assert "Traceback" not in proc.stderr
    assert "Started a local Ray instance" not in proc.stderr + proc.stdout
    assert time.perf_counter() - start < 60


def test_batch_size_arithmetic_error_shows_the_numbers(tiny_model_dir, tiny_data_dir, tmp_path):
    # 4 prompts × n=2 = 8 samples over 2 ranks = 4 per rank: a micro-batch of 3 does not divide it
    args = base_overrides(tiny_model_dir, tiny_data_dir, tmp_path, batch=4, n=2, world=2)
    args.append("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=3")
    proc = _run(args, timeout=120)
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-3000:]
    err = proc.stderr
    assert "ppo_micro_batch_size_per_gpu (3)" in err, err[-3000:]
    assert "Traceback" not in err
    assert "Started a local Ray instance" not in err + proc.stdout
