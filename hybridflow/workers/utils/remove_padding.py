"""Padding-free (packed) forward passes: ``use_remove_padding``.

RL batches are length-skewed, so a padded (B, S) forward spends most of its compute on pad tokens.
Packing keeps only the valid tokens, laid end to end in one row (1, T) with ``T = attention_mask.sum()``,
and gives each token the position id it had in its own sequence. Attention must then stay inside each
sequence:

- CUDA + flash-attn (``attn_implementation="flash_attention_2"``): transformers runs flash-attn's
  variable-length kernel when given ``cu_seq_lens_{q,k}`` / ``max_length_{q,k}``; we pass them.
- everything else (sdpa, eager): transformers (>= 4.5x, checked on 5.23) builds a block-diagonal
  causal mask when ``attention_mask`` is None and the position ids restart at 0 for each sequence
  (``masking_utils.find_packed_sequence_indices``).

Neither path is trusted blindly: ``pack_rows`` checks that the sequence starts the model will infer
from the position ids are exactly the real ones, and ``check_packed_attention`` runs a tiny packed
vs separate forward once per module, raising if a model (e.g. remote code with its own masking)
attends across sequences. We never fall back to computing on pads without saying so.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import torch
import torch.nn.functional as F

__all__ = ["PackedRows", "pack_rows", "unpack", "packed_forward", "check_packed_attention", "hf_config_of"]

_CHECKED_ATTR = "_hybridflow_packed_attention_ok"


@dataclass(frozen=True)
class PackedRows:
    """The valid tokens of a (B, S) batch laid end to end."""

    input_ids: torch.Tensor  # (1, T)
    position_ids: torch.Tensor  # (1, T): positions inside each sequence
    indices: torch.Tensor  # (T,): flat index (b * S + s) of each packed token in the padded layout
    cu_seqlens: torch.Tensor  # (B + 1,) int32: sequence b is packed[cu[b]:cu[b+1]]
    max_seqlen: int
    batch_size: int
    seqlen: int


def pack_rows(input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor) -> PackedRows:
    """Pack the tokens with ``attention_mask == 1`` (each row's valid tokens must be contiguous, as
    with left-padded prompts + right-padded responses)."""
    if position_ids.dim() != 2:
        raise ValueError(f"use_remove_padding supports (B, S) position_ids, got shape {tuple(position_ids.shape)}")
    batch_size, seqlen = attention_mask.shape
    indices = attention_mask.reshape(-1).nonzero(as_tuple=False).squeeze(-1)  # (T,)
    seqlens = attention_mask.sum(dim=-1, dtype=torch.int32)  # (B,)
    cu_seqlens = F.pad(seqlens.cumsum(0, dtype=torch.int32), (1, 0))  # (B + 1,)
    packed_ids = input_ids.reshape(-1)[indices].unsqueeze(0)  # (1, T)
    packed_pos = position_ids.reshape(-1)[indices].unsqueeze(0)  # (1, T)

    # The model finds sequence starts where the position id does not grow by exactly 1; that must be
    # where our sequences start, or attention would leak between (or be cut inside) sequences.
    total = indices.numel()
    true_starts = torch.zeros(total + 1, dtype=torch.bool, device=indices.device)
    true_starts[cu_seqlens[:-1].long()] = True
    true_starts = true_starts[:total]
    pos = packed_pos[0]
    inferred = torch.diff(pos, prepend=pos[:1] - 1) != 1
    inferred[:1] = True  # the first token always starts a sequence
    if total and not torch.equal(inferred, true_starts):
        raise ValueError(
            "use_remove_padding: position_ids must count 0, 1, 2, ... over each row's valid tokens "
            "(as (attention_mask.cumsum(-1) - 1).clamp(min=0) does); these do not, so packed sequences "
            "could not be told apart. Turn use_remove_padding off for this data."
        )
    return PackedRows(packed_ids, packed_pos, indices, cu_seqlens, int(seqlens.max()) if batch_size else 0,
                      batch_size, seqlen)


def unpack(values: torch.Tensor, packed: PackedRows) -> torch.Tensor:
    """(T, ...) values of the packed tokens -> (B, S, ...) with zeros at pads (differentiable)."""
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


def _uses_flash_attention(module: torch.nn.Module) -> bool:
    impl = getattr(hf_config_of(module), "_attn_implementation", None) or ""
    return "flash" in str(impl)


def accepts_logits_to_keep(module: torch.nn.Module) -> bool:
    """Causal LMs in transformers 5 can project only chosen positions onto the vocabulary."""
    return "logits_to_keep" in inspect.signature(_base_model(module).forward).parameters


def packed_forward(module: torch.nn.Module, packed: PackedRows, **kwargs):
    """``module`` over the packed row; returns the model output ((1, T, ...) per-token outputs)."""
    check_packed_attention(module)
    if _uses_flash_attention(module):
        kwargs.update(cu_seq_lens_q=packed.cu_seqlens, cu_seq_lens_k=packed.cu_seqlens,
                      max_length_q=packed.max_seqlen, max_length_k=packed.max_seqlen)
    return module(input_ids=packed.input_ids, position_ids=packed.position_ids, attention_mask=None,
                  use_cache=False, **kwargs)


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
    packed = PackedRows(ids.unsqueeze(0), positions, torch.arange(total, device=device),
                        torch.tensor([0, lengths[0], total], dtype=torch.int32, device=device), max(lengths), 1, total)
    was_training = module.training
    module.eval()
    try:
        with torch.no_grad():
            setattr(module, _CHECKED_ATTR, True)  # packed_forward below must not recurse into the check
            together = packed_forward(module, packed).logits[0].float()  # (8, V)
            alone = []
            for start, n in ((0, lengths[0]), (lengths[0], lengths[1])):
                out = module(input_ids=ids[start:start + n].unsqueeze(0), position_ids=torch.arange(n, device=device)[None],
                             use_cache=False)
                alone.append(out.logits[0].float())
            alone = torch.cat(alone)
    finally:
        setattr(module, _CHECKED_ATTR, False)
        module.train(was_training)
    scale = alone.abs().max().clamp(min=1e-6)
    tol = 1e-3 if next(module.parameters()).dtype == torch.float32 else 5e-2  # bf16/fp16: rounding noise
    err = float(((together - alone).abs().max() / scale))
    if err > tol:
        impl = getattr(config, "_attn_implementation", None)
        raise RuntimeError(
            f"use_remove_padding: this model ({type(_base_model(module)).__name__}, attn_implementation={impl!r}) "
            f"attends across packed sequences (relative error {err:.2e}); it does not support packing by "
            "position ids. Turn use_remove_padding off, or use attn_implementation=flash_attention_2 on CUDA."
        )
    setattr(module, _CHECKED_ATTR, True)
