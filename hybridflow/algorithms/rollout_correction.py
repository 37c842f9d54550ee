"""Rollout correction: importance weights and rejection masks between the rollout engine's policy
and the trained one (veRL's ``algorithm.rollout_correction``).

Three policies meet in an off-policy step:

- π_rollout: the engine that sampled the tokens (``rollout_log_probs``; another dtype or kernels,
  or older weights when rollout and training overlap),
- π_old: the trainer's recomputation before the update (``old_log_probs``), the PPO anchor,
- π_θ: the policy being trained.

Decoupled mode (``bypass_mode=False``) is decoupled PPO: the PPO ratio clips π_θ/π_old (the proximal
policy) and each token's loss is weighted by the truncated behaviour ratio π_old/π_rollout, computed
once per batch on the driver. Bypass mode (``bypass_mode=True``) skips the recomputation: π_old is
π_rollout, and the weights and masks are computed per micro-batch from π_θ/π_rollout in the actor
(``compute_policy_loss_bypass_mode``).

Everything here is a pure function of tensors; metrics are 0-d tensors (veRL's names, without the
``rollout_corr/`` prefix that ``compute_rollout_correction`` adds).
"""

from __future__ import annotations

from typing import Any

import torch

from hybridflow.algorithms.policy_loss import compute_policy_loss_reinforce, compute_policy_loss_vanilla
from hybridflow.algorithms.rollout_correction_metrics import (
    SAFETY_BOUND,
    is_weight_metrics,
    offpolicy_metrics,
    rejection_option_metrics,
)
from hybridflow.config.rollout_correction import (
    IS_LEVELS,
    LOSS_TYPES,
    RS_OPTIONS,
    RejectionOption,
    RolloutCorrectionConfig,
    parse_is_threshold,
    parse_rejection_options,
)
from hybridflow.utils.torch_functional import masked_mean, masked_sum

__all__ = [
    "IS_LEVELS",
    "RS_OPTIONS",
    "LOSS_TYPES",
    "RejectionOption",
    "parse_is_threshold",
    "parse_rejection_options",
    "compute_is_weights",
    "compute_rejection_mask",
    "compute_rollout_correction",
    "compute_policy_loss_bypass_mode",
]


