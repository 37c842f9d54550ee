"""GGUF checkpoints as Hugging Face folders: read by transformers' own GGUF loader (dequantized), written
once as a plain safetensors folder with tokenizer, chat template and generation config. Everything
downstream (training engines, the vLLM engine, model_merger) then sees an ordinary HF model directory.

The header is checked first with the ``gguf`` package, so that a file transformers cannot read fails
with the file, the config key and the architecture or tensor type named, not deep inside a loader."""

from __future__ import annotations

import os

import numpy as np
import torch

GGUF_MAGIC = b"GGUF"
INSTALL_HINT = "pip install 'hybridflow[gguf]' (or: pip install gguf accelerate)"
# general.architecture spellings transformers' legacy GGUF loader renames before its table lookup
_LEGACY_RENAMES = {
    "qwen2moe": "qwen2_moe",
    "qwen3moe": "qwen3_moe",
    "gpt-oss": "gpt_oss",
    "minimax-m2": "minimax_m2",
    "t5encoder": "t5",
}


def is_gguf_file(path: str) -> bool:
    """Whether ``path`` is a file that starts with the GGUF magic."""
    try:
        with open(path, "rb") as f:
            return f.read(4) == GGUF_MAGIC
    except OSError:
        return False


def _import_gguf(path: str, key: str):
    try:
        import gguf
    except ImportError as err:
        raise ImportError(
            f"{key}={path!r} is a GGUF file; reading it needs the `gguf` package: {INSTALL_HINT}"
        ) from err
    return gguf


def _fast_path_support(architecture: str) -> set[int] | None:
    """ggml type ids transformers' own reader (integrations.gguf) handles for ``architecture``, or None
    where that architecture goes to the legacy loader (or this transformers has no such reader)."""
    try:
        from transformers.integrations.gguf.dequant import GGML_BLOCK
        from transformers.integrations.gguf.gguf_config_mapping import GGUF_CONFIG_ARCHS
        from transformers.integrations.gguf.gguf_conversion_mapping import GGUF_ARCHS
    except ImportError:
        return None
    if architecture not in GGUF_ARCHS or architecture not in GGUF_CONFIG_ARCHS:
        return None
    return {0, 1, 30} | set(GGML_BLOCK)  # F32, F16, BF16 values, then the block types it unpacks


def _legacy_architectures() -> set[str]:
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    return set(GGUF_SUPPORTED_ARCHITECTURES) - {"general", "tokenizer"}  # the table's non-model sections


def _readable_architectures() -> list[str]:
    try:
        from transformers.integrations.gguf.gguf_conversion_mapping import GGUF_ARCHS
    except ImportError:
        GGUF_ARCHS = {}
    return sorted(_legacy_architectures() | {a for a in GGUF_ARCHS if _fast_path_support(a) is not None})


def _legacy_can_dequantize(gguf, qtype) -> bool:
    """The legacy loader unpacks through ``gguf.quants.dequantize``: try it on one zero block."""
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    try:
        gguf.quants.dequantize(np.zeros((1, size), dtype=np.uint8), qtype)
    except NotImplementedError:
        return False
    except Exception:  # noqa: BLE001 - a zero block that upsets the math still means the type is known
        return True
    return True


def check_gguf(path: str, key: str = "model.path") -> str:
    """Raise unless transformers can read this GGUF's architecture and every tensor type; return the
    architecture. Errors name the file, the config key and what is unsupported."""
    gguf = _import_gguf(path, key)
    if not is_gguf_file(path):
        raise ValueError(f"{key}={path!r}: {path} is not a GGUF file (it does not start with the GGUF magic)")
    try:
        reader = gguf.GGUFReader(path)
        field = reader.fields["general.architecture"]
        architecture = bytes(field.parts[field.data[0]]).decode("utf-8")
    except KeyError:
        raise ValueError(f"{key}={path!r}: GGUF file {path} has no general.architecture") from None
    except Exception as err:
        raise ValueError(f"{key}={path!r}: cannot read GGUF file {path}: {err}") from err

    import transformers

    fast = _fast_path_support(architecture)
    legacy = _LEGACY_RENAMES.get(architecture, architecture) in _legacy_architectures()
    if fast is None and not legacy:
        raise ValueError(
            f"{key}={path!r}: GGUF file {path} has architecture {architecture!r}, which transformers "
            f"{transformers.__version__} cannot read; it reads: "
            f"{', '.join(_readable_architectures())}"
        )
    checked: dict[int, bool] = {}
    for tensor in reader.tensors:
        qtype = tensor.tensor_type
        if qtype not in checked:
            checked[qtype] = int(qtype) in fast if fast is not None else _legacy_can_dequantize(gguf, qtype)
        if not checked[qtype]:
            raise ValueError(
                f"{key}={path!r}: GGUF file {path}: tensor {tensor.name!r} has tensor type "
                f"{gguf.GGMLQuantizationType(qtype).name}, which transformers "
                f"{transformers.__version__} cannot dequantize (architecture {architecture!r})"
            )
    return architecture


def write_hf_folder_from_gguf(
    gguf_path: str, target_dir: str, dtype: torch.dtype = torch.float32, key: str = "gguf_file"
) -> str:
    """Dequantize ``gguf_path`` (a .gguf file) into ``target_dir`` as safetensors + tokenizer + generation
    config; returns ``target_dir``. Checks the header first (see ``check_gguf``)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    architecture = check_gguf(gguf_path, key)
    folder, name = os.path.split(os.path.abspath(gguf_path))
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
        # dequantize=True: plain dense weights even where GGUF matmul kernels are installed
        loaded = AutoModelForCausalLM.from_pretrained(
            folder, gguf_file=name, dtype=dtype, quantization_config=GgufConfig(dequantize=True)
        )
    except ImportError:
        raise
    except Exception as err:
        raise ValueError(
            f"{key}={gguf_path!r}: transformers could not load GGUF file {gguf_path} "
            f"(architecture {architecture!r}): {err}"
        ) from err
    # the loaded module is marked as quantized (GGUF) and refuses save_pretrained: rebuild it plainly
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    plain = AutoModelForCausalLM.from_config(config, dtype=dtype)
    plain.load_state_dict(loaded.state_dict())
    plain.generation_config = loaded.generation_config
    del loaded
    os.makedirs(target_dir, exist_ok=True)
    plain.save_pretrained(target_dir)
    tokenizer.save_pretrained(target_dir)
    return target_dir
