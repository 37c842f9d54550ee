"""Advantage estimators: (rewards, masks, ...) -> (advantages, returns), both (B, T).

Each estimator is registered by name (``@register_adv_est("name")``) and looked up with
``get_adv_estimator_fn(name)``. Argument names and order follow veRL. Every estimator accepts
``config=`` (the ``algorithm`` section, an object or a mapping); keys it holds (``gamma``, ``lam``,
``norm_adv_by_std_in_grpo``) take precedence over the plain arguments, as in veRL where the config
supplies them. Extra keyword arguments are ignored, so a driver may pass one superset of inputs.

Outcome estimators (grpo, rloo, ...) read one scalar per response, ``token_level_rewards.sum(-1)``,
and group responses by ``index`` (a numpy array of uids, one per row: the samples of one prompt).
gdpo (``advantage_gdpo.py``) and the optimal token baselines (``advantage_otb.py``) live beside it.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import Enum
from typing import Any

import numpy as np
import torch

from hybridflow.config.access import cfg_get
from hybridflow.utils.registry import Registry
from hybridflow.utils.torch_functional import masked_whiten

__all__ = [
    "AdvantageEstimator",
    "ADV_ESTIMATOR_REGISTRY",
    "register_adv_est",
    "get_adv_estimator_fn",
    "compute_gae_advantage_return",
    "compute_grpo_outcome_advantage",
    "compute_grpo_vectorized_outcome_advantage",
    "compute_grpo_passk_outcome_advantage",
    "compute_rloo_outcome_advantage",
    "compute_rloo_vectorized_outcome_advantage",
    "compute_opo_outcome_advantage",
    "compute_gpg_outcome_advantage",
    "compute_reinforce_plus_plus_outcome_advantage",
    "compute_reinforce_plus_plus_baseline_outcome_advantage",
    "compute_remax_outcome_advantage",
]


class AdvantageEstimator(str, Enum):
    """Names of the built-in estimators (veRL's values). Plain strings work everywhere too."""

    GAE = "gae"
    GRPO = "grpo"
    REINFORCE_PLUS_PLUS = "reinforce_plus_plus"
    REINFORCE_PLUS_PLUS_BASELINE = "reinforce_plus_plus_baseline"
    REMAX = "remax"
    RLOO = "rloo"
    OPO = "opo"
    GRPO_PASSK = "grpo_passk"
    GPG = "gpg"
    RLOO_VECTORIZED = "rloo_vectorized"
    GRPO_VECTORIZED = "grpo_vectorized"
    OPTIMAL_TOKEN_BASELINE = "optimal_token_baseline"  # advantage_otb.py
    TIR_OPTIMAL_TOKEN_BASELINE = "tir_optimal_token_baseline"  # advantage_otb.py
    GDPO = "gdpo"  # advantage_gdpo.py


AdvEstimatorFn = Callable[..., tuple[torch.Tensor, torch.Tensor]]
ADV_ESTIMATOR_REGISTRY: Registry[AdvEstimatorFn] = Registry(
    "Adv estimator", unknown="Unknown advantage estimator simply: {name}"
)


def _name(name_or_enum) -> str:
    return name_or_enum.value if isinstance(name_or_enum, Enum) else name_or_enum


def register_adv_est(name_or_enum: str | AdvantageEstimator):
    """Decorator registering an advantage estimator; a name already taken is an error."""
    return ADV_ESTIMATOR_REGISTRY.register(_name(name_or_enum))


def get_adv_estimator_fn(name_or_enum: str | AdvantageEstimator) -> AdvEstimatorFn:
    """The estimator registered under ``name_or_enum``; unknown names list the known ones."""
    return ADV_ESTIMATOR_REGISTRY[_name(name_or_enum)]


# ----------------------------------------------------------------------------- grouping helpers


def _group_ids(index, device) -> tuple[torch.Tensor, int]:
    """Map each row's uid to a dense group id 0..G-1 (in order of first appearance)."""
    keys = index.tolist() if hasattr(index, "tolist") else list(index)
    ids: dict[Any, int] = {}
    dense = [ids.setdefault(k, len(ids)) for k in keys]
    return torch.tensor(dense, dtype=torch.long, device=device), len(ids)


def _group_sum(x: torch.Tensor, g: torch.Tensor, n_groups: int) -> torch.Tensor:
    return torch.zeros(n_groups, dtype=x.dtype, device=x.device).index_add_(0, g, x)


def _group_stats(scores: torch.Tensor, g: torch.Tensor, n_groups: int):
    """Per-row (group size, group mean, unbiased group std). Groups of one get mean 0, std 1 (veRL)."""
    count = _group_sum(torch.ones_like(scores), g, n_groups)  # (G,)
    mean = _group_sum(scores, g, n_groups) / count
    sq_dev = _group_sum((scores - mean[g]) ** 2, g, n_groups)
    std = torch.sqrt(sq_dev / (count - 1).clamp(min=1))
    single = count == 1
    mean = torch.where(single, torch.zeros_like(mean), mean)
    std = torch.where(single, torch.ones_like(std), std)
    return count[g], mean[g], std[g]


# ----------------------------------------------------------------------------- estimators


@register_adv_est(AdvantageEstimator.GAE)
def compute_gae_advantage_return(
    token_level_rewards: torch.Tensor,
    values: torch.Tensor,
    response_mask: torch.Tensor,
    gamma: float = 1.0,
    lam: float = 1.0,
    config: Any | None = None,
    **kwargs,
):
    """Generalised Advantage Estimation (https://arxiv.org/abs/1506.02438) over response tokens.

    delta_t = r_t + gamma * V_{t+1} - V_t,  A_t = delta_t + gamma * lam * A_{t+1}, with V and A after
    the last valid token taken as 0. Masked positions are skipped: the recursion carries over them
    (multi-turn responses with tool output in between). returns = A + V (before whitening); the
    advantages are then whitened over the valid tokens.
    """
    gamma = cfg_get(config, "gamma", gamma)
    lam = cfg_get(config, "lam", lam)
    with torch.no_grad():
        mask = response_mask.to(values.dtype)
        next_value = torch.zeros_like(values[:, 0])  # (B,)
        last_gae = torch.zeros_like(values[:, 0])  # (B,)
        advantages = torch.zeros_like(values)  # (B, T)
        for t in reversed(range(values.shape[-1])):
            delta = token_level_rewards[:, t] + gamma * next_value - values[:, t]
            gae_t = delta + gamma * lam * last_gae
            m = mask[:, t]
            next_value = m * values[:, t] + (1 - m) * next_value
            last_gae = m * gae_t + (1 - m) * last_gae
            advantages[:, t] = last_gae
        returns = advantages + values
        advantages = masked_whiten(advantages, response_mask)
    return advantages, returns


@register_adv_est(AdvantageEstimator.GRPO)
def compute_grpo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    epsilon: float = 1e-6,
    norm_adv_by_std_in_grpo: bool = True,
    config: Any | None = None,
    **kwargs,
):
    """GRPO: (score - group mean) / (group std + eps), std unbiased like ``torch.std``.

    With ``norm_adv_by_std_in_grpo=False`` only the mean is removed (Dr. GRPO,
    https://arxiv.org/abs/2503.20783). A group of one gets mean 0, std 1. Vectorised: one pass
    of scatter-adds, no Python loop over rows.
    """
    norm_by_std = cfg_get(config, "norm_adv_by_std_in_grpo", norm_adv_by_std_in_grpo)
    with torch.no_grad():
        scores = token_level_rewards.sum(dim=-1)  # (B,)
        g, n_groups = _group_ids(index, scores.device)
        _, mean, std = _group_stats(scores, g, n_groups)
        scores = (scores - mean) / (std + epsilon) if norm_by_std else scores - mean
        advantages = scores.unsqueeze(-1) * response_mask
    return advantages, advantages


