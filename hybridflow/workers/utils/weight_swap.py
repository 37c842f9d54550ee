"""Computing with other weights for a moment (V1 separate_async's π_old, fixed for a sync cycle)."""

from __future__ import annotations

import contextlib

import torch


@contextlib.contextmanager
def swapped_weights(module: torch.nn.Module, weights: list[torch.Tensor] | None):
    """``module``'s parameters hold ``weights`` (one tensor per parameter, in ``parameters()`` order,
    sharded as they are) inside the block and their own values again after it; None: no swap."""
    if weights is None:
        yield
        return
    params = list(module.parameters())
    if len(params) != len(weights):
        raise ValueError(f"swapped_weights: {len(weights)} tensors for {len(params)} parameters")
    own = [p.detach().clone() for p in params]
    with torch.no_grad():
        for p, w in zip(params, weights):
            p.copy_(w)
    try:
        yield
    finally:
        with torch.no_grad():
            for p, w in zip(params, own):
                p.copy_(w)
