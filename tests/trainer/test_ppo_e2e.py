"""End-to-end runs of the PPO driver (``run_ppo``) on the tiny model and task, on the CPU.

One Ray session is shared by all the Ray tests (``ray_session``). The default-suite test is the
2-worker GRPO run; the others are slow-marked where they take long.
"""

from __future__ import annotations

import pytest
import torch

from hybridflow.main_ppo import run_ppo
from hybridflow.utils.config import load_config
from tests.trainer.e2e_helpers import REQUIRED_STEP_METRICS, assert_finite, base_overrides, missing, read_metrics


class _Capture:
    """Wraps RayPPOTrainer.init_workers to keep the trainer (its worker groups) for the test."""

    def __init__(self, monkeypatch):
        from hybridflow.trainer.ppo import ray_trainer

        self.trainer = None
        self.initial_checksum = None
        original = ray_trainer.RayPPOTrainer.init_workers
        capture = self

        def init_workers(trainer):
            original(trainer)
            capture.trainer = trainer
            capture.initial_checksum = _checksum(trainer)

        monkeypatch.setattr(ray_trainer.RayPPOTrainer, "init_workers", init_workers)


def _checksum(trainer) -> float:
    sums = trainer.actor_rollout_wg.parameter_checksum()
    sums = sums if isinstance(sums, list) else [sums]
    assert all(s == sums[0] for s in sums), f"ranks disagree on the full weights: {sums}"
    return sums[0]


def test_grpo_two_workers_three_steps(tiny_model_dir, tiny_data_dir, ray_session, tmp_path, monkeypatch):
    capture = _Capture(monkeypatch)
    overrides = base_overrides(tiny_model_dir, tiny_data_dir, tmp_path, estimator="grpo", n=2, batch=4, steps=3,
                               world=2)
    last = run_ppo(load_config("ppo_trainer", overrides))

    steps = read_metrics(tmp_path)
    assert [m["step"] for m in steps] == [1, 2, 3]
    assert last == {k: v for k, v in steps[-1].items() if k != "step"}
    for m in steps:
        assert_finite(m)
        assert not missing(m, REQUIRED_STEP_METRICS), missing(m, REQUIRED_STEP_METRICS)
    # validation ran at the last step (test_freq=3), per data source
    assert any(k.startswith("val-core/") and "/reward/mean@" in k for k in steps[-1]), sorted(steps[-1])
    # the toy reward gives different scores within a group → non-zero advantages, a real update
    assert any(abs(m["critic/advantages/max"]) > 0 for m in steps)
    # 2 workers with balance_batch: token loads per rank logged
    assert "global_seqlen/minmax_diff" in steps[0]
    assert _checksum(capture.trainer) != capture.initial_checksum
