"""veRL's ``verl.trainer.ppo.rollout_corr_helper``: its function names and signatures as thin adapters
over hybridflow's rollout correction (``hybridflow.algorithms.rollout_correction``, where the math
lives). The differences are veRL's calling convention: options as separate arguments, metrics as
plain floats (read back in one host sync), IS weights wrapped in a DataProto.
"""

from __future__ import annotations

import torch

from hybridflow.algorithms.rollout_correction import (
    RS_OPTIONS,
    compute_is_weights,
    compute_rejection_mask,
    compute_rollout_correction,
    parse_is_threshold,
    parse_rejection_options,
)
from hybridflow.algorithms.rollout_correction_metrics import SAFETY_BOUND, offpolicy_metrics
from hybridflow.config.convert import as_section
from hybridflow.config.rollout_correction import RolloutCorrectionConfig
from hybridflow.protocol import DataProto
from hybridflow.utils.metric import reduce_metrics

__all__ = [
    "SAFETY_BOUND",
    "SUPPORTED_ROLLOUT_RS_OPTIONS",
    "TOKEN_LEVEL_ROLLOUT_RS_OPTIONS",
    "compute_rollout_correction_and_rejection_mask",
    "compute_rollout_correction_weights",
    "compute_rollout_rejection_mask",
    "compute_offpolicy_metrics",
    "compute_rollout_corr_metrics_from_logprobs",
]

SUPPORTED_ROLLOUT_RS_OPTIONS: frozenset[str] = frozenset(RS_OPTIONS)
TOKEN_LEVEL_ROLLOUT_RS_OPTIONS: frozenset[str] = frozenset(o for o in RS_OPTIONS if o.startswith("token_"))


def _settings(rollout_is, rollout_is_threshold, rollout_is_batch_normalize, rollout_rs, rollout_rs_threshold):
    # veRL skips the weights when either the level or the threshold is None
    section = {
        "rollout_is": rollout_is if rollout_is_threshold is not None else None,
        "rollout_is_threshold": rollout_is_threshold,
        "rollout_is_batch_normalize": bool(rollout_is_batch_normalize),
        "rollout_rs": rollout_rs,
        "rollout_rs_threshold": rollout_rs_threshold,
    }
    return as_section(section, RolloutCorrectionConfig, "rollout_correction")  # veRL's door: plain options


def compute_rollout_correction_and_rejection_mask(
    old_log_prob: torch.Tensor,
    rollout_log_prob: torch.Tensor,
    response_mask: torch.Tensor,
    rollout_is: str | None = None,
    rollout_is_threshold: str | float | None = 2.0,
    rollout_is_batch_normalize: bool = False,
    rollout_rs: str | None = None,
    rollout_rs_threshold: str | float | None = None,
) -> tuple[DataProto | None, torch.Tensor, dict[str, float]]:
    """(DataProto holding ``rollout_is_weights`` or None, the response mask after rejection, the
    ``rollout_corr/*`` metrics as floats) for π_old = ``old_log_prob`` against π_rollout."""
    settings = _settings(rollout_is, rollout_is_threshold, rollout_is_batch_normalize, rollout_rs, rollout_rs_threshold)
    weights, mask, metrics = compute_rollout_correction(old_log_prob, rollout_log_prob, response_mask, settings)
    proto = None if weights is None else DataProto.from_dict(tensors={"rollout_is_weights": weights})
    return proto, mask, reduce_metrics(metrics)


def compute_rollout_correction_weights(
    log_ratio: torch.Tensor,
    response_mask: torch.Tensor,
    rollout_is: str = "token",
    rollout_is_threshold: str | float = 2.0,
    rollout_is_batch_normalize: bool = False,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Truncated (or IcePop) IS weights from log π_train - log π_rollout, and their metrics (no prefix)."""
    upper, lower = parse_is_threshold(rollout_is_threshold)
    weights, metrics = compute_is_weights(
        log_ratio, response_mask, rollout_is, upper, lower, rollout_is_batch_normalize
    )
    return weights, reduce_metrics(metrics)


def compute_rollout_rejection_mask(
    log_ratio: torch.Tensor,
    response_mask: torch.Tensor,
    rollout_rs: str = "token_k1",
    rollout_rs_threshold: str | float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The response mask with the tokens / sequences that fail any ``rollout_rs`` option zeroed, and metrics."""
    options = parse_rejection_options(rollout_rs, rollout_rs_threshold)
    mask, metrics = compute_rejection_mask(log_ratio, response_mask, options)
    return mask, reduce_metrics(metrics)


def compute_offpolicy_metrics(
    old_log_prob: torch.Tensor, rollout_log_prob: torch.Tensor | None, response_mask: torch.Tensor
) -> dict[str, float]:
    """KL, perplexities and χ² between π_old and π_rollout (only the training perplexity when
    ``rollout_log_prob`` is None), as floats without prefix."""
    if not response_mask.any():
        raise ValueError("compute_offpolicy_metrics: response_mask has no valid token")
    return reduce_metrics(offpolicy_metrics(old_log_prob, rollout_log_prob, response_mask))


def compute_rollout_corr_metrics_from_logprobs(
    log_prob: torch.Tensor, rollout_log_prob: torch.Tensor, response_mask: torch.Tensor
) -> dict[str, float]:
    """``compute_offpolicy_metrics`` for the current policy, under ``rollout_corr/``."""
    return {
        f"rollout_corr/{k}": v for k, v in compute_offpolicy_metrics(log_prob, rollout_log_prob, response_mask).items()
    }