@register_adv_est(AdvantageEstimator.GRPO_VECTORIZED)
def compute_grpo_vectorized_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    epsilon: float = 1e-6,
    norm_adv_by_std_in_grpo: bool = True,
    config: Any | None = None,
    **kwargs,
):
    """veRL's ``grpo_vectorized`` name. Our ``grpo`` is already vectorised, so the two are the same
    computation (and give the same numbers as veRL's per-row loop)."""
    return compute_grpo_outcome_advantage(
        token_level_rewards, response_mask, index, epsilon, norm_adv_by_std_in_grpo, config=config
    )


@register_adv_est(AdvantageEstimator.GRPO_PASSK)
def compute_grpo_passk_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    epsilon: float = 1e-6,
    norm_adv_by_std_in_grpo: bool = True,
    config: Any | None = None,
    **kwargs,
):
    """Pass@k (https://arxiv.org/abs/2503.19595): only the best response of each group gets an
    advantage, best minus second best (divided by the group std when normalising). Groups need >= 2."""
    norm_by_std = cfg_get(config, "norm_adv_by_std_in_grpo", norm_adv_by_std_in_grpo)
    with torch.no_grad():
        scores = token_level_rewards.sum(dim=-1)  # (B,)
        g, n_groups = _group_ids(index, scores.device)
        count, _, std = _group_stats(scores, g, n_groups)
        if bool((count < 2).any()):
            raise ValueError("grpo_passk needs at least 2 samples per group (index)")
        # Rank rows within their group: sort by (group, score descending).
        order = torch.argsort(scores, descending=True, stable=True)
        order = order[torch.argsort(g[order], stable=True)]
        starts = torch.cumsum(_group_sum(torch.ones_like(scores), g, n_groups), 0).long()
        starts = torch.cat([starts.new_zeros(1), starts[:-1]])  # first sorted position of each group
        best, second = order[starts], order[starts + 1]
        gap = scores[best] - scores[second]
        if norm_by_std:
            gap = gap / (std[best] + epsilon)
        scalar = torch.zeros_like(scores)
        scalar[best] = gap
        advantages = scalar.unsqueeze(-1) * response_mask
    return advantages, advantages


