"""GGUF checkpoints as Hugging Face folders: read by transformers' own GGUF loader (dequantized), written
once as a plain safetensors folder with tokenizer, chat template and generation config. Everything
downstream (training engines, the vLLM engine, model_merger) then sees an ordinary HF model directory."""

from __future__ import annotations

import os

import torch


def write_hf_folder_from_gguf(gguf_path: str, target_dir: str, dtype: torch.dtype = torch.float32) -> str:
    """Dequantize ``gguf_path`` (a .gguf file) into ``target_dir`` as safetensors + tokenizer + generation
    config; returns ``target_dir``."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = os.path.split(os.path.abspath(gguf_path))
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=dtype)
    # the loaded module is marked as quantized (GGUF) and refuses save_pretrained: rebuild it plainly
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    plain = AutoModelForCausalLM.from_config(config, dtype=dtype)
    plain.load_state_dict(loaded.state_dict())
    plain.generation_config = loaded.generation_config
    os.makedirs(target_dir, exist_ok=True)
    plain.save_pretrained(target_dir)
    tokenizer.save_pretrained(target_dir)
    return target_dir
