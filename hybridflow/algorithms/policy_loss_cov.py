"""Covariance-targeted policy losses: clip_cov and kl_cov (https://arxiv.org/abs/2505.22617).

Entropy collapses through the few tokens whose advantage and log-prob covary most. Both losses are
PPO-style ratio losses that treat a small share of those tokens differently: clip_cov drops the
gradient of a random few whose covariance lies in (clip_cov_lb, clip_cov_ub); kl_cov adds
``ppo_kl_coef * |log ratio|`` to the top ``kl_cov_ratio`` share by covariance. Keys come from
``actor.policy_loss`` (veRL 0.9.1's names and fallbacks); the signature is the registry's.
"""

from __future__ import annotations

from typing import Any

import torch

from hybridflow.algorithms.loss_agg import agg_loss
from hybridflow.algorithms.policy_loss import _agg_kwargs, _clip_range, register_policy_loss
from hybridflow.config.access import cfg_get
from hybridflow.utils.torch_functional import masked_mean

__all__ = ["compute_policy_loss_clip_cov", "compute_policy_loss_kl_cov", "token_covariance"]


def _policy_loss_key(config: Any, key: str, default: float) -> float:
    return cfg_get(cfg_get(config, "policy_loss"), key, default)


def token_covariance(advantages: torch.Tensor, log_prob: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """Per-token (A - mean A) * (log π - mean log π), means over the valid tokens; (B, T), no grad."""
    adv, lp = advantages.detach(), log_prob.detach()
    return (adv - masked_mean(adv, response_mask)) * (lp - masked_mean(lp, response_mask))


@register_policy_loss("clip_cov")
def compute_policy_loss_clip_cov(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any | None = None,
    rollout_is_weights: torch.Tensor | None = None,
):
    """Clipped PPO (no dual clip, no ratio clamp) where ``max(1, int(clip_cov_ratio * #valid))``
    tokens, drawn uniformly (``torch.randperm`` on the default generator) among the valid tokens that
    PPO did not clip and whose covariance lies strictly inside (clip_cov_lb, clip_cov_ub), get no
    loss and no gradient. ``actor/pg_clipfrac`` is the share of those dropped tokens."""
    cov_ratio = _policy_loss_key(config, "clip_cov_ratio", 0.0002)
    lb = _policy_loss_key(config, "clip_cov_lb", 1.0)
    ub = _policy_loss_key(config, "clip_cov_ub", 5.0)
    if not cov_ratio > 0:
        raise ValueError(f"actor.policy_loss.clip_cov_ratio must be > 0, got {cov_ratio}")
    low, high = _clip_range(config)

    log_ratio = log_prob - old_log_prob  # (B, T)
    ratio = torch.exp(log_ratio)
    loss_unclipped = -advantages * ratio
    loss_clipped = -advantages * torch.clamp(ratio, 1 - low, 1 + high)

    valid = response_mask > 0
    cov = token_covariance(advantages, log_prob, response_mask)
    candidates = valid & ~(loss_clipped > loss_unclipped) & (cov > lb) & (cov < ub)
    rows, cols = torch.nonzero(candidates, as_tuple=True)  # row-major order
    keep = torch.ones_like(advantages)
    if rows.numel() > 0:
        n_drop = max(int(cov_ratio * response_mask.sum().item()), 1)
        pick = torch.randperm(rows.numel())[:n_drop].to(rows.device)
        keep[rows[pick], cols[pick]] = 0

    pg_losses = torch.maximum(loss_unclipped, loss_clipped) * keep
    if rollout_is_weights is not None:
        pg_losses = pg_losses * rollout_is_weights
    pg_loss = agg_loss(pg_losses, response_mask, loss_agg_mode, **_agg_kwargs(config))
    return pg_loss, {
        "actor/pg_clipfrac": masked_mean((keep == 0).float(), response_mask).detach(),
        "actor/ppo_kl": masked_mean(-log_ratio, response_mask).detach(),
    }


@register_policy_loss("kl_cov")
def compute_policy_loss_kl_cov(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any | None = None,
    rollout_is_weights: torch.Tensor | None = None,
):
    """Unclipped policy gradient -A * ratio, plus ``ppo_kl_coef * |log ratio|`` on the
    ``max(1, int(kl_cov_ratio * #valid))`` valid tokens of largest covariance. ``actor/ppo_kl`` is
    the mean absolute log ratio here (as in veRL)."""
    cov_ratio = _policy_loss_key(config, "kl_cov_ratio", 0.0002)
    kl_coef = _policy_loss_key(config, "ppo_kl_coef", 1.0)
    if not cov_ratio > 0:
        raise ValueError(f"actor.policy_loss.kl_cov_ratio must be > 0, got {cov_ratio}")

    log_ratio = log_prob - old_log_prob  # (B, T)
    abs_kl = log_ratio.abs()
    pg_losses = -advantages * torch.exp(log_ratio)

    valid = response_mask > 0
    n_valid = int(valid.sum().item())
    if n_valid > 0:
        # covariance over the valid tokens only (their own means), largest first
        cov = token_covariance(advantages, log_prob, valid.to(log_prob.dtype))[valid]  # (N,)
        top = torch.topk(cov, max(1, int(n_valid * cov_ratio))).indices
        penalised = torch.zeros(n_valid, dtype=torch.bool, device=cov.device)
        penalised[top] = True
        penalty = torch.zeros_like(pg_losses, dtype=torch.bool)
        penalty[valid] = penalised
        pg_losses = torch.where(penalty, pg_losses + kl_coef * abs_kl, pg_losses)

    if rollout_is_weights is not None:
        pg_losses = pg_losses * rollout_is_weights
    pg_loss = agg_loss(pg_losses, response_mask, loss_agg_mode, **_agg_kwargs(config))
    return pg_loss, {"actor/ppo_kl": masked_mean(abs_kl, response_mask).detach()}
