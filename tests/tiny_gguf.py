"""A tiny llama GGUF written in-test with ``gguf.GGUFWriter``: 2 layers, hidden 32, a ~100-token byte-level
BPE vocabulary with ChatML specials and a chat template, some tensors F32 and some Q8_0."""

from __future__ import annotations

import numpy as np

HIDDEN, FFN, LAYERS, HEADS, KV_HEADS = 32, 64, 2, 4, 2
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
QUANTIZED = ("ffn_gate", "ffn_up", "ffn_down", "attn_q", "attn_v")  # Q8_0; the rest stay F32


def vocabulary() -> tuple[list[str], list[str]]:
    """(tokens, merges): printable ASCII, space and newline in GPT-2's byte alphabet, a few merges, specials."""
    chars = [chr(c) for c in range(ord("!"), ord("~") + 1)] + ["Ġ", "Ċ"]  # space, newline
    merges = ["Ġ h", "e l", "Ġh el"]
    return chars + ["Ġh", "el", "Ġhel"] + SPECIALS, merges


def tiny_weights(vocab_size: int, seed: int = 0) -> dict[str, np.ndarray]:
    """GGUF tensor name -> float32 array in torch (out, in) order."""
    rng = np.random.default_rng(seed)
    head_dim = HIDDEN // HEADS
    shapes = {"token_embd.weight": (vocab_size, HIDDEN), "output_norm.weight": (HIDDEN,)}
    for i in range(LAYERS):
        shapes.update(
            {
                f"blk.{i}.attn_norm.weight": (HIDDEN,),
                f"blk.{i}.ffn_norm.weight": (HIDDEN,),
                f"blk.{i}.attn_q.weight": (HIDDEN, HIDDEN),
                f"blk.{i}.attn_k.weight": (KV_HEADS * head_dim, HIDDEN),
                f"blk.{i}.attn_v.weight": (KV_HEADS * head_dim, HIDDEN),
                f"blk.{i}.attn_output.weight": (HIDDEN, HIDDEN),
                f"blk.{i}.ffn_gate.weight": (FFN, HIDDEN),
                f"blk.{i}.ffn_up.weight": (FFN, HIDDEN),
                f"blk.{i}.ffn_down.weight": (HIDDEN, FFN),
            }
        )
    out = {}
    for name, shape in shapes.items():
        out[name] = (
            1.0 + 0.1 * rng.standard_normal(shape) if len(shape) == 1 else 0.2 * rng.standard_normal(shape)
        ).astype(np.float32)
    return out


def write_tiny_gguf(path: str, architecture: str = "llama", extra_tensors: dict | None = None) -> dict[str, np.ndarray]:
    """Write the model to ``path``; returns what each tensor holds after a GGUF round trip (the
    dequantized values for the Q8_0 ones). ``extra_tensors``: name -> (raw array, ggml type or None)."""
    import gguf

    tokens, merges = vocabulary()
    writer = gguf.GGUFWriter(path, architecture)
    writer.add_name("tiny-llama")
    writer.add_block_count(LAYERS)
    writer.add_context_length(128)
    writer.add_embedding_length(HIDDEN)
    writer.add_feed_forward_length(FFN)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_freq_base(10000.0)
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(tokens)
    writer.add_token_types([3 if t in SPECIALS else 1 for t in tokens])  # 3: control
    writer.add_token_merges(merges)
    writer.add_bos_token_id(tokens.index("<|im_start|>"))
    writer.add_eos_token_id(tokens.index("<|im_end|>"))
    writer.add_pad_token_id(tokens.index("<|endoftext|>"))
    writer.add_chat_template(CHAT_TEMPLATE)
    stored = {}
    for name, array in tiny_weights(len(tokens)).items():
        if any(f".{q}." in name for q in QUANTIZED):
            blocks = gguf.quants.quantize(array, gguf.GGMLQuantizationType.Q8_0)
            writer.add_tensor(name, blocks, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
            stored[name] = gguf.quants.dequantize(blocks, gguf.GGMLQuantizationType.Q8_0)
        else:
            writer.add_tensor(name, array)
            stored[name] = array
    for name, (array, qtype) in (extra_tensors or {}).items():
        writer.add_tensor(name, array, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return stored
