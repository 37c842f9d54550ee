"""Grouped-query attention without copying keys and values, for the ``hf`` rollout on the CPU.

transformers' ``sdpa`` attention repeats the key/value heads of a grouped-query model (Qwen2, Llama 3,
...) to the number of query heads whenever an attention mask is given (some CUDA kernels need it). On
the CPU that copy of the whole KV cache, at every decoded token, was ~35% of a decode step of the
quickstart's tiny Qwen2, and the attention on the copy was slower still. torch's CPU kernel takes
the grouped heads with a mask directly (``enable_gqa=True``), with the same results.

``use_grouped_sdpa(module)`` switches a model that runs ``sdpa`` on the CPU to that attention
(``sdpa_grouped``, registered with transformers' attention and mask interfaces, the mask being
``sdpa``'s); anything else (no mask, no grouping, other devices, attention weights requested) goes to
transformers' own ``sdpa`` function unchanged.
"""

from __future__ import annotations

import torch

NAME = "sdpa_grouped"
_registered = False


def _register() -> None:
    global _registered
    if _registered:
        return
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    def attention(
        module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None, is_causal=None, **kwargs
    ):
        grouped = getattr(module, "num_key_value_groups", 1) > 1
        plain = not any(kwargs.get(k) is not None for k in ("position_bias", "cache")) and not kwargs.get(
            "output_attentions"
        )
        if attention_mask is None or not grouped or not plain or query.device.type != "cpu":
            return sdpa_attention_forward(
                module,
                query,
                key,
                value,
                attention_mask,
                dropout=dropout,
                scaling=scaling,
                is_causal=is_causal,
                **kwargs,
            )
        out = torch.nn.functional.scaled_dot_product_attention(
            query, key, value, attn_mask=attention_mask, dropout_p=dropout, scale=scaling, enable_gqa=True
        )
        return out.transpose(1, 2).contiguous(), None

    AttentionInterface.register(NAME, attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register(NAME, sdpa_mask)
    _registered = True


def use_grouped_sdpa(module: torch.nn.Module) -> str | None:
    """Switch ``module`` (a transformers model on the CPU using ``sdpa``) to the grouped attention;
    returns the implementation it had (to restore later), or None when nothing was changed."""
    config = getattr(module, "config", None)
    before = getattr(config, "_attn_implementation", None)
    try:
        device = next(module.parameters()).device
    except StopIteration:
        return None
    if before != "sdpa" or device.type != "cpu" or not hasattr(module, "set_attn_implementation"):
        return None
    _register()
    try:
        module.set_attn_implementation(NAME)
    except (ValueError, ImportError, TypeError):  # a model class that refuses custom attention: keep sdpa
        return None
    return before


def restore_attention(module: torch.nn.Module, before: str | None) -> None:
    if before is not None:
        module.set_attn_implementation(before)
