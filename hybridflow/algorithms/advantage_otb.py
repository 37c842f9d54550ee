"""Optimal token baseline (OTB): a baseline per token position, shared by the responses of a prompt.

The variance of the policy gradient is smallest with the baseline b_t = E[G_t W_t] / E[W_t], where G_t
is the return-to-go and W_t = sum_{j<=t} ||score_j||^2 the path's accumulated squared score norm; for
a softmax policy ||score_j||^2 = 1 - 2 pi_j + sum_v pi_v^2 (pi_j: probability of the sampled token).
The expectation is taken over the responses of one prompt (``index``). The actor provides
``sum_pi_squared`` (``actor_rollout_ref.actor.calculate_sum_pi_squared=True``); the old log-probs give
pi_j. Rollout IS weights rho scale each w_j by rho^2.

``optimal_token_baseline`` aligns the responses by token column; ``tir_optimal_token_baseline``
(multi-turn, tool-integrated) by the k-th *model* token, skipping masked tool/user spans. For
right-padded single-turn responses the two are the same. veRL 0.9.1's names, inputs and behaviour
(a group of one gets no baseline; with ``handle_zero_tail`` the part of the single longest response
beyond the second longest gets baseline 0).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from hybridflow.algorithms.advantage import AdvantageEstimator, _group_ids, register_adv_est

__all__ = [
    "compute_optimal_token_baseline_advantage",
    "compute_multi_turn_optimal_token_baseline_advantage",
    "path_variance_weights",
]


def path_variance_weights(old_log_probs, sum_pi_squared, response_mask, rollout_is_weights=None) -> torch.Tensor:
    """W_t = cumulative sum over valid tokens of (1 - 2 pi_t + sum pi^2) (* rho_t^2); (B, T)."""
    if sum_pi_squared is None:
        raise ValueError(
            "the optimal token baseline needs the actor's sum of squared token probabilities: set "
            "actor_rollout_ref.actor.calculate_sum_pi_squared=True"
        )
    if old_log_probs is None:
        raise ValueError("the optimal token baseline needs old_log_probs (the actor's log-probs of the responses)")
    w = 1 - 2 * torch.exp(old_log_probs) + sum_pi_squared
    if rollout_is_weights is not None:
        w = w * rollout_is_weights**2
    return (w * response_mask).cumsum(dim=-1)


def _reverse_cumsum(x: torch.Tensor) -> torch.Tensor:
    return x.flip(-1).cumsum(-1).flip(-1)


def _group_baselines(returns, weights, lengths, member, index, handle_zero_tail, epsilon) -> torch.Tensor:
    """b (B, L) = sum_group(G W) / (sum_group(W) + eps) per position, for rows in ``member``; 0 for
    groups of one member, and (``handle_zero_tail``) 0 from the second-longest length on for the
    single longest member of a group. ``returns``/``weights`` are 0 where a row has no token."""
    g, n_groups = _group_ids(index, returns.device)
    member_f = member.to(returns.dtype)
    count = torch.zeros(n_groups, dtype=returns.dtype, device=returns.device).index_add_(0, g, member_f)[g]  # (B,)
    width = returns.shape[-1]
    num = returns.new_zeros(n_groups, width).index_add_(0, g, returns * weights * member_f.unsqueeze(-1))
    den = returns.new_zeros(n_groups, width).index_add_(0, g, weights * member_f.unsqueeze(-1)) + epsilon
    baselines = (num / den)[g]  # (B, L)
    has_baseline = member & (count > 1)
    baselines = torch.where(has_baseline.unsqueeze(-1), baselines, torch.zeros_like(baselines))
    if handle_zero_tail:
        length = torch.where(member, lengths, torch.full_like(lengths, -1))
        longest = torch.full((n_groups,), -1, dtype=lengths.dtype, device=lengths.device)
        longest = longest.scatter_reduce(0, g, length, reduce="amax")[g]
        at_max = member & (length == longest)
        n_at_max = torch.zeros(n_groups, dtype=torch.long, device=g.device).index_add_(0, g, at_max.long())[g]
        second = torch.full((n_groups,), -1, dtype=lengths.dtype, device=lengths.device)
        second = second.scatter_reduce(0, g, torch.where(at_max, torch.full_like(length, -1), length), reduce="amax")[g]
        sole = has_baseline & at_max & (n_at_max == 1)
        tail = torch.arange(width, device=returns.device).unsqueeze(0) >= second.unsqueeze(-1)  # (B, L)
        baselines = torch.where(sole.unsqueeze(-1) & tail, torch.zeros_like(baselines), baselines)
    return baselines


@register_adv_est(AdvantageEstimator.OPTIMAL_TOKEN_BASELINE)
def compute_optimal_token_baseline_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    old_log_probs: torch.Tensor | None = None,
    sum_pi_squared: torch.Tensor | None = None,
    rollout_is_weights: torch.Tensor | None = None,
    handle_zero_tail: bool = True,
    epsilon: float = 1e-8,
    config: Any | None = None,
    **kwargs,
):
    """OTB by token column: A_t = (G_t - b_t) on valid tokens, b_t over the group's rows at
    column t (rows without a token there add nothing). Returns (advantages, returns G)."""
    with torch.no_grad():
        mask = response_mask.to(token_level_rewards.dtype)
        returns = _reverse_cumsum(token_level_rewards * mask)  # (B, T)
        weights = path_variance_weights(old_log_probs, sum_pi_squared, mask, rollout_is_weights) * mask
        lengths = mask.sum(-1).long()  # (B,)
        member = torch.ones_like(lengths, dtype=torch.bool)  # every row counts towards its group
        baselines = _group_baselines(returns * mask, weights, lengths, member, index, handle_zero_tail, epsilon)
        advantages = (returns - baselines) * mask
    return advantages, returns


def _compact(x: torch.Tensor, valid: torch.Tensor, slot: torch.Tensor, width: int) -> torch.Tensor:
    """(B, T) -> (B, width): row i's valid entries moved to the left, in order; zeros after."""
    out = x.new_zeros(x.shape[0], width + 1)  # column ``width`` collects the invalid entries
    return out.scatter_(1, torch.where(valid, slot, torch.full_like(slot, width)), x)[:, :width]


