"""Padding-free (packed) forward passes: ``use_remove_padding``.

RL batches are length-skewed, so a padded (B, S) forward spends most of its compute on pad tokens.
Packing keeps only the valid tokens, laid end to end, and gives each token the position id it had in
its own sequence. Attention must then stay inside each sequence, and how the rows are laid out
depends on the attention kernel:

- CUDA + flash-attn (``attn_implementation="flash_attention_2"``): every token in one row (1, T),
  ``T = attention_mask.sum()``; transformers runs flash-attn's variable-length kernel when given
  ``cu_seq_lens_{q,k}`` / ``max_length_{q,k}``, which we pass. Its cost grows with each sequence's
  own length, not with T.
- everything else (sdpa, eager): a dense kernel over one row of T tokens would cost T² (a whole
  micro-batch attending to itself under a block-diagonal mask; 20x slower than padding for 128
  sequences). So the sequences are bin-packed (first fit, longest first) into rows as wide as the
  longest one, each row's unused tail being one dummy sequence: the cost is rows × S², never more
  than the padded forward's B × S². transformers (>= 4.5x, checked on 5.19) builds the
  block-diagonal causal mask per row when ``attention_mask`` is None and the position ids restart
  at 0 for each sequence (``masking_utils.find_packed_sequence_indices``).

Neither path is trusted blindly: ``pack_rows`` checks that the sequence starts the model will infer
from the position ids are exactly the real ones, and ``check_packed_attention`` runs a tiny packed
vs separate forward once per module, raising if a model (e.g. remote code with its own masking)
attends across sequences. We never fall back to computing on pads without saying so.
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass

import torch
import torch.nn.functional as F

__all__ = [
    "PackedRows",
    "pack_rows",
    "pack_for",
    "unpack",
    "packed_forward",
    "check_packed_attention",
    "hf_config_of",
    "uses_varlen_attention",
]

_CHECKED_ATTR = "_hybridflow_packed_attention_ok"


@dataclass(frozen=True)
class PackedRows:
    """The valid tokens of a (B, S) batch, packed into (R, W) rows."""

    input_ids: torch.Tensor  # (R, W)
    position_ids: torch.Tensor  # (R, W): positions inside each sequence
    indices: torch.Tensor  # (T,): flat index (b * S + s) of each valid token in the padded layout
    slots: torch.Tensor  # (T,): flat index (r * W + w) of the same token in the packed rows
    cu_seqlens: torch.Tensor  # (B + 1,) int32: sequence b is tokens[cu[b]:cu[b+1]] in token order
    max_seqlen: int
    batch_size: int
    seqlen: int

    def tokens(self, values: torch.Tensor) -> torch.Tensor:
        """(R, W, ...) per-slot outputs -> (T, ...) per valid token, in ``indices`` order."""
        return values.reshape(-1, *values.shape[2:])[self.slots]


def _first_fit(seqlens: list[int], width: int) -> list[list[int]]:
    """Sequence indices grouped into rows of at most ``width`` tokens (first fit, longest first)."""
    rows, room = [], []
    for b in sorted(range(len(seqlens)), key=lambda b: -seqlens[b]):
        n = seqlens[b]
        if n == 0:
            continue
        for r, free in enumerate(room):
            if n <= free:
                rows[r].append(b)
                room[r] -= n
                break
        else:
            rows.append([b])
            room.append(width - n)
    return rows


def pack_rows(
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor,
    one_row: bool = True,
    width_multiple: int = 1,
) -> PackedRows:
    """Pack the tokens with ``attention_mask == 1`` (each row's valid tokens must be contiguous, as
    with left-padded prompts + right-padded responses): into one row (``one_row``, for a
    variable-length kernel) or bin-packed into rows as wide as the longest sequence. The row width is
    rounded up to a multiple of ``width_multiple`` (sequence parallelism slices rows into that many)."""
    if position_ids.dim() != 2:
        raise ValueError(f"use_remove_padding supports (B, S) position_ids, got shape {tuple(position_ids.shape)}")
    batch_size, seqlen = attention_mask.shape
    device = attention_mask.device
    indices = attention_mask.reshape(-1).nonzero(as_tuple=False).squeeze(-1)  # (T,)
    seqlens = attention_mask.sum(dim=-1, dtype=torch.int32)  # (B,)
    cu_seqlens = F.pad(seqlens.cumsum(0, dtype=torch.int32), (1, 0))  # (B + 1,)
    total = indices.numel()
    max_seqlen = int(seqlens.max()) if batch_size else 0
    lengths = seqlens.tolist()

    width = total if one_row else max_seqlen
    width = -(-width // width_multiple) * width_multiple
    rows = [[b for b in range(batch_size) if lengths[b]]] if one_row else _first_fit(lengths, width)
    n_rows = max(len(rows), 1)
    starts = torch.zeros(batch_size, dtype=torch.long)  # each sequence's first slot
    used = []
    for r, members in enumerate(rows):
        offset = r * width
        for b in members:
            starts[b] = offset
            offset += lengths[b]
        used.append(offset - r * width)
    starts = starts.to(device)
    within = torch.arange(total, device=device) - torch.repeat_interleave(cu_seqlens[:-1].long(), seqlens.long())
    slots = torch.repeat_interleave(starts, seqlens.long()) + within  # (T,)

    # every slot is a token: real tokens at their slots, each row's unused tail one dummy sequence 0, 1, ...
    flat_ids = input_ids.new_zeros(n_rows * width)
    flat_pos = position_ids.new_zeros(n_rows * width)
    true_starts = torch.zeros(n_rows * width, dtype=torch.bool, device=device)
    for r, n in enumerate(used):
        if n < width:
            flat_pos[r * width + n : (r + 1) * width] = torch.arange(width - n, device=device)
            true_starts[r * width + n] = True
    flat_ids[slots] = input_ids.reshape(-1)[indices]
    flat_pos[slots] = position_ids.reshape(-1)[indices]
    true_starts[starts[seqlens > 0]] = True

    # The model finds sequence starts where the position id does not grow by exactly 1 (and at each
    # row's start); that must be where our sequences start, or attention would leak between (or be cut
    # inside) sequences.
    pos = flat_pos.view(n_rows, width)
    inferred = torch.diff(pos, prepend=pos[:, :1] - 1, dim=-1) != 1
    inferred[:, :1] = True
    if total and not torch.equal(inferred.reshape(-1), true_starts):
        raise ValueError(
            "use_remove_padding: position_ids must count 0, 1, 2, ... over each row's valid tokens "
            "(as (attention_mask.cumsum(-1) - 1).clamp(min=0) does); these do not, so packed sequences "
            "could not be told apart. Turn use_remove_padding off for this data."
        )
    return PackedRows(flat_ids.view(n_rows, width), pos, indices, slots, cu_seqlens, max_seqlen, batch_size, seqlen)


def pack_for(
    module: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor,
    width_multiple: int = 1,
) -> PackedRows:
    """``pack_rows`` with the layout ``module``'s attention kernel runs fastest (module docstring)."""
    return pack_rows(
        input_ids, attention_mask, position_ids, one_row=uses_varlen_attention(module), width_multiple=width_multiple
    )


