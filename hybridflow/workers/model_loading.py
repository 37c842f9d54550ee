"""Loading Hugging Face models and tokenizers for the workers (local paths only, never the hub)."""

from __future__ import annotations

import importlib
import os

import torch


def tokenizer_dir(tokenizer_path: str | None, model_path: str, key: str) -> str:
    """``tokenizer_path`` (``~`` expanded; it must be a folder, named by ``key`` otherwise), or ``model_path``
    when it is not set: veRL's ``model.tokenizer_path``."""
    if not tokenizer_path:
        return model_path
    expanded = os.path.expanduser(str(tokenizer_path))
    if not os.path.isdir(expanded):
        raise FileNotFoundError(f"{key}={tokenizer_path!r}: no such folder (it should hold the tokenizer's files)")
    return expanded


def local_model_path(path: str, key: str = "model.path") -> str:
    """Expand ``~`` and check the directory exists, naming the config key: no attempt to reach a hub.
    A GGUF file (or a folder holding exactly one, without config.json) gives its cached HF folder."""
    from hybridflow.workers.gguf_cache import find_gguf, hf_folder_for_gguf

    expanded = os.path.expanduser(str(path))
    gguf_file = find_gguf(expanded, key)
    if gguf_file is not None:
        return hf_folder_for_gguf(gguf_file, key)
    if not os.path.isdir(expanded) or not os.path.exists(os.path.join(expanded, "config.json")):
        raise FileNotFoundError(
            f"{key}={path!r}: no Hugging Face model directory there (expected a folder with config.json, "
            "or a GGUF file). hybridflow loads models from local paths only; download the model first."
        )
    return expanded


def config_dir(hf_config_path: str | None, key: str) -> str | None:
    """``model.hf_config_path`` as a local folder holding config.json (named by ``key`` when it does not), or None."""
    return local_model_path(hf_config_path, key) if hf_config_path else None


def import_external_lib(name: str | None) -> None:
    if name:
        importlib.import_module(name)


def load_tokenizer(
    path: str, trust_remote_code: bool = False, padding_side: str = "left", chat_template: str | None = None
):
    """The tokenizer at ``path``; ``chat_template`` (``model.custom_chat_template``) replaces its own, as
    veRL's model config does, so prompts, multi-turn messages and saved checkpoints all use it. A folder
    without a tokenizer is refused (ValueError naming it), not read as an empty vocabulary."""
    from transformers import AutoTokenizer

    if os.path.isfile(os.path.expanduser(str(path))):  # a GGUF file: its converted folder holds the tokenizer
        path = local_model_path(path, "tokenizer path")
    tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code, padding_side=padding_side)
    if len(tokenizer) < 2:  # transformers 5 builds an empty tokenizer for a folder without tokenizer files
        raise ValueError(
            f"no tokenizer in {path}: its files (tokenizer.json, tokenizer_config.json, ...) are not there, and "
            f"transformers built an empty one ({len(tokenizer)} token); point actor_rollout_ref.model.tokenizer_path "
            "(or data.tokenizer) at a folder that holds them"
        )
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    if chat_template:
        tokenizer.chat_template = chat_template
    return tokenizer


_AUTO_CLASSES = {
    "causal_lm": "AutoModelForCausalLM",
    "token_classification": "AutoModelForTokenClassification",
    "sequence_classification": "AutoModelForSequenceClassification",
}


def load_model(
    path: str,
    kind: str = "causal_lm",
    dtype: torch.dtype = torch.float32,
    override_config=None,
    trust_remote_code: bool = False,
    num_labels: int | None = None,
    config_path: str | None = None,
):
    """A model from a local directory. ``kind`` picks the head: causal_lm (actor, ref, rollout),
    token_classification with one label (critic: a value per position), sequence_classification (RM).
    ``config_path``: a folder whose config.json replaces the model's (veRL's ``model.hf_config_path``)."""
    import transformers

    auto = getattr(transformers, _AUTO_CLASSES[kind])
    # overrides go onto the config object: passed as from_pretrained kwargs, a key the config class
    # does not define (e.g. classifier_dropout on Qwen2) would reach the model's __init__ and fail
    config = transformers.AutoConfig.from_pretrained(config_path or path, trust_remote_code=trust_remote_code)
    overrides = dict(override_config or {})
    # veRL's override_config.attn_implementation picks the attention kernel (eager, sdpa, flash_attention_2)
    attention = (
        {"attn_implementation": overrides.pop("attn_implementation")} if "attn_implementation" in overrides else {}
    )
    for key, value in overrides.items():
        setattr(config, key, value)
    if num_labels is not None:
        config.num_labels = num_labels
    model = auto.from_pretrained(path, config=config, dtype=dtype, trust_remote_code=trust_remote_code, **attention)
    if getattr(model.config, "pad_token_id", None) is None and kind != "causal_lm":
        model.config.pad_token_id = getattr(model.config, "eos_token_id", 0)
    return model