def compute_is_weights(
    log_ratio: torch.Tensor,
    response_mask: torch.Tensor,
    level: str,
    upper: float,
    lower: float | None = None,
    batch_normalize: bool = False,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Truncated importance weights from ``log_ratio`` = log π_train - log π_rollout, (B, T).

    token: w_t = exp(log_ratio_t); sequence: every token of row i gets exp(Σ_t log_ratio_t) (the
    product of its token ratios). Exponents are clamped to ±20. TIS (``lower`` None) truncates at
    ``upper``; IcePop zeroes the weights outside [lower, upper]. Padding gets weight 0. With
    ``batch_normalize`` the weights are divided by their mean (token mean, or the mean over valid
    sequences) after the metrics are taken. Returns detached weights (B, T) and metrics.
    """
    if level not in IS_LEVELS:
        raise ValueError(f"rollout_is level must be one of {IS_LEVELS}, got {level!r}")
    log_ratio = log_ratio.detach()
    if level == "token":
        log_ratio_for_metrics = log_ratio
        raw = torch.exp(log_ratio.clamp(-SAFETY_BOUND, SAFETY_BOUND))  # (B, T)
    else:
        log_ratio_for_metrics = masked_sum(log_ratio, response_mask, axis=-1).unsqueeze(-1)  # (B, 1)
        raw = torch.exp(log_ratio_for_metrics.clamp(-SAFETY_BOUND, SAFETY_BOUND)).expand_as(log_ratio)
    raw = raw * response_mask
    if lower is None:
        weights = raw.clamp(max=upper)
    else:
        weights = torch.where((raw >= lower) & (raw <= upper), raw, torch.zeros_like(raw))

    metrics = is_weight_metrics(weights, raw, log_ratio_for_metrics, response_mask, level, upper, lower)
    if batch_normalize:
        if level == "token":
            mean = masked_mean(weights, response_mask)
        else:
            seq_weights = masked_mean(weights, response_mask, axis=-1)  # (B,)
            valid = (response_mask.sum(-1) > 0).to(weights.dtype)
            mean = (seq_weights * valid).sum() / valid.sum().clamp(min=1e-8)
        usable = mean > 1e-8
        weights = torch.where(usable, weights / mean.clamp(min=1e-8), weights)
        metrics["rollout_is_batch_norm_factor"] = torch.where(usable, mean, torch.ones_like(mean))
    return weights, metrics


def _token_statistic(log_ratio: torch.Tensor, estimator: str) -> torch.Tensor:
    lr = log_ratio.clamp(-SAFETY_BOUND, SAFETY_BOUND)
    if estimator == "k1":
        return -lr
    if estimator == "k2":
        return 0.5 * lr**2
    return torch.exp(lr) - 1.0 - lr


def _sequence_statistic(token_stat: torch.Tensor, response_mask: torch.Tensor, aggregation: str) -> torch.Tensor:
    if aggregation == "sum":
        return masked_sum(token_stat, response_mask, axis=-1)
    if aggregation == "mean":
        return masked_mean(token_stat, response_mask, axis=-1)
    masked = token_stat.masked_fill(~response_mask.bool(), float("-inf"))
    best = masked.max(dim=-1).values
    return torch.where(torch.isinf(best), torch.zeros_like(best), best)  # an empty row: 0


def compute_rejection_mask(
    log_ratio: torch.Tensor, response_mask: torch.Tensor, options: tuple[RejectionOption, ...]
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Hard trust region: a token stays only if every option keeps it (sequence options keep or drop
    whole rows). k1 keeps lower <= statistic <= upper (log space); k2/k3 keep statistic <= upper.
    Returns ``response_mask`` with the rejected tokens set to 0, and metrics."""
    log_ratio = log_ratio.detach()
    mask_bool = response_mask.bool()
    valid_rows = response_mask.sum(dim=-1) > 0  # (B,)
    keep_all = torch.ones_like(log_ratio)
    metrics: dict[str, torch.Tensor] = {}
    for option in options:
        token_stat = _token_statistic(log_ratio, option.estimator)  # (B, T)
        if option.level == "token":
            stat, seq_stat = token_stat, None
        else:
            seq_stat = _sequence_statistic(token_stat, response_mask, option.aggregation)  # (B,)
            stat = seq_stat.unsqueeze(-1).expand_as(log_ratio)
        keep = stat <= option.upper
        if option.lower is not None:
            keep = keep & (stat >= option.lower)
        keep_f = keep.to(log_ratio.dtype)
        keep_all = keep_all * keep_f
        metrics.update(rejection_option_metrics(option, stat, seq_stat, response_mask, valid_rows))
        prefix = f"rollout_rs_{option.name}"
        metrics[f"{prefix}_masked_fraction"] = masked_mean(1.0 - keep_f, response_mask)
        row_rejected = (~keep & mask_bool).any(dim=-1) & valid_rows
        metrics[f"{prefix}_seq_masked_fraction"] = row_rejected.float().sum() / valid_rows.float().sum().clamp(min=1)
    metrics["rollout_rs_masked_fraction"] = masked_mean(1.0 - keep_all, response_mask)
    metrics["rollout_rs_seq_masked_fraction"] = ((keep_all < 0.5) & mask_bool).any(dim=-1).float().mean()
    return (response_mask * keep_all).to(response_mask.dtype), metrics


def compute_rollout_correction(
    train_log_prob: torch.Tensor,
    rollout_log_prob: torch.Tensor,
    response_mask: torch.Tensor,
    settings: RolloutCorrectionConfig,
) -> tuple[torch.Tensor | None, torch.Tensor, dict[str, torch.Tensor]]:
    """IS weights (None when ``settings.rollout_is`` is None), the response mask after rejection,
    and every metric under ``rollout_corr/`` (weights, rejection, off-policy gap).

    ``train_log_prob``: π_old in decoupled mode, π_θ (detached) in bypass mode. (B, T) each.
    """
    if train_log_prob.shape != rollout_log_prob.shape or train_log_prob.shape != response_mask.shape:
        raise ValueError(
            f"rollout correction: training log-probs {tuple(train_log_prob.shape)}, rollout log-probs "
            f"{tuple(rollout_log_prob.shape)} and response_mask {tuple(response_mask.shape)} differ in shape"
        )
    if not response_mask.any():
        raise ValueError("rollout correction: response_mask has no valid token in this batch")
    log_ratio = (train_log_prob - rollout_log_prob).detach()  # log(π_train / π_rollout)
    metrics: dict[str, torch.Tensor] = {}
    weights = None
    if settings.rollout_is is not None:
        upper, lower = settings.is_bounds
        weights, is_metrics = compute_is_weights(
            log_ratio, response_mask, settings.rollout_is, upper, lower, settings.rollout_is_batch_normalize
        )
        metrics.update(is_metrics)
    mask = response_mask
    if settings.rejection:
        mask, rs_metrics = compute_rejection_mask(log_ratio, response_mask, settings.rejection)
        metrics.update(rs_metrics)
    metrics.update(offpolicy_metrics(train_log_prob.detach(), rollout_log_prob.detach(), response_mask))
    return weights, mask, {f"rollout_corr/{k}": v for k, v in metrics.items()}


def compute_policy_loss_bypass_mode(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str,
    config: Any,
    settings: RolloutCorrectionConfig,
    *,
    global_token_count=None,
    global_seq_count=None,
):
    """The policy loss of bypass mode, where ``old_log_prob`` is π_rollout (never recomputed).

    Weights and rejection come from the current π_θ against π_rollout, per micro-batch, without
    gradient. ``ppo_clip``: clipped PPO on π_θ/π_rollout under the rejection mask, weights not applied
    (the ratio already is the importance ratio); ``reinforce``: -w·A·log π_θ under the mask. Rejected
    tokens leave the numerator only: the token and sequence counts are the caller's (veRL's choice).
    Returns (pg_loss, metrics): the loss's actor/* statistics and the rollout_corr/* metrics.
    """
    weights, mask, metrics = compute_rollout_correction(log_prob.detach(), old_log_prob, response_mask, settings)
    counts = dict(global_token_count=global_token_count, global_seq_count=global_seq_count)
    if settings.loss_type == "reinforce":
        pg_loss, loss_metrics = compute_policy_loss_reinforce(
            old_log_prob, log_prob, advantages, mask, loss_agg_mode, config, weights, **counts
        )
    else:
        pg_loss, loss_metrics = compute_policy_loss_vanilla(
            old_log_prob, log_prob, advantages, mask, loss_agg_mode, config, None, **counts
        )
    return pg_loss, {**loss_metrics, **metrics}
