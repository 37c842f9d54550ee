"""Policy losses whose gradient flows through log π alone, scaled by a detached weight or mask:
cispo, dppo_tv, dppo_kl (per token -w * A * log π) and dro (-A * log π plus a quadratic penalty).

Clipping the ratio inside PPO's max() zeroes the gradient of clipped tokens; these losses keep every
token's gradient and bound its size instead (CISPO clips the weight; DPPO masks tokens whose
probability moved too far, measured in probability space rather than by the ratio). The signature is
the registry's; config keys follow veRL 0.9.1.
"""

from __future__ import annotations

from typing import Any

import torch

from hybridflow.algorithms.loss_agg import agg_loss
from hybridflow.algorithms.policy_loss import _agg_kwargs, _clip_range, _log_ratio, _metrics, register_policy_loss
from hybridflow.config.access import cfg_get
from hybridflow.utils.torch_functional import masked_mean

__all__ = [
    "compute_policy_loss_cispo",
    "compute_policy_loss_dppo_tv",
    "compute_policy_loss_dppo_kl",
    "compute_policy_loss_dro",
    "binary_kl",
]


def _weighted_log_prob_loss(weight, log_prob, advantages, response_mask, loss_agg_mode, config, rollout_is_weights):
    """agg(-sg[weight] * A * log π (* rollout IS weights))."""
    pg_losses = -weight.detach() * advantages * log_prob
    if rollout_is_weights is not None:
        pg_losses = pg_losses * rollout_is_weights
    return agg_loss(pg_losses, response_mask, loss_agg_mode, **_agg_kwargs(config))


@register_policy_loss("cispo")
def compute_policy_loss_cispo(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any | None = None,
    rollout_is_weights: torch.Tensor | None = None,
):
    """CISPO (https://arxiv.org/abs/2506.13585): -sg[clip(ratio, 1 - low, 1 + high)] * A * log π.
    ``actor/pg_clipfrac`` is the share of tokens whose ratio was clipped."""
    low, high = _clip_range(config)
    log_ratio = _log_ratio(log_prob, old_log_prob)  # (B, T)
    ratio = torch.exp(log_ratio)
    clipped = torch.clamp(ratio, 1 - low, 1 + high)
    pg_loss = _weighted_log_prob_loss(
        clipped, log_prob, advantages, response_mask, loss_agg_mode, config, rollout_is_weights
    )
    clipfrac = masked_mean((ratio != clipped).float(), response_mask)
    return pg_loss, _metrics(clipfrac, masked_mean(-log_ratio, response_mask), torch.zeros_like(clipfrac))


def binary_kl(old_log_prob: torch.Tensor, log_prob: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """KL(Bernoulli(p_old) || Bernoulli(p)) of the sampled token: the divergence restricted to
    "this token" vs "any other token"; eps keeps the second term finite when p or p_old is 1."""
    p_old, p = torch.exp(old_log_prob), torch.exp(log_prob)
    return p_old * (old_log_prob - log_prob) + (1 - p_old) * torch.log((1 - p_old + eps) / (1 - p + eps))


def _dppo(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config, rollout_is_weights, trust):
    """DPPO (https://arxiv.org/abs/2602.04879): -sg[min(ratio, c) * trusted] * A * log π, where
    ``trust(p_old, p, low, high)`` returns (trusted if A > 0, trusted if A <= 0). c is clip_ratio_c
    (20 when the config has none): a truncated IS weight in place of the dual clip."""
    low, high = _clip_range(config)  # divergence thresholds here, not ratio ranges
    c = cfg_get(config, "clip_ratio_c", 20.0)
    log_ratio = _log_ratio(log_prob, old_log_prob)  # (B, T)
    ratio = torch.exp(log_ratio)
    trusted_pos, trusted_neg = trust(old_log_prob.detach(), log_prob.detach(), low, high)
    trusted = torch.where(advantages > 0, trusted_pos, trusted_neg).float()
    weight = torch.clamp(ratio, max=c) * trusted
    pg_loss = _weighted_log_prob_loss(
        weight, log_prob, advantages, response_mask, loss_agg_mode, config, rollout_is_weights
    )
    return pg_loss, _metrics(
        masked_mean(1.0 - trusted, response_mask),
        masked_mean(-log_ratio, response_mask),
        masked_mean((ratio > c).float() * trusted, response_mask),
    )


@register_policy_loss("dppo_tv")
def compute_policy_loss_dppo_tv(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any | None = None,
    rollout_is_weights: torch.Tensor | None = None,
):
    """DPPO-Binary-TV: a token is trusted unless its probability rose by more than clip_ratio_high
    (A > 0) or fell by more than clip_ratio_low (A <= 0). ``actor/pg_clipfrac``: untrusted share;
    ``actor/pg_clipfrac_lower``: trusted tokens whose ratio exceeded clip_ratio_c."""

    def trust(old_lp, lp, low, high):
        moved = torch.exp(lp) - torch.exp(old_lp)
        return moved <= high, moved >= -low

    return _dppo(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config, rollout_is_weights, trust)


@register_policy_loss("dppo_kl")
def compute_policy_loss_dppo_kl(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any | None = None,
    rollout_is_weights: torch.Tensor | None = None,
):
    """DPPO-Binary-KL: a token is untrusted when its binary KL exceeds clip_ratio_high and its
    probability rose (A > 0), or exceeds clip_ratio_low and its probability fell (A <= 0): only a
    move in the direction the advantage pushes is limited. Metrics as dppo_tv."""

    def trust(old_lp, lp, low, high):
        kl = binary_kl(old_lp, lp)
        p_old, p = torch.exp(old_lp), torch.exp(lp)
        return (kl <= high) | (p <= p_old), (kl <= low) | (p >= p_old)

    return _dppo(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config, rollout_is_weights, trust)


@register_policy_loss("dro")
def compute_policy_loss_dro(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any | None = None,
    rollout_is_weights: torch.Tensor | None = None,
):
    """Direct Reward Optimization: -(A * log π - beta / 2 * (log π - log π_old)^2) with beta =
    ``actor.policy_loss.dro_beta`` (required, > 0): the square keeps the policy near π_old without a
    ratio. Reports ``actor/ppo_kl`` only."""
    beta = cfg_get(cfg_get(config, "policy_loss"), "dro_beta")
    if beta is None or not beta > 0:
        raise ValueError(
            f"actor_rollout_ref.actor.policy_loss.dro_beta must be a positive number for loss_mode=dro, got {beta}"
        )
    log_ratio = log_prob - old_log_prob  # (B, T)
    pg_losses = -(advantages * log_prob - 0.5 * beta * log_ratio.square())
    if rollout_is_weights is not None:
        pg_losses = pg_losses * rollout_is_weights
    pg_loss = agg_loss(pg_losses, response_mask, loss_agg_mode, **_agg_kwargs(config))
    return pg_loss, {"actor/ppo_kl": masked_mean(-log_ratio, response_mask).detach()}
