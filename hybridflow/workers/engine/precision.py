"""Mixed precision on one rank: half-precision compute weights over float32 master weights.

FSDP2's ``MixedPrecisionPolicy`` gives a mesh of ranks bf16 compute with float32 master weights and float32
gradient accumulation. On a one-rank mesh it also re-casts every parameter for every micro-batch's forward
and again for its backward, gathers and "reduce-scatters" over one rank, and runs its hooks around every
layer: 1.34x the kernels per micro-batch of ``ComputeWeights`` (1.41x the bare bf16 model's;
``benchmarks/one_rank_precision.py``), on a GPU whose actor update is bound by the host launching them.

``ComputeWeights`` gives the same numbers without the mesh: inside ``active()`` every parameter holds a
cast copy of its master (cast once per block), each micro-batch's half-precision gradient is added into a
float32 buffer as soon as autograd has it (so micro-batches never accumulate in bf16), and on leaving the
block the parameters hold their masters again, with the float32 gradients in ``.grad`` for clipping and
the optimizer. Outside the block the module is the plain float32 model: checkpoints, the rollout's weight
sync and ``state_dict`` see the masters.
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn

__all__ = ["ComputeWeights", "cast_parameters"]


class ComputeWeights:
    """``module``'s parameters computed in ``dtype`` inside ``active()`` (re-entrant: nested blocks share
    the outer one's copies). ``dtype=None``: no cast, ``active()`` does nothing."""

    def __init__(self, module: nn.Module, dtype: torch.dtype | None):
        self.dtype = dtype
        self._params = list(module.parameters()) if dtype is not None else []
        self._masters: list[torch.Tensor] | None = None
        self._grads: dict[int, torch.Tensor] = {}  # id(param) -> float32 gradient summed in the block
        self._depth = 0
        for p in self._params:
            if p.requires_grad:
                p.register_post_accumulate_grad_hook(self._take_grad)

    @property
    def casts(self) -> bool:
        return self.dtype is not None

    def _take_grad(self, p: torch.Tensor) -> None:
        """Autograd has put this backward's gradient in ``p.grad`` (``dtype``): add it to the float32 sum."""
        if self._masters is None or p.grad is None:
            return
        total = self._grads.get(id(p))
        if total is None:
            self._grads[id(p)] = p.grad.to(torch.float32)
        else:
            total.add_(p.grad)
        p.grad = None

    @contextlib.contextmanager
    def active(self):
        if not self.casts or self._depth:
            self._depth += 1
            try:
                yield
            finally:
                self._depth -= 1
            return
        self._enter()
        self._depth = 1
        try:
            yield
        finally:
            self._depth = 0
            self._leave()

    def _enter(self) -> None:
        self._masters = [p.data for p in self._params]
        for p in self._params:
            if p.grad is not None:  # a gradient from before the block keeps accumulating in float32
                self._grads[id(p)] = p.grad
                p.grad = None
            p.data = p.data.to(self.dtype)

    def _leave(self) -> None:
        masters, self._masters = self._masters, None
        for p, master in zip(self._params, masters):
            p.grad = None  # a half-precision gradient left by a backward outside autograd's hook
            p.data = master
            p.grad = self._grads.pop(id(p), None)
        self._grads.clear()


def cast_parameters(module: nn.Module, dtype: torch.dtype) -> None:
    """A frozen model's parameters stored in ``dtype`` (buffers such as rotary frequencies keep theirs, as
    FSDP2's mixed precision leaves them): the same numbers as casting them for every forward."""
    for p in module.parameters():
        p.data = p.data.to(dtype)