@register_adv_est(AdvantageEstimator.RLOO)
def compute_rloo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    epsilon: float = 1e-6,
    config: Any | None = None,
    **kwargs,
):
    """RLOO (https://arxiv.org/abs/2402.14740): score minus the mean of the *other* responses of its
    group, (n * s_i - sum_group) / (n - 1). A group of one keeps its raw score (as veRL's rloo)."""
    with torch.no_grad():
        scores = token_level_rewards.sum(dim=-1)  # (B,)
        g, n_groups = _group_ids(index, scores.device)
        count = _group_sum(torch.ones_like(scores), g, n_groups)[g]
        total = _group_sum(scores, g, n_groups)[g]
        loo = (count * scores - total) / (count - 1).clamp(min=1)
        scores = torch.where(count > 1, loo, scores)
        advantages = scores.unsqueeze(-1) * response_mask
    return advantages, advantages


@register_adv_est(AdvantageEstimator.RLOO_VECTORIZED)
def compute_rloo_vectorized_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    epsilon: float = 1e-6,
    config: Any | None = None,
    **kwargs,
):
    """veRL's ``rloo_vectorized``: the same leave-one-out advantage as ``rloo`` for groups of two or
    more, but a group of one gets 0 (there is no other response to compare with), where ``rloo``
    keeps the raw score. Both follow veRL 0.9.1."""
    with torch.no_grad():
        scores = token_level_rewards.sum(dim=-1)  # (B,)
        g, n_groups = _group_ids(index, scores.device)
        count = _group_sum(torch.ones_like(scores), g, n_groups)[g]
        total = _group_sum(scores, g, n_groups)[g]
        loo = (count * scores - total) / (count - 1).clamp(min=1) * (count > 1)
        advantages = loo.unsqueeze(-1) * response_mask
    return advantages, advantages


@register_adv_est(AdvantageEstimator.OPO)
def compute_opo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    epsilon: float = 1e-6,
    config: Any | None = None,
    **kwargs,
):
    """OPO (https://arxiv.org/abs/2505.23585): baseline = length-weighted mean score of the group
    (sum len_i * s_i / sum len_i); a group of one has baseline 0."""
    with torch.no_grad():
        scores = token_level_rewards.sum(dim=-1)  # (B,)
        lengths = response_mask.sum(dim=-1).to(scores.dtype)  # (B,)
        g, n_groups = _group_ids(index, scores.device)
        count = _group_sum(torch.ones_like(scores), g, n_groups)[g]
        baseline = (_group_sum(lengths * scores, g, n_groups) / _group_sum(lengths, g, n_groups).clamp(min=1))[g]
        baseline = torch.where(count > 1, baseline, torch.zeros_like(baseline))
        advantages = (scores - baseline).unsqueeze(-1) * response_mask
    return advantages, advantages


