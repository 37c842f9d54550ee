"""Reducing a (batch, response_length) loss matrix to the scalar that is back-propagated.

Modes (veRL's names and meanings):

- ``token-mean``: every valid token of the batch weighs the same.
- ``seq-mean-token-sum``: sum over each sequence's tokens, then mean over sequences.
- ``seq-mean-token-mean``: mean over each sequence's tokens, then mean over sequences.
- ``seq-mean-token-sum-norm``: sum over all valid tokens divided by a constant (Dr. GRPO), by
  default ``loss_mask.shape[-1]``; pass ``loss_scale_factor`` to keep it fixed across batches.

Sequences without any valid token are left out of the sequence means (as veRL does today).

Distributed invariance (an extension to veRL's signature). A mini-batch is usually split into
micro-batches (gradient accumulation) and across data-parallel ranks. Pass the totals of the whole
mini-batch, summed over all micro-batches and ranks:

- ``global_token_count``: number of valid tokens (``loss_mask.sum()`` over the mini-batch),
- ``global_seq_count``: number of sequences with at least one valid token,

and each micro-batch loss becomes its share of the mini-batch loss, so that **summing** the
micro-batch losses (and summing, not averaging, over ranks: all-reduce SUM of gradients, or scale
by world size when the backend averages) gives exactly the full-batch loss and gradient, whatever
the split. ``seq-mean-token-sum-norm`` needs no count (it divides by a constant); keep
``loss_scale_factor`` fixed when micro-batches are padded to different lengths.
"""

from __future__ import annotations

from typing import Callable, Optional

import torch

from hybridflow.utils.registry import Registry
from hybridflow.utils.torch_functional import masked_sum

__all__ = ["LOSS_AGG_REGISTRY", "register_loss_agg_mode", "get_loss_agg_fn", "agg_loss", "global_counts"]

# fn(loss_mat, loss_mask, global_token_count, global_seq_count, loss_scale_factor) -> scalar
LossAggFn = Callable[..., torch.Tensor]
LOSS_AGG_REGISTRY: Registry[LossAggFn] = Registry("loss_agg_mode")


def register_loss_agg_mode(name: str):
    """Decorator adding a loss aggregation mode under ``name``."""
    return LOSS_AGG_REGISTRY.register(name)


def get_loss_agg_fn(name: str) -> LossAggFn:
    return LOSS_AGG_REGISTRY.get(name)


def _valid_seqs(loss_mask: torch.Tensor) -> torch.Tensor:
    return (loss_mask.sum(dim=-1) > 0).sum()


def global_counts(loss_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(token count, sequence count) of a mask, as ``agg_loss`` counts them; sum these over all
    micro-batches and ranks of a mini-batch to get ``global_token_count`` / ``global_seq_count``."""
    return loss_mask.sum(), _valid_seqs(loss_mask)


@register_loss_agg_mode("token-mean")
def _token_mean(loss_mat, loss_mask, global_token_count, global_seq_count, loss_scale_factor):
    count = loss_mask.sum().clamp(min=1) if global_token_count is None else global_token_count
    return masked_sum(loss_mat, loss_mask) / count


@register_loss_agg_mode("seq-mean-token-sum")
def _seq_mean_token_sum(loss_mat, loss_mask, global_token_count, global_seq_count, loss_scale_factor):
    seq_losses = masked_sum(loss_mat, loss_mask, axis=-1)  # (B,)
    count = _valid_seqs(loss_mask).clamp(min=1) if global_seq_count is None else global_seq_count
    return seq_losses.sum() / count


@register_loss_agg_mode("seq-mean-token-mean")
def _seq_mean_token_mean(loss_mat, loss_mask, global_token_count, global_seq_count, loss_scale_factor):
    tokens = loss_mask.sum(dim=-1)  # (B,)
    seq_losses = masked_sum(loss_mat, loss_mask, axis=-1) / tokens.clamp(min=1)  # (B,), 0 for empty rows
    count = _valid_seqs(loss_mask).clamp(min=1) if global_seq_count is None else global_seq_count
    return seq_losses.sum() / count


@register_loss_agg_mode("seq-mean-token-sum-norm")
def _seq_mean_token_sum_norm(loss_mat, loss_mask, global_token_count, global_seq_count, loss_scale_factor):
    scale = loss_mask.shape[-1] if loss_scale_factor is None else loss_scale_factor
    return masked_sum(loss_mat, loss_mask) / scale


def agg_loss(
    loss_mat: torch.Tensor,
    loss_mask: torch.Tensor,
    loss_agg_mode: str,
    *,
    global_token_count: Optional[int | torch.Tensor] = None,
    global_seq_count: Optional[int | torch.Tensor] = None,
    loss_scale_factor: Optional[float] = None,
) -> torch.Tensor:
    """Aggregate ``loss_mat`` (B, T) under ``loss_mask`` (B, T) into a scalar.

    Without the keyword-only counts this is veRL's ``agg_loss``; with them it returns this
    micro-batch's share of the global loss (see the module docstring).
    """
    fn = LOSS_AGG_REGISTRY.get(loss_agg_mode)
    return fn(loss_mat, loss_mask, global_token_count, global_seq_count, loss_scale_factor)
