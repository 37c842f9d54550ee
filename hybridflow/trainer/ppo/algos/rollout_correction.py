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

import math
from dataclasses import dataclass
from typing import Any, Optional

import torch

from hybridflow.trainer.ppo.algos.policy_loss import compute_policy_loss_reinforce, compute_policy_loss_vanilla
from hybridflow.trainer.ppo.algos.rollout_correction_metrics import (
    SAFETY_BOUND,
    is_weight_metrics,
    offpolicy_metrics,
    rejection_option_metrics,
)
from hybridflow.utils.config_section import cfg_get
from hybridflow.utils.torch_functional import masked_mean, masked_sum

__all__ = [
    "IS_LEVELS",
    "RS_OPTIONS",
    "LOSS_TYPES",
    "RejectionOption",
    "RolloutCorrectionSettings",
    "parse_is_threshold",
    "parse_rejection_options",
    "compute_is_weights",
    "compute_rejection_mask",
    "compute_rollout_correction",
    "compute_policy_loss_bypass_mode",
]

IS_LEVELS = ("token", "sequence")
LOSS_TYPES = ("ppo_clip", "reinforce")
# <aggregation>_<estimator>: token-level, or a sequence's sum / mean / max of the token statistic
RS_OPTIONS = ("token_k1", "token_k2", "token_k3", "seq_sum_k1", "seq_sum_k2", "seq_sum_k3",
              "seq_mean_k1", "seq_mean_k2", "seq_mean_k3", "seq_max_k2", "seq_max_k3")


def _positive(value: float, what: str) -> float:
    if not value > 0:
        raise ValueError(f"{what} must be positive, got {value}")
    return value


