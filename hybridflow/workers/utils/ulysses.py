"""Ulysses sequence parallelism: the collectives and the rank layout.

A sequence-parallel (SP) group of ``sp`` ranks runs one micro-batch together. Each rank holds a
contiguous ``1/sp`` slice of the packed sequence (embeddings, MLPs, norms and the LM head are per
token); attention needs every token, so around it the activations are exchanged all-to-all: from
(all heads, my tokens) to (my heads, all tokens) and back. The log-probs (or values) of the slices
are then gathered so that every rank of the group holds the whole micro-batch's outputs and computes
the same loss.

Gradients: the backward of the all-to-all is the reverse all-to-all. The backward of the output
gather keeps this rank's slice of the (identical on every SP rank) gradient and multiplies it by
``sp``: FSDP/DDP average gradients over all ``dp x sp`` ranks, while the ``sp`` ranks of a group
together hold one data-parallel replica's gradient, so the average must be over ``dp`` only.

Everything here works over gloo (CPU; torch >= 2.13's gloo has ``all_to_all_single``) and NCCL.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

__all__ = ["SequenceParallel", "ParallelLayout", "all_to_all", "gather_seq", "slice_seq", "build_layout", "layout_of"]


@dataclass(frozen=True)
class SequenceParallel:
    """This rank's SP group: ``size`` ranks, this one at ``rank`` within it."""

    group: object  # torch.distributed ProcessGroup
    size: int
    rank: int


@dataclass(frozen=True)
class ParallelLayout:
    """Where this rank sits in the dp x sp grid (rank = dp_rank * sp_size + sp_rank, as veRL lays it
    out, so an SP group is consecutive ranks: one node on NCCL)."""

    dp_rank: int
    dp_size: int
    sp_rank: int
    sp_size: int
    dp_group: object = None  # ranks with the same sp_rank (None: no torch.distributed / the default group)
    sp: SequenceParallel | None = None  # None when sp_size == 1

    @property
    def is_collect(self) -> bool:
        """The rank of its SP group whose answers the driver keeps (all SP ranks compute the same)."""
        return self.sp_rank == 0


def layout_of(rank: int, world_size: int, sp_size: int, key: str) -> tuple[int, int, int, int]:
    """(dp_rank, dp_size, sp_rank, sp_size) of ``rank``; ``key`` names the setting in errors."""
    if sp_size < 1 or world_size % sp_size:
        raise ValueError(f"{key}={sp_size} must be >= 1 and divide the number of ranks ({world_size})")
    return rank // sp_size, world_size // sp_size, rank % sp_size, sp_size


def build_layout(sp_size: int, key: str) -> ParallelLayout:
    """The dp x sp groups of the current world (a collective: every rank calls it, in the same order
    for every role). With ``sp_size == 1`` no group is made: the data-parallel group is the world."""
    if not dist.is_initialized():
        if sp_size != 1:
            raise ValueError(f"{key}={sp_size} needs torch.distributed with {sp_size} ranks or more")
        return ParallelLayout(0, 1, 0, 1)
    rank, world = dist.get_rank(), dist.get_world_size()
    dp_rank, dp_size, sp_rank, sp_size = layout_of(rank, world, sp_size, key)
    if sp_size == 1:
        return ParallelLayout(dp_rank, dp_size, 0, 1)
    dp_group = sp_group = None
    for s in range(sp_size):  # every rank creates every group, in the same order
        group = dist.new_group([d * sp_size + s for d in range(dp_size)])
        if s == sp_rank:
            dp_group = group
    for d in range(dp_size):
        group = dist.new_group([d * sp_size + s for s in range(sp_size)])
        if d == dp_rank:
            sp_group = group
    return ParallelLayout(dp_rank, dp_size, sp_rank, sp_size, dp_group, SequenceParallel(sp_group, sp_size, sp_rank))


# --- pure tensor helpers ---------------------------------------------------------------------------------
def slice_seq(x: torch.Tensor, sp: SequenceParallel, dim: int = 1) -> torch.Tensor:
    """This rank's contiguous slice of ``dim`` (whose size must divide by the SP size)."""
    if x.size(dim) % sp.size:
        raise ValueError(f"sequence length {x.size(dim)} does not divide by the sequence-parallel size {sp.size}")
    return x.chunk(sp.size, dim=dim)[sp.rank]


# --- collectives with autograd -----------------------------------------------------------------------------
def _all_to_all(x: torch.Tensor, sp: SequenceParallel, scatter_dim: int, gather_dim: int) -> torch.Tensor:
    if x.size(scatter_dim) % sp.size:
        raise ValueError(
            f"dimension {scatter_dim} of size {x.size(scatter_dim)} does not divide by the "
            f"sequence-parallel size {sp.size}"
        )
    send = torch.stack(x.chunk(sp.size, dim=scatter_dim)).contiguous()  # (sp, ...): chunk i goes to rank i
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send, group=sp.group)
    return torch.cat(recv.unbind(0), dim=gather_dim)  # chunk i came from rank i


class _AllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, sp, scatter_dim, gather_dim):
        ctx.sp, ctx.dims = sp, (scatter_dim, gather_dim)
        return _all_to_all(x, sp, scatter_dim, gather_dim)

    @staticmethod
    def backward(ctx, grad):
        scatter_dim, gather_dim = ctx.dims
        return _all_to_all(grad.contiguous(), ctx.sp, gather_dim, scatter_dim), None, None, None


def all_to_all(x: torch.Tensor, sp: SequenceParallel, scatter_dim: int, gather_dim: int) -> torch.Tensor:
    """Split ``scatter_dim`` into ``sp.size`` chunks, send chunk i to rank i, and concatenate what
    arrives along ``gather_dim`` in rank order. E.g. (B, H, S/sp, D) with scatter 1, gather 2 ->
    (B, H/sp, S, D). Its backward is the same exchange with the two dims swapped."""
    return _AllToAll.apply(x, sp, scatter_dim, gather_dim)


class _GatherSeq(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, sp, dim, grad_scale):
        ctx.sp, ctx.dim, ctx.grad_scale = sp, dim, grad_scale
        parts = [torch.empty_like(x) for _ in range(sp.size)]
        dist.all_gather(parts, x.contiguous(), group=sp.group)
        return torch.cat(parts, dim=dim)

    @staticmethod
    def backward(ctx, grad):
        sp = ctx.sp
        mine = grad.chunk(sp.size, dim=ctx.dim)[sp.rank]
        return (mine * sp.size if ctx.grad_scale else mine).contiguous(), None, None, None


def gather_seq(x: torch.Tensor, sp: SequenceParallel, dim: int = 1, grad_scale: bool = True) -> torch.Tensor:
    """The SP group's slices of ``dim`` concatenated in rank order (the inverse of ``slice_seq``).

    Backward: this rank's slice of the gradient, times ``sp.size`` when ``grad_scale`` (module
    docstring: every SP rank computes the same loss, and data-parallel averaging runs over all ranks)."""
    return _GatherSeq.apply(x, sp, dim, grad_scale)
