"""GDPO (https://arxiv.org/abs/2601.05242): group reward-decoupled normalisation.

GRPO normalises the summed reward, so a component with a large spread (accuracy) drowns one with a
small spread (format). GDPO normalises each reward component within its group first (GRPO per
component), sums them with weights, then whitens the sum over the batch's valid tokens.

The components are the per-sample values the reward function returned besides ``score`` (veRL's
``reward_extra_info``, stored in ``non_tensor_batch``), named by ``algorithm.gdpo_reward_keys`` and
weighted by ``algorithm.gdpo_reward_weights`` (default: all 1).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from hybridflow.algorithms.advantage import AdvantageEstimator, compute_grpo_outcome_advantage, register_adv_est
from hybridflow.config.access import cfg_get
from hybridflow.utils.torch_functional import masked_whiten

__all__ = ["compute_gdpo_outcome_advantage", "gdpo_reward_components"]


def gdpo_reward_components(
    config: Any, non_tensor_batch: dict, dtype=torch.float32, device=None
) -> tuple[list[torch.Tensor], list[float]]:
    """([component scores (B,) per key], [weight per key]) from ``non_tensor_batch``; errors name
    the algorithm key or the missing column."""
    keys = cfg_get(config, "gdpo_reward_keys")
    if not keys:
        raise ValueError(
            "algorithm.adv_estimator=gdpo needs algorithm.gdpo_reward_keys: the reward components "
            "your reward function returns in its dict, e.g. ['format_reward', 'accuracy_reward']"
        )
    keys = list(keys)
    missing = [k for k in keys if k not in non_tensor_batch]
    if missing:
        raise ValueError(
            f"algorithm.gdpo_reward_keys {missing} not among the batch's per-sample fields "
            f"{sorted(non_tensor_batch)}; the reward function must return them in its dict"
        )
    weights = cfg_get(config, "gdpo_reward_weights")
    weights = [1.0] * len(keys) if weights is None else [float(w) for w in weights]
    if len(weights) != len(keys):
        raise ValueError(
            f"algorithm.gdpo_reward_weights has {len(weights)} entries for {len(keys)} algorithm.gdpo_reward_keys"
        )
    scores = [
        torch.as_tensor(np.asarray(non_tensor_batch[k], dtype=np.float64), dtype=dtype, device=device) for k in keys
    ]
    return scores, weights


@register_adv_est(AdvantageEstimator.GDPO)
def compute_gdpo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    epsilon: float = 1e-6,
    norm_adv_by_std_in_grpo: bool = True,
    config: Any | None = None,
    non_tensor_batch: dict | None = None,
    batch: Any | None = None,
    **kwargs,
):
    """whiten(sum_k w_k * GRPO(component_k)) over the valid tokens, per token; returns
    (advantages, advantages). With ``config`` and ``non_tensor_batch`` and ``batch`` (what the
    trainer passes, as veRL's) the components come from ``gdpo_reward_keys``; otherwise the one
    component is ``token_level_rewards`` (GRPO followed by batch whitening). ``batch`` is accepted
    for veRL's signature: only each component's per-sample value matters, not its token position."""
    with torch.no_grad():
        if config is not None and non_tensor_batch is not None and batch is not None:
            dtype = token_level_rewards.dtype
            scores, weights = gdpo_reward_components(config, non_tensor_batch, dtype, token_level_rewards.device)
            components = [s.unsqueeze(-1) for s in scores]  # (B, 1) each
        else:
            components, weights = [token_level_rewards], [1.0]
        total = torch.zeros_like(response_mask, dtype=token_level_rewards.dtype)
        for component, weight in zip(components, weights):
            # GRPO reads one scalar per row (the sum over the row), so a (B, 1) column serves
            adv, _ = compute_grpo_outcome_advantage(
                component, response_mask, index, epsilon, norm_adv_by_std_in_grpo, config=config
            )
            total = total + weight * adv
        advantages = masked_whiten(total, response_mask) * response_mask
    return advantages, advantages
