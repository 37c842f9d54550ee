"""Diagnostics of rollout correction (veRL's metric names): how far the rollout engine's policy is
from the trained one, and what the importance weights and rejection criteria did.

All values are 0-d tensors (read back once per step by the caller). Masks are 0/1, (B, T).
"""

from __future__ import annotations

import math

import torch

from hybridflow.utils.torch_functional import masked_mean, masked_sum

__all__ = ["SAFETY_BOUND", "is_weight_metrics", "rejection_option_metrics", "offpolicy_metrics"]

# exp(±20) bounds every exponentiated log ratio: ~4.9e8 and ~2.1e-9
SAFETY_BOUND = 20.0


def _masked_extreme(values: torch.Tensor, mask: torch.Tensor, largest: bool) -> torch.Tensor:
    fill = float("-inf") if largest else float("inf")
    filled = values.masked_fill(~mask.bool(), fill)
    return filled.max() if largest else filled.min()


def _clamped_std(values: torch.Tensor, mask: torch.Tensor, low: float, high: float) -> torch.Tensor:
    """Population std of the masked values clamped to [low, high] (0 with fewer than 2 tokens)."""
    clamped = values.clamp(min=low, max=high)
    mean = masked_mean(clamped, mask)
    var = (masked_mean(clamped.square(), mask) - mean.square()).clamp(min=0.0)
    return torch.where(mask.sum() > 1, var.sqrt(), torch.zeros_like(var))


def _row_stats(prefix: str, rows: torch.Tensor, ideal: float) -> dict[str, torch.Tensor]:
    """mean / (unbiased) std / max / min / largest |value - ideal| of per-sequence values."""
    std = rows.std() if rows.numel() > 1 else torch.zeros((), dtype=rows.dtype)
    return {
        f"{prefix}_seq_mean": rows.mean(),
        f"{prefix}_seq_std": std,
        f"{prefix}_seq_max": rows.max(),
        f"{prefix}_seq_min": rows.min(),
        f"{prefix}_seq_max_deviation": (rows - ideal).abs().max(),
    }


def is_weight_metrics(
    weights: torch.Tensor,
    raw: torch.Tensor,
    log_ratio_for_metrics: torch.Tensor,
    response_mask: torch.Tensor,
    level: str,
    upper: float,
    lower: float | None,
) -> dict[str, torch.Tensor]:
    """``rollout_is_*``: mean/max/min of the applied weights, the share of raw ratios outside
    [lower, upper] (lower defaults to 1/upper), std and effective sample size of the weights
    clamped to [0, upper], and per-sequence statistics (mean weight of each row).

    Token level: max/min over tokens of the applied weights, fractions over tokens. Sequence level:
    max/min are exp of the largest/smallest (unclamped) log-ratio sum, fractions over rows.
    """
    lower_or_inverse = 1.0 / upper if lower is None else lower
    m: dict[str, torch.Tensor] = {"rollout_is_mean": masked_mean(weights, response_mask)}
    if level == "sequence":
        sums = log_ratio_for_metrics  # (B, 1)
        m["rollout_is_max"] = torch.exp(sums.max().clamp(max=SAFETY_BOUND))
        m["rollout_is_min"] = torch.exp(sums.min())
        m["rollout_is_ratio_fraction_high"] = (sums > math.log(upper)).float().mean()
        m["rollout_is_ratio_fraction_low"] = (sums < math.log(lower_or_inverse)).float().mean()
    else:
        m["rollout_is_ratio_fraction_high"] = masked_mean((raw > upper).float(), response_mask)
        m["rollout_is_ratio_fraction_low"] = masked_mean((raw < lower_or_inverse).float(), response_mask)
        m["rollout_is_max"] = _masked_extreme(weights, response_mask, largest=True)
        m["rollout_is_min"] = _masked_extreme(weights, response_mask, largest=False)
    m["rollout_is_std"] = _clamped_std(weights, response_mask, 0.0, upper)
    # effective sample size of the normalised weights: 1 / E[(w / E[w])²], 1 when all weights are equal
    bounded = weights.clamp(min=0.0, max=upper)
    normalised = bounded / (masked_mean(bounded, response_mask) + 1e-8)
    m["rollout_is_eff_sample_size"] = 1.0 / masked_mean(normalised.square(), response_mask)
    m.update(_row_stats("rollout_is", masked_mean(weights, response_mask, axis=-1), ideal=1.0))
    raw_rows = masked_mean(raw, response_mask, axis=-1)  # before truncation: a truncated mean never exceeds upper
    m["rollout_is_seq_fraction_high"] = (raw_rows > upper).float().mean()
    m["rollout_is_seq_fraction_low"] = (raw_rows < lower_or_inverse).float().mean()
    if lower is not None:  # IcePop: the share of tokens whose weight was zeroed
        m["rollout_is_oob_ratio"] = masked_mean(((raw < lower) | (raw > upper)).float(), response_mask)
    return m


