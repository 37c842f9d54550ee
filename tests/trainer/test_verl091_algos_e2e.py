"""One in-process PPO step through the veRL 0.9.1 additions that need the workers: the actor's
sum_pi_squared (actor.calculate_sum_pi_squared) reaching the optimal-token-baseline estimator, and a
new policy loss (cispo) in the update; gdpo reading the reward function's components (and logging
them) with geo_mean."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hybridflow.config.loader import load_config
from hybridflow.main_ppo import run_ppo
from hybridflow.trainer.ppo.ray_trainer import RayPPOTrainer
from tests.trainer.e2e_helpers import assert_finite, base_overrides, read_metrics


def test_inprocess_tir_optimal_token_baseline_with_cispo(tiny_model_dir, tiny_data_dir, tmp_path, monkeypatch):
    seen = []
    original = RayPPOTrainer._compute_advantage

    def recording(self, batch):
        original(self, batch)
        seen.append(
            {k: batch.batch[k].clone() for k in ("sum_pi_squared", "old_log_probs", "response_mask", "advantages")}
        )

    monkeypatch.setattr(RayPPOTrainer, "_compute_advantage", recording)
    overrides = base_overrides(
        tiny_model_dir,
        tiny_data_dir,
        tmp_path,
        estimator="tir_optimal_token_baseline",
        n=2,
        batch=4,
        steps=1,
        backend="inprocess",
    )
    overrides += [
        "actor_rollout_ref.actor.calculate_sum_pi_squared=True",
        "actor_rollout_ref.actor.policy_loss.loss_mode=cispo",
    ]
    run_ppo(load_config("ppo_trainer", overrides))

    (step,) = read_metrics(tmp_path)
    assert_finite(step)
    (b,) = seen
    mask = b["response_mask"].bool()
    pi = torch.exp(b["old_log_probs"][mask])
    # sum_v pi_v^2 holds the sampled token's pi^2 and is at most 1 (a real distribution, not zeros)
    assert (b["sum_pi_squared"][mask] >= pi**2 - 1e-5).all() and (b["sum_pi_squared"][mask] <= 1 + 1e-5).all()
    assert b["advantages"][mask].abs().sum() > 0


DICT_REWARD = '''
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    """Two components: the share of digits and a length bonus; the score is their sum."""
    s = solution_str or ""
    digits = sum(c.isdigit() for c in s) / max(len(s), 1)
    short = 1.0 / (1 + len(s))
    return {"score": digits + short, "digits": digits, "short": short}
'''


@pytest.mark.parametrize("manager", ["naive", "gdpo"])  # gdpo: veRL 0.9's GDPO example's reward manager
def test_inprocess_gdpo_reads_the_reward_components_with_geo_mean(
    tiny_model_dir, tiny_data_dir, tmp_path, monkeypatch, manager
):
    seen = []
    original = RayPPOTrainer._compute_advantage

    def recording(self, batch):
        original(self, batch)
        seen.append((batch.non_tensor_batch["digits"].copy(), batch.batch["advantages"].clone()))

    monkeypatch.setattr(RayPPOTrainer, "_compute_advantage", recording)
    reward = tmp_path / "dict_reward.py"
    reward.write_text(DICT_REWARD)
    overrides = base_overrides(
        tiny_model_dir, tiny_data_dir, tmp_path, estimator="gdpo", n=2, batch=4, steps=1, backend="inprocess"
    )
    overrides += [
        f"custom_reward_function.path={reward}",
        "+algorithm.gdpo_reward_keys=[digits,short]",
        "algorithm.gdpo_reward_weights=[1.0,0.5]",
        "actor_rollout_ref.actor.policy_loss.loss_mode=geo_mean",
        f"reward.reward_manager.name={manager}",
    ]
    run_ppo(load_config("ppo_trainer", overrides))

    (step,) = read_metrics(tmp_path)
    assert_finite(step)
    ((digits, advantages),) = seen
    assert step["gdpo/digits/mean"] == pytest.approx(float(np.mean(digits.astype(float))))
    assert {"gdpo/short/std", "gdpo/short/min", "gdpo/short/max"} <= set(step)
    assert advantages.abs().sum() > 0
