"""Reducing a (batch, response_length) loss matrix to the scalar that is back-propagated.

Modes (veRL 0.9.1's names and meanings):

- ``token-mean``: every valid token of the batch weighs the same.
- ``token-sum``: the plain sum over valid tokens.
- ``seq-mean-token-sum``: sum over each sequence's tokens, then mean over sequences.
- ``seq-mean-token-mean``: mean over each sequence's tokens, then mean over sequences.
- ``seq-mean-token-sum-norm`` (Dr. GRPO): ``seq-mean-token-sum`` divided by a constant, by default
  the horizon ``loss_mask.shape[-1]``; pass ``loss_scale_factor`` to keep it fixed across batches.

Sequences without any valid token are left out of the sequence means (as veRL does). An all-masked
batch gives 0 (veRL divides 0 by 0 and returns NaN there; a NaN loss would poison the weights).

Global-batch normalisation (veRL's signature). A mini-batch is split into micro-batches (gradient
accumulation) and across data-parallel ranks. Pass the totals of the whole mini-batch, summed over
all micro-batches and ranks:

- ``batch_num_tokens``: number of valid tokens (``loss_mask.sum()`` over the mini-batch),
- ``global_batch_size``: number of sequences with at least one valid token,
- ``dp_size``: the number of data-parallel ranks,

and each micro-batch loss becomes its share of the mini-batch loss times ``dp_size``: summing the
micro-batch losses on each rank and *averaging* gradients over ranks (what DDP/FSDP do) gives
exactly the full-batch gradient, whatever the split. ``global_token_count`` / ``global_seq_count``
are keyword-only aliases of ``batch_num_tokens`` / ``global_batch_size`` (earlier hybridflow names).
``seq-mean-token-sum-norm`` also needs a fixed ``loss_scale_factor`` when micro-batches are padded
to different lengths.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from hybridflow.config.actor import LOSS_AGG_MODES
from hybridflow.utils.registry import Registry
from hybridflow.utils.torch_functional import masked_sum

__all__ = ["LOSS_AGG_REGISTRY", "register_loss_agg_mode", "get_loss_agg_fn", "agg_loss", "global_counts"]

# Modes whose result depends on the global token count / sequence count (dp_size > 1 needs them).
_NEEDS_TOKENS = {"token-mean"}
_NEEDS_SEQS = {"seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"}

# fn(loss_mat, loss_mask, global_token_count, global_seq_count, loss_scale_factor) -> scalar
LossAggFn = Callable[..., torch.Tensor]
LOSS_AGG_REGISTRY: Registry[LossAggFn] = Registry("loss_agg_mode")


def register_loss_agg_mode(name: str):
    """Decorator adding a loss aggregation mode under ``name`` (an actor config may then name it)."""
    LOSS_AGG_MODES.add(name)
    return LOSS_AGG_REGISTRY.register(name)


def get_loss_agg_fn(name: str) -> LossAggFn:
    return LOSS_AGG_REGISTRY[name]


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


@register_loss_agg_mode("token-sum")
def _token_sum(loss_mat, loss_mask, global_token_count, global_seq_count, loss_scale_factor):
    return masked_sum(loss_mat, loss_mask)


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
    # veRL 0.9.1: the per-sequence token sums, their mean over sequences, then / the horizon.
    scale = loss_mask.shape[-1] if loss_scale_factor is None else loss_scale_factor
    return _seq_mean_token_sum(loss_mat, loss_mask, global_token_count, global_seq_count, None) / scale


def agg_loss(
    loss_mat: torch.Tensor,
    loss_mask: torch.Tensor,
    loss_agg_mode: str,
    dp_size: int = 1,
    batch_num_tokens: int | torch.Tensor | None = None,
    global_batch_size: int | torch.Tensor | None = None,
    loss_scale_factor: float | None = None,
    *,
    global_token_count: int | torch.Tensor | None = None,
    global_seq_count: int | torch.Tensor | None = None,
) -> torch.Tensor:
    """Aggregate ``loss_mat`` (B, T) under ``loss_mask`` (B, T) into a scalar (veRL's signature).

    Without the counts: this micro-batch's own loss. With them: its share of the global loss,
    times ``dp_size`` (see the module docstring).
    """
    fn = LOSS_AGG_REGISTRY[loss_agg_mode]
    tokens = batch_num_tokens if batch_num_tokens is not None else global_token_count
    seqs = global_batch_size if global_batch_size is not None else global_seq_count
    if dp_size > 1:
        if loss_agg_mode in _NEEDS_TOKENS and tokens is None:
            raise ValueError(f"agg_loss({loss_agg_mode!r}): batch_num_tokens (global) is required when dp_size > 1")
        if loss_agg_mode in _NEEDS_SEQS and seqs is None:
            raise ValueError(f"agg_loss({loss_agg_mode!r}): global_batch_size is required when dp_size > 1")
    loss = fn(loss_mat, loss_mask, tokens, seqs, loss_scale_factor)
    return loss * dp_size if dp_size != 1 else loss