def unpack(values: torch.Tensor, packed: PackedRows) -> torch.Tensor:
    """(R, W, ...) outputs over the packed rows -> (B, S, ...) with zeros at pads (differentiable)."""
    values = packed.tokens(values)  # (T, ...)
    out = values.new_zeros((packed.batch_size * packed.seqlen, *values.shape[1:]))
    out = out.index_copy(0, packed.indices, values)
    return out.reshape(packed.batch_size, packed.seqlen, *values.shape[1:])


def _base_model(module: torch.nn.Module) -> torch.nn.Module:
    """The Hugging Face model under DDP / peft wrappers (FSDP2 wraps in place)."""
    if isinstance(module, torch.nn.parallel.DistributedDataParallel):
        module = module.module
    if hasattr(module, "get_base_model"):  # peft
        module = module.get_base_model()
    return module


def hf_config_of(module: torch.nn.Module):
    return getattr(_base_model(module), "config", None)


def uses_varlen_attention(module: torch.nn.Module) -> bool:
    """flash-attn kernels take variable-length packed rows (cu_seqlens); dense ones (sdpa, eager) do not."""
    impl = getattr(hf_config_of(module), "_attn_implementation", None) or ""
    return "flash" in str(impl)


def accepts_logits_to_keep(module: torch.nn.Module) -> bool:
    """Causal LMs in transformers 5 can project only chosen positions onto the vocabulary."""
    return _forward_takes_logits_to_keep(type(_base_model(module)))


