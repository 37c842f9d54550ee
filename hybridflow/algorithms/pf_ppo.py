"""PF-PPO (``algorithm.use_pf_ppo``, veRL's keys): resample the batch by reward before the updates.

Policy filtration: rows are drawn with replacement, each with a weight from its sequence score, so the
updates see more of the samples whose reward is most informative. ``pf_ppo.reweight_method``:

- ``pow``: |score| ** ``weight_pow``;
- ``max_min``: 1 for the best and the worst score of the batch, 0 otherwise;
- ``max_random``: 0.4 for the best score, 0.1 for the others.

A tiny floor (1e-8) keeps every row drawable, as in veRL.
"""

from __future__ import annotations

import torch

REWEIGHT_METHODS = ("pow", "max_min", "max_random")


def pf_ppo_weights(scores: torch.Tensor, method: str, weight_pow: float = 2.0) -> torch.Tensor:
    """Sampling weight per row from its sequence score (B,) -> (B,)."""
    if method == "pow":
        weights = scores.abs().pow(weight_pow)
    elif method == "max_min":
        weights = ((scores == scores.max()) | (scores == scores.min())).to(scores.dtype)
    elif method == "max_random":
        weights = torch.where(scores == scores.max(), 0.4, 0.1).to(scores.dtype)
    else:
        raise ValueError(f"algorithm.pf_ppo.reweight_method={method!r}: choose one of {', '.join(REWEIGHT_METHODS)}")
    return torch.clamp(weights + 1e-8, min=1e-8)


def pf_ppo_resample_indices(
    scores: torch.Tensor, method: str, weight_pow: float, generator: torch.Generator | None = None
) -> torch.Tensor:
    """As many row indices as rows, drawn with replacement in proportion to ``pf_ppo_weights``."""
    weights = pf_ppo_weights(scores.detach().float().cpu(), method, weight_pow)
    return torch.multinomial(weights, len(weights), replacement=True, generator=generator)
