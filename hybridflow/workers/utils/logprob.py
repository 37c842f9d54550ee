"""Per-token forward passes over a batch of prompt+response rows.

Layout (veRL's): ``input_ids`` (B, P+R) is a left-padded prompt followed by a right-padded response
of width R. The logits at position t predict token t+1, so the R response tokens are predicted by
positions [-R-1:-1].

With ``use_remove_padding`` the forward runs over the packed valid tokens instead (one row for
flash-attn's variable-length kernel, bin-packed rows for dense kernels; ``remove_padding.py``) and
the results are scattered back to the (B, R) layout, zero at response pads, so everything downstream
is unchanged. In one row the log-prob path also projects only the positions that predict a response
token onto the vocabulary (``logits_to_keep``).
"""

from __future__ import annotations

import torch

from hybridflow.utils.torch_functional import entropy_from_logits, logprobs_from_logits, sum_pi_squared_from_logits
from hybridflow.workers.utils.remove_padding import (
    accepts_logits_to_keep,
    check_packed_attention,
    pack_for,
    packed_forward,
    unpack,
)
from hybridflow.workers.utils.ulysses import SequenceParallel, gather_seq, slice_seq
from hybridflow.workers.utils.ulysses_attention import KWARG, UlyssesAttentionArgs

__all__ = [
    "at_temperature",
    "forward_response_logits",
    "forward_response_log_probs",
    "forward_response_token_stats",
    "token_stats",
]

TokenStats = tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]


def token_stats(
    logits: torch.Tensor, targets: torch.Tensor, calculate_entropy: bool, calculate_sum_pi_squared: bool = False
) -> TokenStats:
    """(log p(target), entropy or None, sum_v p_v^2 or None) per position of temperature-scaled
    ``logits`` (..., V)."""
    return (
        logprobs_from_logits(logits, targets),
        entropy_from_logits(logits) if calculate_entropy else None,
        sum_pi_squared_from_logits(logits) if calculate_sum_pi_squared else None,
    )


