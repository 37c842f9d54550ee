"""Policy losses that reshape the importance ratio instead of PPO's hard token clip: geo_mean (GMPO,
one geometric-mean ratio per sequence) and sapo (a smooth sigmoid gate per token).

The signature is the registry's; config keys follow veRL 0.9.1 (clip ranges; ``tau_pos``/``tau_neg``
on the actor section for sapo).
"""

from __future__ import annotations

from typing import Any

import torch

from hybridflow.algorithms.loss_agg import agg_loss
from hybridflow.algorithms.policy_loss import _agg_kwargs, _clip_range, _log_ratio, _metrics, register_policy_loss
from hybridflow.config.access import cfg_get
from hybridflow.utils.torch_functional import masked_mean

__all__ = ["compute_policy_loss_geo_mean", "compute_policy_loss_sapo", "sapo_gate"]


@register_policy_loss("geo_mean")
def compute_policy_loss_geo_mean(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any | None = None,
    rollout_is_weights: torch.Tensor | None = None,
):
    """GMPO (https://arxiv.org/abs/2507.20673): per sequence -Ā * exp(mean_t clip_t(log ratio)),
    where Ā is the mean advantage of the sequence and each token's log ratio is clipped to
    [-clip_ratio_low, clip_ratio_high] pessimistically (A > 0: min of clipped and raw; A < 0: max;
    A = 0: the token adds 0). A geometric mean is less sensitive to one outlier token than PPO's
    arithmetic one. ``loss_agg_mode`` is not used: the loss is the mean over sequences, as veRL's;
    given a ``global_batch_size`` (the actor's micro-batches) it is the sequence sum over that
    count times ``dp_size`` instead, so accumulated micro-batches give the full-batch gradient.
    ``rollout_is_weights`` enter as their per-sequence geometric mean."""
    low, high = _clip_range(config)
    log_ratio = log_prob - old_log_prob  # (B, T), no clamp (as veRL)
    clamped = torch.clamp(log_ratio, -low, high)
    pessimistic = torch.where(advantages > 0, torch.minimum(log_ratio, clamped), torch.maximum(log_ratio, clamped))
    pessimistic = torch.where(advantages == 0, torch.zeros_like(log_ratio), pessimistic)

    lengths = response_mask.sum(dim=-1) + 1e-8  # (B,)
    seq_ratio = torch.exp((pessimistic * response_mask).sum(dim=-1) / lengths)  # (B,)
    seq_adv = (advantages * response_mask).sum(dim=-1) / lengths  # (B,)
    seq_losses = -seq_adv * seq_ratio
    if rollout_is_weights is not None:
        seq_losses = seq_losses * torch.exp(
            (torch.log(rollout_is_weights + 1e-10) * response_mask).sum(dim=-1) / lengths
        )

    info = _agg_kwargs(config)
    if info.get("global_batch_size") is not None:
        pg_loss = seq_losses.sum() / info["global_batch_size"] * info.get("dp_size", 1)
    else:
        pg_loss = seq_losses.mean()

    clipped = (log_ratio != clamped).float()
    return pg_loss, _metrics(
        masked_mean(clipped * (advantages > 0), response_mask),
        masked_mean(-log_ratio, response_mask),
        masked_mean(clipped * (advantages < 0), response_mask),
    )


def sapo_gate(ratio: torch.Tensor, tau: torch.Tensor) -> torch.Tensor:
    """f(r) = 4 / tau * sigmoid(tau * (r - 1)): value 2 / tau and slope 1 at r = 1 (PPO's gradient
    near on-policy), flattening smoothly as r leaves 1 instead of dropping to 0 at a clip edge."""
    return torch.sigmoid(tau * (ratio - 1.0)) * (4.0 / tau)


@register_policy_loss("sapo")
def compute_policy_loss_sapo(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "seq-mean-token-mean",
    config: Any | None = None,
    rollout_is_weights: torch.Tensor | None = None,
):
    """SAPO (https://arxiv.org/abs/2511.20347): per token -sapo_gate(ratio, tau) * A with
    tau = actor.tau_pos where A > 0, else actor.tau_neg (a larger tau_neg damps negative updates
    sooner). Always aggregated as ``seq-mean-token-mean`` (veRL ignores loss_agg_mode here too).
    Reports ``actor/ppo_kl``; the clip fractions are 0 (nothing is clipped)."""
    tau_pos = torch.as_tensor(cfg_get(config, "tau_pos", 1.0), dtype=advantages.dtype, device=advantages.device)
    tau_neg = torch.as_tensor(cfg_get(config, "tau_neg", 1.05), dtype=advantages.dtype, device=advantages.device)
    log_ratio = _log_ratio(log_prob, old_log_prob)  # (B, T)
    tau = torch.where(advantages > 0, tau_pos, tau_neg)
    pg_losses = -sapo_gate(torch.exp(log_ratio), tau) * advantages
    if rollout_is_weights is not None:
        pg_losses = pg_losses * rollout_is_weights
    pg_loss = agg_loss(pg_losses, response_mask, "seq-mean-token-mean", **_agg_kwargs(config))
    zero = torch.zeros((), dtype=pg_loss.dtype, device=pg_loss.device)
    return pg_loss, _metrics(zero, masked_mean(-log_ratio, response_mask), zero)