@functools.cache
def _forward_takes_logits_to_keep(model_class: type) -> bool:
    """Per class, once: every micro-batch forward asks, and reading a signature costs more than the question."""
    return "logits_to_keep" in inspect.signature(model_class.forward).parameters


def packed_forward(module: torch.nn.Module, packed: PackedRows, **kwargs):
    """``module`` over the packed rows; returns the model output ((R, W, ...) per-slot outputs)."""
    check_packed_attention(module)
    if packed.input_ids.size(0) == 1 and uses_varlen_attention(module):
        kwargs.update(
            cu_seq_lens_q=packed.cu_seqlens,
            cu_seq_lens_k=packed.cu_seqlens,
            max_length_q=packed.max_seqlen,
            max_length_k=packed.max_seqlen,
        )
    return module(
        input_ids=packed.input_ids, position_ids=packed.position_ids, attention_mask=None, use_cache=False, **kwargs
    )


def check_packed_attention(module: torch.nn.Module) -> None:
    """Once per module: two short sequences packed together must give the outputs they give alone.

    Every data-parallel rank reaches this at its first packed forward, so collectives inside the
    forward (FSDP all-gathers) stay matched. Raises if the model attends across packed sequences.
    """
    if getattr(module, _CHECKED_ATTR, False):
        return
    config = hf_config_of(module)
    vocab = int(getattr(config, "vocab_size", 0) or 0)
    if vocab < 2:
        raise ValueError("use_remove_padding: cannot check packed attention on a model without config.vocab_size")
    device = next(module.parameters()).device
    gen = torch.Generator().manual_seed(1234)
    lengths = (3, 5)
    total = sum(lengths)
    ids = torch.randint(1, vocab, (total,), generator=gen).to(device)
    positions = torch.cat([torch.arange(n) for n in lengths]).unsqueeze(0).to(device)
    packed = PackedRows(
        ids.unsqueeze(0),
        positions,
        torch.arange(total, device=device),
        torch.arange(total, device=device),
        torch.tensor([0, lengths[0], total], dtype=torch.int32, device=device),
        max(lengths),
        1,
        total,
    )
    was_training = module.training
    module.eval()
    try:
        with torch.no_grad():
            setattr(module, _CHECKED_ATTR, True)  # packed_forward below must not recurse into the check
            together = packed_forward(module, packed).logits[0].float()  # (8, V)
            alone = []
            for start, n in ((0, lengths[0]), (lengths[0], lengths[1])):
                out = module(
                    input_ids=ids[start : start + n].unsqueeze(0),
                    position_ids=torch.arange(n, device=device)[None],
                    use_cache=False,
                )
                alone.append(out.logits[0].float())
            alone = torch.cat(alone)
    finally:
        setattr(module, _CHECKED_ATTR, False)
        module.train(was_training)
    scale = alone.abs().max().clamp(min=1e-6)
    tol = 1e-3 if next(module.parameters()).dtype == torch.float32 else 5e-2  # bf16/fp16: rounding noise
    err = float((together - alone).abs().max() / scale)
    if err > tol:
        impl = getattr(config, "_attn_implementation", None)
        raise RuntimeError(
            f"use_remove_padding: this model ({type(_base_model(module)).__name__}, attn_implementation={impl!r}) "
            f"attends across packed sequences (relative error {err:.2e}); it does not support packing by "
            "position ids. Turn use_remove_padding off, or use attn_implementation=flash_attention_2 on CUDA."
        )
    setattr(module, _CHECKED_ATTR, True)
