"""Critic loss and entropy bonus."""

from __future__ import annotations

import torch

from hybridflow.algorithms.loss_agg import agg_loss
from hybridflow.utils.torch_functional import clip_by_value, entropy_from_logits, masked_mean

__all__ = ["compute_value_loss", "compute_entropy_loss"]


def compute_value_loss(
    vpreds: torch.Tensor,
    returns: torch.Tensor,
    values: torch.Tensor,
    response_mask: torch.Tensor,
    cliprange_value: float,
    loss_agg_mode: str = "token-mean",
    dp_size: int = 1,
    batch_num_tokens=None,
    global_batch_size=None,
    loss_scale_factor=None,
    *,
    global_token_count=None,
    global_seq_count=None,
):
    """Clipped value loss: 0.5 * agg(max((V - R)^2, (clip(V, V_old +- cliprange_value) - R)^2)).

    ``vpreds`` are the critic's new predictions, ``values`` the ones recorded at rollout. Returns
    (vf_loss, vf_clipfrac), the fraction of tokens where the clipped error was the larger one.
    ``dp_size`` / ``batch_num_tokens`` / ``global_batch_size`` / ``loss_scale_factor`` go to
    ``agg_loss`` (veRL's signature; ``global_token_count`` / ``global_seq_count`` are aliases).
    """
    vpred_clipped = clip_by_value(vpreds, values - cliprange_value, values + cliprange_value)
    loss_unclipped = (vpreds - returns) ** 2
    loss_clipped = (vpred_clipped - returns) ** 2
    vf_losses = torch.maximum(loss_unclipped, loss_clipped)
    vf_loss = 0.5 * agg_loss(
        vf_losses,
        response_mask,
        loss_agg_mode,
        dp_size,
        batch_num_tokens,
        global_batch_size,
        loss_scale_factor,
        global_token_count=global_token_count,
        global_seq_count=global_seq_count,
    )
    vf_clipfrac = masked_mean(torch.gt(loss_clipped, loss_unclipped).float(), response_mask)
    return vf_loss, vf_clipfrac.detach()


def compute_entropy_loss(
    logits: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    *,
    global_token_count=None,
    global_seq_count=None,
    loss_scale_factor=None,
):
    """Aggregated entropy of ``logits`` (B, T, V) over the response tokens (a bonus: the actor
    subtracts ``entropy_coeff * this`` from its loss)."""
    entropy = entropy_from_logits(logits)  # (B, T)
    return agg_loss(
        entropy,
        response_mask,
        loss_agg_mode,
        global_token_count=global_token_count,
        global_seq_count=global_seq_count,
        loss_scale_factor=loss_scale_factor,
    )
