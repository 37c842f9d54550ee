"""Start-up checks of the keys that only some policy losses and advantage estimators read.

Each loss/estimator raises on its own when called, but that is after the first rollout; here a missing
or contradictory key fails in the first second, named. Called by ``config_checks.validate_ppo_config``
with its report (``get(path)``, ``errors``, ``notes``).
"""

from __future__ import annotations

from typing import Any

__all__ = ["check_loss_and_estimator_keys", "SUM_PI_SQUARED_ESTIMATORS"]

A = "actor_rollout_ref.actor"
# estimators that read the actor's sum of squared token probabilities
SUM_PI_SQUARED_ESTIMATORS = ("optimal_token_baseline", "tir_optimal_token_baseline")


def _positive(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0


def check_loss_and_estimator_keys(r) -> None:
    loss_mode = r.get(f"{A}.policy_loss.loss_mode")
    if loss_mode == "dro" and not _positive(r.get(f"{A}.policy_loss.dro_beta")):
        r.errors.append(
            f"{A}.policy_loss.loss_mode=dro needs {A}.policy_loss.dro_beta > 0 (the weight of its "
            f"quadratic log-ratio penalty), got {r.get(f'{A}.policy_loss.dro_beta')!r}"
        )
    for mode, key in (("clip_cov", "clip_cov_ratio"), ("kl_cov", "kl_cov_ratio")):
        value = r.get(f"{A}.policy_loss.{key}")
        if loss_mode == mode and value is not None and not _positive(value):
            r.errors.append(f"{A}.policy_loss.{key} must be > 0 for loss_mode={mode}, got {value!r}")
    lb, ub = r.get(f"{A}.policy_loss.clip_cov_lb"), r.get(f"{A}.policy_loss.clip_cov_ub")
    if loss_mode == "clip_cov" and lb is not None and ub is not None and not lb < ub:
        r.errors.append(
            f"{A}.policy_loss.clip_cov_lb ({lb}) must be below clip_cov_ub ({ub}): no token could be dropped"
        )

    estimator = r.get("algorithm.adv_estimator")
    if estimator in SUM_PI_SQUARED_ESTIMATORS and not r.get(f"{A}.calculate_sum_pi_squared"):
        r.errors.append(
            f"algorithm.adv_estimator={estimator} needs the actor's sum of squared token "
            f"probabilities: set {A}.calculate_sum_pi_squared=True"
        )
    if estimator in SUM_PI_SQUARED_ESTIMATORS and (
        r.get("algorithm.rollout_correction.bypass_mode")
        or (r.get("async_training.mode") not in (None, "sync") and r.get("async_training.use_rollout_log_probs"))
    ):
        r.errors.append(
            f"algorithm.adv_estimator={estimator} needs the actor's old log-prob pass (it returns "
            "sum_pi_squared), which algorithm.rollout_correction.bypass_mode=True / "
            "async_training.use_rollout_log_probs=True skip"
        )
    if estimator == "gdpo":
        keys = r.get("algorithm.gdpo_reward_keys")
        weights = r.get("algorithm.gdpo_reward_weights")
        if not keys:
            r.errors.append(
                "algorithm.adv_estimator=gdpo needs algorithm.gdpo_reward_keys: the reward components "
                "your reward function returns in its dict, e.g. "
                "+algorithm.gdpo_reward_keys=[format_reward,accuracy_reward]"
            )
        elif weights is not None and len(weights) != len(keys):
            r.errors.append(
                f"algorithm.gdpo_reward_weights has {len(weights)} entries for {len(keys)} algorithm.gdpo_reward_keys"
            )
