"""hf_attention.py: the CPU grouped-query attention (no KV head copies) against attention computed
independently (torch SDPA on the KV heads repeated with repeat_interleave, an explicit causal +
padding mask), and a whole tiny model switched to it against its own ``sdpa``."""

from __future__ import annotations

import pytest
import torch

from hybridflow.models.tiny import build_tiny_config, build_tiny_model
from hybridflow.workers.rollout import hf_attention

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


class _Attn(torch.nn.Module):
    def __init__(self, groups: int):
        super().__init__()
        self.num_key_value_groups = groups
        self.is_causal = True
        self.training = False


def _attention_function():
    from transformers import AttentionInterface

    hf_attention._register()
    return AttentionInterface._global_mapping[hf_attention.NAME]


def _reference(q, k, v, mask_bool, scale):
    """Softmax attention written out, KV heads repeated: (B, T, H, D)."""
    groups = q.size(1) // k.size(1)
    k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    scores = (q @ k.transpose(-1, -2)) * scale
    scores = scores.masked_fill(~mask_bool, float("-inf"))
    out = torch.softmax(scores, dim=-1) @ v
    return out.transpose(1, 2)


def _inputs(heads, kv_heads, seed=0, batch=3, q_len=5, kv_len=7, dim=8):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, heads, q_len, dim, generator=gen)
    k = torch.randn(batch, kv_heads, kv_len, dim, generator=gen)
    v = torch.randn(batch, kv_heads, kv_len, dim, generator=gen)
    # left padding of 0, 2 and 1 columns; causal with the queries at the last q_len positions
    pad = torch.tensor([0, 2, 1])
    cols = torch.arange(kv_len)
    rows = torch.arange(kv_len - q_len, kv_len)
    causal = cols[None, :] <= rows[:, None]  # (q_len, kv_len)
    mask = causal[None] & (cols[None, None, :] >= pad[:, None, None])  # (B, q_len, kv_len)
    return q, k, v, mask[:, None]  # (B, 1, q_len, kv_len)


@pytest.mark.parametrize("heads,kv_heads", [(4, 2), (6, 2), (4, 4)])
@pytest.mark.parametrize("mask_kind", ["bool", "float"])
def test_attention_matches_repeated_kv_reference(heads, kv_heads, mask_kind):
    fn = _attention_function()
    q, k, v, mask = _inputs(heads, kv_heads)
    scale = 0.37
    ref = _reference(q, k, v, mask, scale)
    given = mask if mask_kind == "bool" else torch.zeros(mask.shape).masked_fill(~mask, torch.finfo(torch.float32).min)
    out, weights = fn(_Attn(heads // kv_heads), q, k, v, given, scaling=scale)
    assert weights is None
    assert out.shape == ref.shape == (3, 5, heads, 8)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    # and the independent torch SDPA with the KV heads repeated
    groups = heads // kv_heads
    sdpa = torch.nn.functional.scaled_dot_product_attention(
        q, k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1), attn_mask=mask, scale=scale
    ).transpose(1, 2)
    torch.testing.assert_close(out, sdpa, atol=1e-5, rtol=1e-5)


def test_no_mask_falls_back_to_causal_sdpa():
    fn = _attention_function()
    q, k, v, _ = _inputs(4, 2, q_len=7, kv_len=7)
    out, _ = fn(_Attn(2), q, k, v, None, scaling=0.5, is_causal=True)
    causal = torch.tril(torch.ones(7, 7, dtype=torch.bool))[None, None].expand(3, 1, 7, 7)
    torch.testing.assert_close(out, _reference(q, k, v, causal, 0.5), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kv_heads", [2, 4])
def test_model_switched_to_grouped_sdpa_gives_the_same_logits_and_cached_decode(kv_heads):
    config = build_tiny_config(
        32,
        hidden_size=32,
        intermediate_size=64,
        num_layers=2,
        num_heads=4,
        num_kv_heads=kv_heads,
        max_position_embeddings=64,
        attn_implementation="sdpa",
    )
    model = build_tiny_model(config, seed=1).eval()
    assert model.config._attn_implementation == "sdpa"
    gen = torch.Generator().manual_seed(2)
    ids = torch.randint(3, 32, (3, 9), generator=gen)
    mask = torch.ones_like(ids)
    mask[1, :3] = 0
    mask[2, :1] = 0  # left padding
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    step = torch.randint(3, 32, (3, 1), generator=gen)

    def run():
        from transformers import DynamicCache

        with torch.no_grad():
            cache = DynamicCache()
            full = model(
                input_ids=ids, attention_mask=mask, position_ids=pos, past_key_values=cache, use_cache=True
            ).logits
            nxt = model(
                input_ids=step,
                attention_mask=torch.cat([mask, torch.ones_like(step)], 1),
                position_ids=pos[:, -1:] + 1,
                past_key_values=cache,
                use_cache=True,
            ).logits
        return full, nxt

    ref_full, ref_next = run()
    before = hf_attention.use_grouped_sdpa(model)
    try:
        assert before == "sdpa" and model.config._attn_implementation == hf_attention.NAME
        full, nxt = run()
    finally:
        hf_attention.restore_attention(model, before)
    assert model.config._attn_implementation == "sdpa"
    keep = mask.bool()  # rows' padding positions are not compared (their output is never used)
    torch.testing.assert_close(full[keep], ref_full[keep], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(nxt, ref_next, atol=1e-5, rtol=1e-5)