def rejection_option_metrics(
    option, stat: torch.Tensor, seq_stat: torch.Tensor | None, response_mask: torch.Tensor, valid_rows: torch.Tensor
) -> dict[str, torch.Tensor]:
    """``rollout_rs_<option>_*`` of one rejection criterion. ``stat`` (B, T) is the statistic per
    token (a sequence option's value repeated over its row); ``seq_stat`` (B,) for sequence options.
    Thresholds are the option's own (log space for k1; a k2/k3 option has no lower bound, 0 used)."""
    prefix = f"rollout_rs_{option.name}"
    upper = option.upper
    lower = option.lower if option.lower is not None else 0.0
    rows = (seq_stat if seq_stat is not None else masked_mean(stat, response_mask, axis=-1))[valid_rows]
    m = {f"{prefix}_mean": masked_mean(stat, response_mask)}
    if option.level == "sequence":
        m[f"{prefix}_max"], m[f"{prefix}_min"] = rows.max(), rows.min()
        m[f"{prefix}_fraction_high"] = (rows > upper).float().mean()
        m[f"{prefix}_fraction_low"] = (
            (rows < lower).float().mean() if option.lower is not None else torch.zeros((), dtype=stat.dtype)
        )
    else:
        m[f"{prefix}_max"] = _masked_extreme(stat, response_mask, largest=True)
        m[f"{prefix}_min"] = _masked_extreme(stat, response_mask, largest=False)
        m[f"{prefix}_fraction_high"] = masked_mean((stat > upper).float(), response_mask)
        m[f"{prefix}_fraction_low"] = (
            masked_mean((stat < lower).float(), response_mask)
            if option.lower is not None
            else torch.zeros((), dtype=stat.dtype)
        )
    m[f"{prefix}_std"] = _clamped_std(stat, response_mask, lower, upper)
    m.update(_row_stats(prefix, rows, ideal=0.0))
    m[f"{prefix}_seq_fraction_high"] = (rows > upper).float().mean()
    if option.lower is not None:
        m[f"{prefix}_seq_fraction_low"] = (rows < lower).float().mean()
    return m


def offpolicy_metrics(
    train_log_prob: torch.Tensor, rollout_log_prob: torch.Tensor | None, response_mask: torch.Tensor
) -> dict[str, torch.Tensor]:
    """The gap between the training and the rollout policy on the sampled tokens.

    kl = E[log π_rollout - log π_train] (KL(π_rollout || π_train) estimated on rollout samples),
    k3_kl = E[r - 1 - log r], perplexities (batch mean of per-sequence exp(-mean log-prob)) and their
    log difference per sequence, χ² = E[r²] - 1 per token and E[(Π_t r_t)²] - 1 per sequence, with
    r = π_train / π_rollout. Without rollout log-probs only the training perplexity is known.
    """
    train_mean = masked_mean(train_log_prob, response_mask, axis=-1)  # (B,) mean log-prob per sequence
    metrics = {"training_ppl": torch.exp(-train_mean).mean(), "training_log_ppl": (-train_mean).mean()}
    if rollout_log_prob is None:
        return metrics
    rollout_mean = masked_mean(rollout_log_prob, response_mask, axis=-1)
    log_ratio = train_log_prob - rollout_log_prob  # (B, T)
    log_ppl_diff = rollout_mean - train_mean  # (B,) = log(training_ppl / rollout_ppl) per sequence
    ratio = torch.exp(log_ratio.clamp(-SAFETY_BOUND, SAFETY_BOUND))
    seq_log_ratio = masked_sum(log_ratio, response_mask, axis=-1).clamp(-SAFETY_BOUND, SAFETY_BOUND)
    return {
        **metrics,
        "kl": masked_mean(rollout_log_prob - train_log_prob, response_mask),
        "k3_kl": masked_mean(torch.exp(log_ratio) - log_ratio - 1, response_mask),
        "rollout_ppl": torch.exp(-rollout_mean).mean(),
        "rollout_log_ppl": (-rollout_mean).mean(),
        "log_ppl_diff": log_ppl_diff.mean(),
        "log_ppl_abs_diff": log_ppl_diff.abs().mean(),
        "log_ppl_diff_max": log_ppl_diff.max(),
        "log_ppl_diff_min": log_ppl_diff.min(),
        "ppl_ratio": torch.exp(log_ppl_diff).mean(),
        "chi2_token": masked_mean(ratio.square(), response_mask) - 1.0,
        "chi2_seq": torch.exp(2.0 * seq_log_ratio).mean() - 1.0,
    }
