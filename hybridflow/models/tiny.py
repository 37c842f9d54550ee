"""A tiny causal LM and character-level tokenizer, built offline and saved as a real Hugging Face
directory, so tests, the quickstart and benchmarks run the same loading paths as a downloaded model.

Why character level: a small vocabulary keeps the LM head cheap (a 152K vocabulary makes a tiny model
~30x slower), and every printable ASCII character still round-trips, so GSM8K/MATH text encodes.

    python -m hybridflow.models.tiny --out DIR [--arch qwen2|llama] [--seed 0]
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence

import torch

PAD_TOKEN = "<|endoftext|>"
IM_START = "<|im_start|>"
EOS_TOKEN = "<|im_end|>"
UNK_TOKEN = "<unk>"
SPECIAL_TOKENS = (PAD_TOKEN, IM_START, EOS_TOKEN, UNK_TOKEN)  # ids 0..3

# Every printable ASCII character (digits, letters, space, punctuation incl. #+-*/=.,?!:$()'%"\{}^_)
# plus newline: 95 + 1 characters, so the vocabulary is 4 + 96 = 100.
CHARACTERS = tuple(chr(c) for c in range(32, 127)) + ("\n",)

# Qwen2-style ChatML without Qwen's default system message (every character is a token here).
# Plain chats render exactly as ``<|im_start|>{role}\n{content}<|im_end|>\n`` per message. With
# ``tools`` (OpenAI function schemas) and tool calls it follows Qwen2.5's hermes layout, shortened for a
# character-level model (every character is a token, and the tools are in every prompt): each tool as
# one ``name(param, ...)`` line inside <tools></tools> in the system turn (after the system message's own
# content, if any) instead of its full JSON schema, an assistant's ``tool_calls`` as
# ``<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>`` lines, and consecutive ``tool``
# messages gathered into one user turn of ``<tool_response>\n...\n</tool_response>`` blocks.
CHAT_TEMPLATE = (
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] + '\\n\\n' }}{%- endif %}"
    "{{- '# Tools\\n<tools>' }}"
    "{%- for tool in tools %}"
    "{%- set fn = tool['function'] if tool['function'] is defined else tool %}"
    "{{- '\\n' + fn['name'] + '(' }}"
    "{%- if fn['parameters'] is defined and fn['parameters']['properties'] is defined %}"
    "{{- fn['parameters']['properties'] | list | join(', ') }}{%- endif %}"
    "{{- ')' }}"
    "{%- endfor %}"
    "{{- '\\n</tools><|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message['role'] == 'system' and loop.first and tools %}"
    "{%- elif message['role'] == 'assistant' and message['tool_calls'] is defined and message['tool_calls'] %}"
    "{{- '<|im_start|>assistant' }}"
    "{%- if message['content'] %}{{- '\\n' + message['content'] }}{%- endif %}"
    "{%- for tool_call in message['tool_calls'] %}"
    "{%- if tool_call['function'] is defined %}{%- set tool_call = tool_call['function'] %}{%- endif %}"
    "{{- '\\n<tool_call>\\n{\"name\": \"' + tool_call['name'] + '\", \"arguments\": ' }}"
    "{%- if tool_call['arguments'] is string %}{{- tool_call['arguments'] }}"
    "{%- else %}{{- tool_call['arguments'] | tojson }}{%- endif %}"
    "{{- '}\\n</tool_call>' }}"
    "{%- endfor %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- elif message['role'] == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1]['role'] != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + message['content'] + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1]['role'] != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- else %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

ARCHS = ("qwen2", "llama")

# Qwen2's pre-tokenization split (a fact of its tokenizer, needed to match Qwen2Tokenizer on load)
_QWEN2_PRETOKENIZE_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)


def build_tiny_tokenizer(model_max_length: int = 512, padding_side: str = "left"):
    """Character-level ``PreTrainedTokenizerFast`` with ChatML specials and a chat template.

    pad = ``<|endoftext|>`` (0), ``<|im_start|>`` (1), eos = ``<|im_end|>`` (2), ``<unk>`` (3), then one
    id per character. It is Qwen2's byte-level BPE pipeline with a vocabulary of single characters and
    no merges, so transformers' ``Qwen2Tokenizer`` (which AutoTokenizer forces for model_type qwen2 and
    which rebuilds the pipeline from vocab + merges) tokenizes exactly like this object. Characters
    outside printable ASCII have no id and are dropped, as Qwen2Tokenizer does with unknown bytes.
    """
    from tokenizers import Regex, Tokenizer, decoders, normalizers, pre_tokenizers
    from tokenizers.models import BPE
    from transformers import PreTrainedTokenizerFast

    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    # byte-level spelling of each character (" " -> "Ġ", "\n" -> "Ċ", printable ones unchanged)
    spelled = [byte_level.pre_tokenize_str(c)[0][0] for c in CHARACTERS]
    vocab = {tok: i for i, tok in enumerate(list(SPECIAL_TOKENS) + spelled)}
    backend = Tokenizer(BPE(vocab=vocab, merges=[], unk_token=None, fuse_unk=False, byte_fallback=False))
    backend.normalizer = normalizers.NFC()
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(_QWEN2_PRETOKENIZE_REGEX), behavior="isolated", invert=False), byte_level]
    )
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens(list(SPECIAL_TOKENS))
    # transformers 5.x keeps padding_side only when it is given to the constructor
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token=PAD_TOKEN,
        eos_token=EOS_TOKEN,
        unk_token=UNK_TOKEN,
        padding_side=padding_side,
        chat_template=CHAT_TEMPLATE,
        model_max_length=model_max_length,
    )


def build_tiny_config(
    vocab_size: int,
    arch: str = "qwen2",
    hidden_size: int = 128,
    num_layers: int = 4,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int = 256,
    max_position_embeddings: int = 512,
    tie_word_embeddings: bool = True,
    pad_token_id: int | None = 0,
    eos_token_id: int | None = 2,
    **extra,
):
    """The tiny model's config; ``extra`` goes to the config class as it is (``num_labels=1`` for a
    value or reward head, ``classifier_dropout=0.0``, ...)."""
    from transformers import LlamaConfig, Qwen2Config

    if arch not in ARCHS:
        raise ValueError(f"unknown tiny model arch {arch!r}; known: {', '.join(ARCHS)}")
    cls = Qwen2Config if arch == "qwen2" else LlamaConfig
    return cls(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        intermediate_size=intermediate_size,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=tie_word_embeddings,
        pad_token_id=pad_token_id,
        eos_token_id=eos_token_id,
        bos_token_id=None,
        torch_dtype="float32",
        **extra,
    )


def build_tiny_model(config, seed: int = 0, head: str = "causal_lm"):
    """Random-init model; the global torch RNG is left untouched, so the same seed gives the same weights.

    ``head``: ``causal_lm`` (the policy), ``token_classification`` (a critic's value per token) or
    ``sequence_classification`` (a reward model's score); give the config ``num_labels=1`` for the last two.
    """
    import transformers

    auto = {
        "causal_lm": transformers.AutoModelForCausalLM,
        "token_classification": transformers.AutoModelForTokenClassification,
        "sequence_classification": transformers.AutoModelForSequenceClassification,
    }
    if head not in auto:
        raise ValueError(f"unknown tiny model head {head!r}; known: {', '.join(auto)}")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = auto[head].from_config(config)
    return model


def save_tiny_model(
    out_dir: str,
    arch: str = "qwen2",
    hidden_size: int = 128,
    num_layers: int = 4,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int = 256,
    max_position_embeddings: int = 512,
    seed: int = 0,
    tie_word_embeddings: bool = True,
) -> str:
    """Write config.json, model.safetensors, generation_config.json and tokenizer files to ``out_dir``."""
    from transformers import GenerationConfig

    os.makedirs(out_dir, exist_ok=True)
    tokenizer = build_tiny_tokenizer(model_max_length=max_position_embeddings)
    config = build_tiny_config(
        vocab_size=len(tokenizer),
        arch=arch,
        hidden_size=hidden_size,
        num_layers=num_layers,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        intermediate_size=intermediate_size,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=tie_word_embeddings,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    model = build_tiny_model(config, seed=seed)
    # top_k=0 disables the top-k filter that generate() would otherwise default to
    model.generation_config = GenerationConfig(
        do_sample=True,
        temperature=1.0,
        top_k=0,
        top_p=1.0,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    return out_dir


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description="Write a tiny random-init causal LM + char tokenizer (HF format).")
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--arch", default="qwen2", choices=ARCHS)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--hidden_size", type=int, default=128)
    p.add_argument("--num_layers", type=int, default=4)
    p.add_argument("--num_heads", type=int, default=4)
    p.add_argument("--num_kv_heads", type=int, default=2)
    p.add_argument("--intermediate_size", type=int, default=256)
    p.add_argument("--max_position_embeddings", type=int, default=512)
    p.add_argument("--untied", action="store_true", help="separate lm_head instead of tied embeddings")
    a = p.parse_args(argv)
    save_tiny_model(
        a.out,
        arch=a.arch,
        hidden_size=a.hidden_size,
        num_layers=a.num_layers,
        num_heads=a.num_heads,
        num_kv_heads=a.num_kv_heads,
        intermediate_size=a.intermediate_size,
        max_position_embeddings=a.max_position_embeddings,
        seed=a.seed,
        tie_word_embeddings=not a.untied,
    )
    print(f"wrote tiny {a.arch} model to {a.out}")


if __name__ == "__main__":
    main()