def at_temperature(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """``logits / temperature``; at temperature 1 the logits themselves (the same values without a pass over
    a (..., V) tensor in the forward and another in the backward: on a GPU, vocabulary-sized passes were
    about a fifth of an actor update's time)."""
    return logits if temperature == 1 else logits / temperature


def _sp_forward(module: torch.nn.Module, packed, sp: SequenceParallel):
    """``module`` over this rank's slice of the packed rows (Ulysses attention sees all of them);
    returns the model output ((R, W/sp, ...) per-slot outputs). Every SP rank calls it together."""
    check_packed_attention(module)
    return module(
        input_ids=slice_seq(packed.input_ids, sp),
        position_ids=slice_seq(packed.position_ids, sp),
        attention_mask=None,
        use_cache=False,
        **{KWARG: UlyssesAttentionArgs(sp, packed.position_ids)},
    )


def _check_sp(sp: SequenceParallel | None, use_remove_padding: bool) -> None:
    if sp is not None and not use_remove_padding:
        raise ValueError(
            "Ulysses sequence parallelism runs on packed sequences: it needs model.use_remove_padding=True"
        )


def forward_response_logits(
    module: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor,
    response_length: int,
    use_remove_padding: bool = False,
    sp: SequenceParallel | None = None,
) -> torch.Tensor:
    """One forward over the batch; (B, R, V) outputs at the positions that predict the response
    tokens (for a value head V = 1: the value of the state before each response token). Packed:
    zero where the response is padding. ``sp``: the sequence-parallel group this micro-batch runs on
    (each rank computes its slice of the packed rows; the outputs are gathered)."""
    _check_sp(sp, use_remove_padding)
    if use_remove_padding:
        if sp is None:
            packed = pack_for(module, input_ids, attention_mask, position_ids)
            logits = packed_forward(module, packed).logits  # (R, W, V)
        else:
            packed = pack_for(module, input_ids, attention_mask, position_ids, width_multiple=sp.size)
            logits = gather_seq(_sp_forward(module, packed, sp).logits, sp, dim=1)  # (R, W/sp, V) -> (R, W, V)
        out = unpack(logits, packed)  # (B, S, V)
        response_mask = attention_mask[:, -response_length:].unsqueeze(-1).to(out.dtype)  # (B, R, 1)
        return out[:, -response_length - 1 : -1, :] * response_mask  # (B, R, V)
    kwargs = {}
    if accepts_logits_to_keep(module):
        # project only the R positions that predict a response token, as one contiguous (B, R, V) tensor: a
        # slice of R + 1 kept positions would cost a copy of it (to flatten rows) and a zero-filled (B, R + 1, V)
        # gradient in the backward
        width = input_ids.size(1)
        kwargs["logits_to_keep"] = torch.arange(width - response_length - 1, width - 1, device=input_ids.device)
    logits = module(
        input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False, **kwargs
    ).logits
    if logits.size(1) != response_length:  # every position projected
        logits = logits[:, -response_length - 1 : -1, :]
    return logits  # (B, R, V)


def _packed_response_log_probs(
    module,
    input_ids,
    attention_mask,
    position_ids,
    response_length,
    temperature,
    calculate_entropy,
    calculate_sum_pi_squared=False,
    sp=None,
) -> TokenStats:
    """Packed forward; only the positions whose next token is a valid response token are scored.
    With ``sp`` every slot of this rank's slice is scored locally and the scores are gathered (the
    logits are never gathered)."""
    batch_size, seqlen = attention_mask.shape
    packed = pack_for(module, input_ids, attention_mask, position_ids, width_multiple=sp.size if sp else 1)
    # flat position s predicts token s + 1; keep s when token s + 1 is a valid response token
    predicts_response = torch.zeros_like(attention_mask)  # (B, S)
    predicts_response[:, seqlen - response_length - 1 : seqlen - 1] = attention_mask[:, -response_length:]
    keep = predicts_response.reshape(-1)[packed.indices].nonzero(as_tuple=False).squeeze(-1)  # (N,) packed positions
    flat_positions = packed.indices[keep]  # (N,) in the (B * S) layout
    targets = input_ids.reshape(-1)[flat_positions + 1]  # (N,) never crosses a row: s <= S - 2

    def scatter(values):  # (N,) -> (B, R), zero at response pads
        out = values.new_zeros(batch_size * seqlen).index_copy(0, flat_positions, values)
        return out.reshape(batch_size, seqlen)[:, -response_length - 1 : -1]

    if sp is not None:
        slot_targets = packed.input_ids.new_zeros(packed.input_ids.numel())  # unscored slots: token 0
        slot_targets[packed.slots[keep]] = targets
        logits = at_temperature(_sp_forward(module, packed, sp).logits, temperature)  # (R, W/sp, V)
        local = token_stats(
            logits, slice_seq(slot_targets.view_as(packed.input_ids), sp), calculate_entropy, calculate_sum_pi_squared
        )
        return tuple(None if t is None else scatter(packed.tokens(gather_seq(t, sp, dim=1))[keep]) for t in local)

    if packed.input_ids.size(0) == 1 and accepts_logits_to_keep(module):  # one row: project only what is scored
        logits = packed_forward(module, packed, logits_to_keep=packed.slots[keep]).logits[0]  # (N, V)
    else:
        logits = packed.tokens(packed_forward(module, packed).logits)[keep]  # (N, V)
    logits = at_temperature(logits, temperature)
    return tuple(
        None if t is None else scatter(t)
        for t in token_stats(logits, targets, calculate_entropy, calculate_sum_pi_squared)
    )


def forward_response_token_stats(
    module: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor,
    response_length: int,
    temperature: float = 1.0,
    calculate_entropy: bool = False,
    calculate_sum_pi_squared: bool = False,
    use_remove_padding: bool = False,
    sp: SequenceParallel | None = None,
) -> TokenStats:
    """(log_probs (B, R), entropy (B, R) or None, sum_pi_squared (B, R) or None) of the response
    tokens ``input_ids[:, -R:]`` under the policy at ``temperature`` (logits divided by it, as the
    sampler did). ``sp``: the sequence-parallel group (``forward_response_logits``)."""
    _check_sp(sp, use_remove_padding)
    if use_remove_padding:
        return _packed_response_log_probs(
            module,
            input_ids,
            attention_mask,
            position_ids,
            response_length,
            temperature,
            calculate_entropy,
            calculate_sum_pi_squared,
            sp=sp,
        )
    logits = forward_response_logits(module, input_ids, attention_mask, position_ids, response_length)
    logits = at_temperature(logits, temperature)  # (B, R, V)
    return token_stats(logits, input_ids[:, -response_length:], calculate_entropy, calculate_sum_pi_squared)


def forward_response_log_probs(
    module: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor,
    response_length: int,
    temperature: float = 1.0,
    calculate_entropy: bool = False,
    use_remove_padding: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(log_probs (B, R), entropy (B, R) or None): ``forward_response_token_stats`` without sum_pi_squared."""
    return forward_response_token_stats(
        module,
        input_ids,
        attention_mask,
        position_ids,
        response_length,
        temperature,
        calculate_entropy,
        use_remove_padding=use_remove_padding,
    )[:2]
