"""The attention of a transformers model under Ulysses sequence parallelism.

``use_ulysses_attention(model, sp_size, key)`` switches the model to an attention implementation
registered with transformers under ``ulysses_<base>`` (base: the one it had, sdpa, eager or flash).
A forward that carries ``hybridflow_ulysses=UlyssesAttentionArgs(...)`` in its keyword arguments
(transformers hands them down to every attention call, gradient-checkpointing recomputes included)
runs the sequence-parallel attention:

    q, k, v (B, H, S/sp, D) --all-to-all--> (B, H/sp, S, D) --attention over the whole packed rows-->
    (B, S, H/sp, D) --all-to-all--> (B, S/sp, H, D)

The mask the model built from its local slice of position ids is ignored: the packed rows' causal,
block-diagonal mask comes from the full rows' position ids (a sequence starts where the position id
does not grow by one, as ``remove_padding.py`` lays them out). flash-attn bases get those position
ids instead and run their variable-length kernel. Any other forward (no such argument: the packed
attention self-check, padded forwards) goes to the base implementation unchanged.

Query heads must divide by sp; key/value heads that do not are repeated just enough that they do
(each query head still meets its own key/value head).
"""

from __future__ import annotations

import inspect
import math
from dataclasses import dataclass

import torch

from hybridflow.workers.utils.ulysses import SequenceParallel, all_to_all

__all__ = ["UlyssesAttentionArgs", "KWARG", "use_ulysses_attention", "packed_causal_mask"]

KWARG = "hybridflow_ulysses"
_PREFIX = "ulysses_"
_registered: set[str] = set()


@dataclass(frozen=True)
class UlyssesAttentionArgs:
    """What the attention needs beyond its local slice: the SP group and the full rows' position ids."""

    sp: SequenceParallel
    position_ids: torch.Tensor  # (R, W): the packed rows, all SP slices


def packed_causal_mask(position_ids: torch.Tensor) -> torch.Tensor:
    """(R, 1, W, W) bool: token i attends to j <= i of its own sequence; a sequence starts at each row's
    first token and wherever the position id does not grow by exactly one."""
    starts = torch.ones_like(position_ids, dtype=torch.bool)
    starts[:, 1:] = position_ids[:, 1:] - position_ids[:, :-1] != 1
    seq = starts.cumsum(-1)  # (R, W) sequence index within the row
    width = position_ids.size(-1)
    causal = torch.ones(width, width, dtype=torch.bool, device=position_ids.device).tril()
    return ((seq[:, :, None] == seq[:, None, :]) & causal).unsqueeze(1)


def _repeat_kv_heads(x: torch.Tensor, times: int) -> torch.Tensor:
    """(B, Hkv, S, D) -> (B, Hkv * times, S, D), each head repeated in place (GQA order kept)."""
    return x if times == 1 else x.repeat_interleave(times, dim=1)


def _dense_attention(query, key, value, mask, scaling, dropout):
    """(B, Hq, S, D) x (B, Hk, S, D) under a bool mask -> (B, S, Hq, D)."""
    groups = query.size(1) // key.size(1)
    key, value = _repeat_kv_heads(key, groups), _repeat_kv_heads(value, groups)
    out = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=mask, dropout_p=dropout, scale=scaling
    )
    return out.transpose(1, 2)


def _unsupported(kwargs: dict) -> str | None:
    for name in ("sliding_window", "softcap", "s_aux", "position_bias"):
        if kwargs.get(name) is not None:
            return name
    return None


def _base_function(base: str, module):
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    if base == "eager":  # each model's own eager function, next to its attention class
        return inspect.getmodule(type(module)).eager_attention_forward
    return ALL_ATTENTION_FUNCTIONS[base]


def _make_attention(base: str):
    def attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None, **kwargs):
        args = kwargs.pop(KWARG, None)
        if args is None:
            return _base_function(base, module)(
                module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
            )
        bad = _unsupported(kwargs)
        if bad is not None:
            raise NotImplementedError(f"Ulysses sequence parallelism: attention with {bad} is not implemented")
        sp = args.sp
        kv_heads = key.size(1)
        repeat = sp.size // math.gcd(kv_heads, sp.size)  # key/value heads made divisible by sp
        key, value = _repeat_kv_heads(key, repeat), _repeat_kv_heads(value, repeat)
        # (B, H, S/sp, D) -> (B, H/sp, S, D)
        query, key, value = (all_to_all(t, sp, scatter_dim=1, gather_dim=2) for t in (query, key, value))
        if "flash" in base:
            for name in ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k"):
                kwargs.pop(name, None)  # the full rows' boundaries come from their position ids
            kwargs["position_ids"] = args.position_ids
            out, _ = _base_function(base, module)(
                module, query, key, value, None, dropout=dropout, scaling=scaling, **kwargs
            )
        else:
            out = _dense_attention(query, key, value, packed_causal_mask(args.position_ids), scaling, dropout)
        # (B, S, H/sp, D) -> (B, S/sp, H, D)
        return all_to_all(out, sp, scatter_dim=1, gather_dim=2).contiguous(), None

    return attention


def _register(base: str) -> str:
    name = _PREFIX + base
    if name not in _registered:
        from transformers import AttentionInterface
        from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS

        AttentionInterface.register(name, _make_attention(base))
        # forwards without SP (and the local mask the model builds either way) use the base's mask
        ALL_MASK_ATTENTION_FUNCTIONS.register(name, ALL_MASK_ATTENTION_FUNCTIONS[base])
        _registered.add(name)
    return name


def _head_counts(config) -> tuple[int, int]:
    heads = int(config.num_attention_heads)
    return heads, int(getattr(config, "num_key_value_heads", None) or heads)


def use_ulysses_attention(model: torch.nn.Module, sp_size: int, key: str) -> None:
    """Switch ``model`` (a transformers model, before any wrapping) to the SP attention; ``key`` names
    the setting in errors. Raises when the model cannot run it."""
    config = getattr(model, "config", None)
    base = getattr(config, "_attn_implementation", None)
    if base is None or not hasattr(model, "set_attn_implementation"):
        raise ValueError(
            f"{key}={sp_size}: {type(model).__name__} is not a transformers model with a "
            "switchable attention implementation"
        )
    if base.startswith(_PREFIX):
        return
    if base not in ("sdpa", "eager") and "flash" not in base:
        raise ValueError(
            f"{key}={sp_size}: attention implementation {base!r} is not supported with Ulysses "
            "sequence parallelism (sdpa, eager or flash_attention_*)"
        )
    heads, kv_heads = _head_counts(config)
    if heads % sp_size:
        raise ValueError(f"{key}={sp_size} must divide the model's number of attention heads ({heads})")
    if getattr(config, "use_sliding_window", False) and getattr(config, "sliding_window", None):
        raise ValueError(f"{key}={sp_size}: sliding-window attention is not implemented with sequence parallelism")
    model.set_attn_implementation(_register(base))