@register_adv_est(AdvantageEstimator.TIR_OPTIMAL_TOKEN_BASELINE)
def compute_multi_turn_optimal_token_baseline_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    old_log_probs: torch.Tensor | None = None,
    sum_pi_squared: torch.Tensor | None = None,
    rollout_is_weights: torch.Tensor | None = None,
    handle_zero_tail: bool = True,
    epsilon: float = 1e-8,
    config: Any | None = None,
    **kwargs,
):
    """OTB by the k-th model token: each row's valid tokens are packed to the left, the baseline is
    taken per packed position over the group's rows, and the advantages go back to their columns.
    Rows without any valid token belong to no group. Returns (advantages, returns G)."""
    with torch.no_grad():
        mask = response_mask.to(token_level_rewards.dtype)
        valid = response_mask > 0
        returns = _reverse_cumsum(token_level_rewards * mask)  # (B, T)
        weights = path_variance_weights(old_log_probs, sum_pi_squared, mask, rollout_is_weights)
        lengths = valid.sum(-1)  # (B,)
        width = int(lengths.max().item()) if lengths.numel() else 0
        slot = valid.long().cumsum(-1) - 1  # (B, T): packed position of each valid token
        packed_returns = _compact(returns, valid, slot, width)  # (B, L)
        packed_weights = _compact(weights, valid, slot, width)
        baselines = _group_baselines(
            packed_returns, packed_weights, lengths, lengths > 0, index, handle_zero_tail, epsilon
        )
        packed_adv = packed_returns - baselines  # (B, L)
        advantages = torch.gather(packed_adv, 1, slot.clamp(min=0, max=max(width - 1, 0))) if width else returns * 0
        advantages = advantages * mask
    return advantages, returns