def _number(text: str, what: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise ValueError(f"{what}: {text!r} is not a number") from None


def parse_is_threshold(spec: Any, key: str = "rollout_is_threshold") -> tuple[float, Optional[float]]:
    """(upper, lower) of an IS threshold: a number (or numeric string) is the truncation bound of
    TIS (lower None); ``"lower_upper"`` is IcePop's band, weights outside it become 0."""
    if isinstance(spec, bool) or not isinstance(spec, (int, float, str)):
        raise ValueError(f"{key} must be a number or a 'lower_upper' string, got {spec!r}")
    if isinstance(spec, str) and "_" in spec:
        low_text, high_text = spec.strip().split("_", 1)
        lower, upper = _number(low_text, key), _number(high_text, key)
        _positive(lower, f"{key} lower bound")
        if lower > upper:
            raise ValueError(f"{key}={spec!r}: the lower bound exceeds the upper bound")
        return _positive(upper, f"{key} upper bound"), lower
    upper = _number(spec, key) if isinstance(spec, str) else float(spec)
    return _positive(upper, f"{key} upper bound"), None


@dataclass(frozen=True)
class RejectionOption:
    """One rejection criterion. ``estimator`` k1 = -log r, k2 = (log r)²/2, k3 = r - 1 - log r with
    r = π_train/π_rollout per token; ``aggregation`` token or the sequence's sum / mean / max.
    k1 bounds are stored in log space (the statistic is a log ratio); as the statistic is -log r, a
    k1 'lower_upper' pair bounds the inverse ratio π_rollout/π_train (veRL's convention; the usual
    symmetric [1/u, u] reads the same either way). k2/k3 have only ``upper``."""

    name: str
    aggregation: str  # token | sum | mean | max
    estimator: str  # k1 | k2 | k3
    upper: float
    lower: Optional[float] = None

    @property
    def level(self) -> str:
        return "token" if self.aggregation == "token" else "sequence"


def parse_rejection_options(rollout_rs: str, threshold_spec: Any, key: str = "rollout_rs") -> tuple[RejectionOption, ...]:
    """``rollout_rs`` ("token_k1,seq_mean_k3"; duplicates dropped) with ``rollout_rs_threshold``: one
    value shared by all options, or one per option (comma separated). k1 options take ratio bounds
    ``"lower_upper"`` (a single number u means [1/u, u]); k2/k3 a single positive upper bound."""
    if not isinstance(rollout_rs, str) or not rollout_rs.strip():
        raise ValueError(f"{key} must be a comma separated string of {', '.join(RS_OPTIONS)}, got {rollout_rs!r}")
    names = list(dict.fromkeys(o.strip() for o in rollout_rs.split(",") if o.strip()))
    for name in names:
        if name not in RS_OPTIONS:
            raise ValueError(f"{key}: unknown option {name!r}; known: {', '.join(RS_OPTIONS)}")
    tkey = f"{key}_threshold"
    if threshold_spec is None:
        raise ValueError(f"{key}={rollout_rs!r} needs {tkey} (rejection has no default bound)")
    if isinstance(threshold_spec, bool) or not isinstance(threshold_spec, (int, float, str)):
        raise ValueError(f"{tkey} must be a number or a string, got {threshold_spec!r}")
    specs = [str(threshold_spec)] if not isinstance(threshold_spec, str) else \
        [s.strip() for s in threshold_spec.split(",") if s.strip()]
    if len(specs) not in (1, len(names)):
        raise ValueError(f"{tkey}={threshold_spec!r}: give one threshold for all {len(names)} options of {key} "
                         f"or exactly one per option")
    specs = specs * len(names) if len(specs) == 1 else specs
    options = []
    for name, spec in zip(names, specs):
        aggregation = "token" if name.startswith("token") else name.split("_")[1]
        estimator = name.rsplit("_", 1)[1]
        what = f"{tkey} for {name}"
        if estimator == "k1":
            if "_" in spec:
                low_text, high_text = spec.split("_", 1)
                lower, upper = _number(low_text, what), _number(high_text, what)
            else:
                upper = _number(spec, what)
                lower = 1.0 / upper if upper > 0 else upper
            _positive(lower, f"{what} (lower)")
            _positive(upper, f"{what} (upper)")
            if lower > upper:
                raise ValueError(f"{what}={spec!r}: the lower bound exceeds the upper bound")
            options.append(RejectionOption(name, aggregation, estimator, math.log(upper), math.log(lower)))
        else:
            if "_" in spec:
                raise ValueError(f"{what} takes a single upper bound, not a 'lower_upper' pair: {spec!r}")
            options.append(RejectionOption(name, aggregation, estimator, _positive(_number(spec, what), what)))
    return tuple(options)


@dataclass(frozen=True)
class RolloutCorrectionSettings:
    """``algorithm.rollout_correction`` parsed and checked once (values, no config tree).

    ``rollout_is`` None: no weights (metrics only). ``is_lower`` set: IcePop (zero outside the band)
    instead of truncation. ``rejection``: empty when ``rollout_rs`` is null.
    """

    rollout_is: Optional[str] = None
    is_upper: float = 2.0
    is_lower: Optional[float] = None
    batch_normalize: bool = False
    rejection: tuple[RejectionOption, ...] = ()
    bypass_mode: bool = False
    loss_type: str = "ppo_clip"

    @classmethod
    def from_config(cls, section: Any, prefix: str = "algorithm.rollout_correction") -> "RolloutCorrectionSettings":
        """Raises ValueError naming the offending key."""
        if section is None:
            return cls()
        rollout_is = cfg_get(section, "rollout_is")
        if rollout_is is not None and rollout_is not in IS_LEVELS:
            raise ValueError(f"{prefix}.rollout_is={rollout_is!r} is not one of null, {', '.join(IS_LEVELS)}")
        threshold = cfg_get(section, "rollout_is_threshold", 2.0, keep_none=True)
        if threshold is None:
            if rollout_is is not None:
                raise ValueError(f"{prefix}.rollout_is={rollout_is} needs {prefix}.rollout_is_threshold "
                                 "(e.g. 2.0 for truncation, '0.5_5.0' for IcePop)")
            upper, lower = 2.0, None
        else:
            upper, lower = parse_is_threshold(threshold, f"{prefix}.rollout_is_threshold")
        rs = cfg_get(section, "rollout_rs")
        rejection = () if rs is None else parse_rejection_options(
            rs, cfg_get(section, "rollout_rs_threshold"), f"{prefix}.rollout_rs")
        loss_type = cfg_get(section, "loss_type", "ppo_clip")
        if loss_type not in LOSS_TYPES:
            raise ValueError(f"{prefix}.loss_type={loss_type!r} is not one of {', '.join(LOSS_TYPES)}")
        flags = {}
        for key in ("bypass_mode", "rollout_is_batch_normalize"):
            value = cfg_get(section, key, False)
            if not isinstance(value, bool):
                raise ValueError(f"{prefix}.{key} must be true or false, got {value!r}")
            flags[key] = value
        return cls(rollout_is=rollout_is, is_upper=upper, is_lower=lower,
                   batch_normalize=flags["rollout_is_batch_normalize"], rejection=rejection,
                   bypass_mode=flags["bypass_mode"], loss_type=loss_type)


def compute_is_weights(log_ratio: torch.Tensor, response_mask: torch.Tensor, level: str, upper: float,
                       lower: Optional[float] = None, batch_normalize: bool = False
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
        return 0.5 * lr ** 2
    return torch.exp(lr) - 1.0 - lr


def _sequence_statistic(token_stat: torch.Tensor, response_mask: torch.Tensor, aggregation: str) -> torch.Tensor:
    if aggregation == "sum":
        return masked_sum(token_stat, response_mask, axis=-1)
    if aggregation == "mean":
        return masked_mean(token_stat, response_mask, axis=-1)
    masked = token_stat.masked_fill(~response_mask.bool(), float("-inf"))
    best = masked.max(dim=-1).values
    return torch.where(torch.isinf(best), torch.zeros_like(best), best)  # an empty row: 0


def compute_rejection_mask(log_ratio: torch.Tensor, response_mask: torch.Tensor,
                           options: tuple[RejectionOption, ...]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
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


def compute_rollout_correction(train_log_prob: torch.Tensor, rollout_log_prob: torch.Tensor,
                               response_mask: torch.Tensor, settings: RolloutCorrectionSettings,
                               ) -> tuple[Optional[torch.Tensor], torch.Tensor, dict[str, torch.Tensor]]:
    """IS weights (None when ``settings.rollout_is`` is None), the response mask after rejection,
    and every metric under ``rollout_corr/`` (weights, rejection, off-policy gap).

    ``train_log_prob``: π_old in decoupled mode, π_θ (detached) in bypass mode. (B, T) each.
    """
    if train_log_prob.shape != rollout_log_prob.shape or train_log_prob.shape != response_mask.shape:
        raise ValueError(f"rollout correction: training log-probs {tuple(train_log_prob.shape)}, rollout log-probs "
                         f"{tuple(rollout_log_prob.shape)} and response_mask {tuple(response_mask.shape)} differ in shape")
    if not response_mask.any():
        raise ValueError("rollout correction: response_mask has no valid token in this batch")
    log_ratio = (train_log_prob - rollout_log_prob).detach()  # log(π_train / π_rollout)
    metrics: dict[str, torch.Tensor] = {}
    weights = None
    if settings.rollout_is is not None:
        weights, is_metrics = compute_is_weights(log_ratio, response_mask, settings.rollout_is, settings.is_upper,
                                                 settings.is_lower, settings.batch_normalize)
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
    settings: RolloutCorrectionSettings,
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
        pg_loss, loss_metrics = compute_policy_loss_reinforce(old_log_prob, log_prob, advantages, mask, loss_agg_mode,
                                                              config, weights, **counts)
    else:
        pg_loss, loss_metrics = compute_policy_loss_vanilla(old_log_prob, log_prob, advantages, mask, loss_agg_mode,
                                                            config, None, **counts)
    return pg_loss, {**loss_metrics, **metrics}
