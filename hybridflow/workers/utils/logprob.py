"""Per-token forward passes over a batch of prompt+response rows.

Layout (veRL's): ``input_ids`` (B, P+R) is a left-padded prompt followed by a right-padded response
of width R. The logits at position t predict token t+1, so the R response tokens are predicted by
positions [-R-1:-1].

Seam for a padding-free (packed) forward: ``forward_response_logits`` is the only place that calls
the model. A ``use_remove_padding`` flag belongs there: unpad to (1, total_tokens), forward with
the packed position_ids, and pad the logits back to (B, R, V) so everything downstream is unchanged.
"""

from __future__ import annotations

from typing import Optional

import torch

from hybridflow.trainer.ppo.core_algos import entropy_from_logits, logprobs_from_logits

__all__ = ["forward_response_logits", "forward_response_log_probs"]


def forward_response_logits(
    module: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor,
    response_length: int,
) -> torch.Tensor:
    """One forward over the padded batch; (B, R, V) outputs at the positions that predict the
    response tokens (for a value head V = 1: the value of the state before each response token)."""
    output = module(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False)
    return output.logits[:, -response_length - 1 : -1, :]  # (B, R, V)


def forward_response_log_probs(
    module: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor,
    response_length: int,
    temperature: float = 1.0,
    calculate_entropy: bool = False,
) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """(log_probs (B, R), entropy (B, R) or None) of the response tokens ``input_ids[:, -R:]``
    under the policy at ``temperature`` (logits divided by it, as the sampler did)."""
    logits = forward_response_logits(module, input_ids, attention_mask, position_ids, response_length)
    logits = logits / temperature  # (B, R, V)
    responses = input_ids[:, -response_length:]  # (B, R)
    log_probs = logprobs_from_logits(logits, responses)
    entropy = entropy_from_logits(logits) if calculate_entropy else None
    return log_probs, entropy