@register_adv_est(AdvantageEstimator.GPG)
def compute_gpg_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    epsilon: float = 1e-6,
    f_norm: float = 1.0,
    alpha: float = 1.0,
    config: Any | None = None,
    **kwargs,
):
    """GPG (https://arxiv.org/abs/2504.02546): alpha * (score - group mean) / f_norm with
    alpha = batch size / number of non-zero scores (the given ``alpha`` is replaced, as in veRL)."""
    with torch.no_grad():
        scores = token_level_rewards.sum(dim=-1)  # (B,)
        alpha = scores.shape[0] / torch.count_nonzero(scores).clamp(min=1)
        g, n_groups = _group_ids(index, scores.device)
        _, mean, _ = _group_stats(scores, g, n_groups)
        advantages = (alpha * (scores - mean) / f_norm).unsqueeze(-1) * response_mask
    return advantages, advantages


def _discounted_returns(rewards: torch.Tensor, response_mask: torch.Tensor, gamma: float) -> torch.Tensor:
    """G_t = r_t + gamma * G_{t+1} over the valid tokens; masked positions (tool output between two
    model turns, padding) get 0 and pass the running return through unchanged (veRL 0.9.1)."""
    returns = torch.zeros_like(rewards)
    running = torch.zeros_like(rewards[:, 0])  # (B,)
    for t in reversed(range(rewards.shape[-1])):
        m = response_mask[:, t].to(rewards.dtype)
        candidate = rewards[:, t] + gamma * running
        returns[:, t] = candidate * m
        running = candidate * m + running * (1 - m)
    return returns


@register_adv_est(AdvantageEstimator.REINFORCE_PLUS_PLUS)
def compute_reinforce_plus_plus_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    gamma: float = 1.0,
    config: Any | None = None,
    **kwargs,
):
    """REINFORCE++ (https://arxiv.org/abs/2501.03262): discounted return-to-go over the valid tokens
    (masked spans are skipped, not restarted), whitened over the batch's valid tokens to give the
    advantage. Returns (advantages, returns)."""
    if config is None and not isinstance(gamma, (int, float, torch.Tensor)):
        config, gamma = gamma, 1.0  # newer veRL's positional order: (rewards, mask, config)
    gamma = cfg_get(config, "gamma", gamma)
    with torch.no_grad():
        returns = _discounted_returns(token_level_rewards, response_mask, gamma)
        advantages = masked_whiten(returns, response_mask) * response_mask
    return advantages, returns


@register_adv_est(AdvantageEstimator.REINFORCE_PLUS_PLUS_BASELINE)
def compute_reinforce_plus_plus_baseline_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    epsilon: float = 1e-6,
    config: Any | None = None,
    **kwargs,
):
    """REINFORCE++-baseline: score minus group mean (0 for a group of one), broadcast to the
    response tokens, then whitened over the batch's valid tokens."""
    with torch.no_grad():
        scores = token_level_rewards.sum(dim=-1)  # (B,)
        g, n_groups = _group_ids(index, scores.device)
        _, mean, _ = _group_stats(scores, g, n_groups)
        advantages = (scores - mean).unsqueeze(-1) * response_mask  # (B, T)
        advantages = masked_whiten(advantages, response_mask) * response_mask
    return advantages, advantages


@register_adv_est(AdvantageEstimator.REMAX)
def compute_remax_outcome_advantage(
    token_level_rewards: torch.Tensor,
    reward_baselines: torch.Tensor,
    response_mask: torch.Tensor,
    config: Any | None = None,
    **kwargs,
):
    """ReMax (https://arxiv.org/abs/2310.10505): undiscounted return-to-go minus the reward of the
    greedy response (``reward_baselines`` (B,)) on every valid token."""
    with torch.no_grad():
        returns = (token_level_rewards * response_mask).flip(-1).cumsum(-1).flip(-1)  # (B, T)
        advantages = returns - reward_baselines.unsqueeze(-1) * response_mask
    return advantages, returns
