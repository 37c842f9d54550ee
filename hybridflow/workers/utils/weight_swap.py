"""Computing with other weights for a moment (V1 separate_async's π_old, fixed for a sync cycle)."""

from __future__ import annotations

import contextlib

import torch


def parameters_at_rest(module: torch.nn.Module) -> list[torch.Tensor]:
    """``module.parameters()`` as they are stored, FSDP2's units resharded first: after a no-grad forward
    FSDP2 leaves its root's parameters gathered (full tensors in the compute dtype) until the next backward,
    and a snapshot or a swap taken then would see those instead of the sharded float32 ones."""
    from torch.distributed.fsdp import FSDPModule

    for unit in module.modules():
        if isinstance(unit, FSDPModule):
            unit.reshard()
    return list(module.parameters())


@contextlib.contextmanager
def swapped_weights(module: torch.nn.Module, weights: list[torch.Tensor] | None):
    """``module``'s parameters hold ``weights`` (one tensor per parameter, in ``parameters()`` order,
    sharded as they are) inside the block and their own values again after it; None: no swap."""
    if weights is None:
        yield
        return
    params = parameters_at_rest(module)
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
            for p, w in zip(parameters_at_rest(module), own):
                p.copy_(w)
