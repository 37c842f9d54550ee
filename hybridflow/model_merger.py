"""Turn a training checkpoint into a Hugging Face model directory (config, tokenizer, safetensors).

    python -m hybridflow.model_merger merge --backend fsdp --local_dir CKPT/global_step_N/actor --target_dir OUT
    python -m hybridflow.model_merger convert --checkpoint_dir CKPT [--target_root ROOT]
    python -m hybridflow.model_merger gguf --gguf_file MODEL.gguf --target_dir OUT [--dtype bfloat16]

``merge`` reads one role's DCP checkpoint in this process (no process group, any number of ranks
saved it), strips wrapper prefixes and writes the weights with the config, tokenizer and generation
config the workers saved under ``huggingface/``. ``convert`` does that for every complete
``global_step_N/{actor,critic}`` of a run, writing ``ROOT/global_step_N/hf_{role}`` (ROOT defaults
to the run directory) and skipping those already converted, so it can be re-run as training goes on.
``gguf`` dequantizes a GGUF file through transformers into a plain safetensors folder with tokenizer,
chat template and generation config (what model paths given a GGUF use, and what vLLM loads).
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import sys
from collections.abc import Sequence

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.metadata import TensorStorageMetadata
from transformers import AutoConfig

from hybridflow.trainer.checkpoint import complete_steps, step_dir_name
from hybridflow.utils.atomic_folder import folder_written_atomically
from hybridflow.utils.logging_utils import setup_cli_logging
from hybridflow.utils.param_names import strip_wrapper_prefixes
from hybridflow.utils.safe_load import SafeMetadataReader
from hybridflow.workers.checkpoint import DCP_DIR, HF_DIR, quiet_no_pg, write_hf_model

logger = logging.getLogger(__name__)

BACKENDS = ("fsdp",)
ROLES = ("actor", "critic")
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".safetensors.index.json", ".bin.index.json")
_DTYPES = {
    "bf16": torch.bfloat16,
    "bfloat16": torch.bfloat16,
    "fp16": torch.float16,
    "float16": torch.float16,
    "fp32": torch.float32,
    "float32": torch.float32,
}


def check_backend(backend: str) -> None:
    if backend == "megatron":
        raise ValueError(
            "--backend megatron is not supported: hybridflow trains with FSDP2/DDP and saves "
            "torch.distributed.checkpoint (DCP) shards; use --backend fsdp for its checkpoints"
        )
    if backend not in BACKENDS:
        raise ValueError(f"unknown --backend {backend!r}; supported: {', '.join(BACKENDS)}")


def unwrapped_state_dict(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``module._orig_mod.model.x`` -> ``model.x``: the names a plain Hugging Face model uses (peft's
    own names stay: a LoRA checkpoint's adapters are folded in by name afterwards)."""
    out = {}
    for key, value in state_dict.items():
        key = strip_wrapper_prefixes(key)
        if key in out:
            raise ValueError(f"two checkpoint entries map to {key!r} after removing wrapper prefixes")
        out[key] = value
    return out


def _require_checkpoint(local_dir: str) -> str:
    if not os.path.isdir(local_dir):
        raise FileNotFoundError(f"checkpoint directory {local_dir!r} does not exist")
    dcp_path = os.path.join(local_dir, DCP_DIR)
    if os.path.isfile(os.path.join(dcp_path, ".metadata")):
        return dcp_path
    roles = [r for r in ROLES if os.path.isdir(os.path.join(local_dir, r))]
    hint = f"; it holds {roles}: pass {os.path.join(local_dir, roles[0])}" if roles else ""
    raise ValueError(f"{local_dir!r} is not a hybridflow checkpoint (no {DCP_DIR}/.metadata){hint}")


def load_dcp_model_state(local_dir: str) -> dict[str, torch.Tensor]:
    """Full model weights of a role checkpoint, assembled from all ranks' shards in this process.

    Only the ``model.*`` entries are read (the optimizer state, ~2x the model, stays on disk).
    """
    reader = SafeMetadataReader(_require_checkpoint(local_dir))
    metadata = reader.read_metadata()
    state = {}
    for key, meta in metadata.state_dict_metadata.items():
        if key.startswith("model.") and isinstance(meta, TensorStorageMetadata):
            state[key] = torch.empty(meta.size, dtype=meta.properties.dtype)
    if not state:
        raise ValueError(f"{local_dir!r} holds no model weights (saved without 'model' in save_contents?)")
    with quiet_no_pg():
        dcp.load(state, storage_reader=reader, no_dist=True)
    return unwrapped_state_dict({k[len("model.") :]: v for k, v in state.items()})


def _copy_side_files(src: str, dst: str) -> None:
    """Tokenizer, generation config, chat template...: everything but config.json and weights."""
    for name in os.listdir(src):
        path = os.path.join(src, name)
        # adapter_config.json would make loaders treat the merged model as a bare adapter
        if (
            os.path.isfile(path)
            and name not in ("config.json", "adapter_config.json")
            and not name.endswith(_WEIGHT_SUFFIXES)
        ):
            shutil.copy2(path, os.path.join(dst, name))


def _fold_lora(state: dict[str, torch.Tensor], search_dirs: Sequence[str]) -> dict[str, torch.Tensor]:
    """W + alpha/r * B @ A with the rank/alpha of the adapter_config.json the worker saved."""
    import json

    from hybridflow.workers.engine.lora import ADAPTER_CONFIG, lora_scaling, merge_lora_weights

    for directory in search_dirs:
        path = os.path.join(directory, ADAPTER_CONFIG)
        if os.path.isfile(path):
            with open(path) as f:
                adapter = json.load(f)
            scaling = lora_scaling(float(adapter["lora_alpha"]), int(adapter["r"]), bool(adapter.get("use_rslora")))
            return merge_lora_weights(state, scaling)
    raise FileNotFoundError(f"the checkpoint holds LoRA adapters but no {ADAPTER_CONFIG} in {list(search_dirs)}")


def merge_checkpoint(
    local_dir: str, target_dir: str, backend: str = "fsdp", hf_model_path: str | None = None, dtype: str | None = None
) -> str:
    """Write a Hugging Face directory for the role checkpoint ``local_dir`` into ``target_dir``.

    Config, tokenizer and generation config come from ``local_dir/huggingface`` (or
    ``hf_model_path``); ``dtype`` (bf16/fp16/fp32) casts the weights, default: as trained.
    """
    check_backend(backend)
    state = load_dcp_model_state(local_dir)
    hf_dir = hf_model_path or os.path.join(local_dir, HF_DIR)
    if not os.path.isfile(os.path.join(hf_dir, "config.json")):
        raise FileNotFoundError(
            f"no config.json in {hf_dir!r}: the checkpoint was saved without a model config; "
            "pass --hf_model_path with the base model's directory"
        )
    if dtype is not None and dtype not in _DTYPES:
        raise ValueError(f"unknown --dtype {dtype!r}; use one of {', '.join(_DTYPES)}")
    if any(".lora_A." in key for key in state):  # a LoRA actor: fold the adapters into the base weights
        state = _fold_lora(state, [os.path.join(local_dir, HF_DIR), hf_dir])
    config = AutoConfig.from_pretrained(hf_dir)
    write_hf_model(state, config, target_dir, dtype=_DTYPES.get(dtype))
    _copy_side_files(hf_dir, target_dir)
    return target_dir


def convert_run(
    checkpoint_dir: str,
    target_root: str | None = None,
    backend: str = "fsdp",
    dtype: str | None = None,
    roles: Sequence[str] = ROLES,
) -> list[str]:
    """Merge every complete step's roles into ``<target_root>/global_step_N/hf_<role>``; returns new dirs.

    Each output is written to a tmp name and renamed when whole, so its existence means "done".
    """
    check_backend(backend)
    if not os.path.isdir(checkpoint_dir):
        raise FileNotFoundError(f"checkpoint directory {checkpoint_dir!r} does not exist")
    steps = complete_steps(checkpoint_dir)
    if not steps:
        raise ValueError(f"{checkpoint_dir!r} holds no complete global_step_<N> checkpoint")
    root = target_root or checkpoint_dir
    written = []
    for step, step_path in steps.items():
        for role in roles:
            src = os.path.join(step_path, role)
            dst = os.path.join(root, step_dir_name(step), f"hf_{role}")
            if not os.path.isdir(src) or os.path.isdir(dst):
                continue
            with folder_written_atomically(dst) as tmp:
                merge_checkpoint(src, tmp, backend=backend, dtype=dtype)
            logger.info("converted %s -> %s", src, dst)
            written.append(dst)
    return written


def convert_gguf(gguf_file: str, target_dir: str, dtype: str = "float32") -> str:
    """``gguf_file`` dequantized into ``target_dir`` (written beside it first, then renamed into place)."""
    from hybridflow.workers.gguf_model import write_hf_folder_from_gguf

    if not os.path.isfile(gguf_file):
        raise FileNotFoundError(f"--gguf_file {gguf_file!r} does not exist")
    if os.path.exists(target_dir) and os.listdir(target_dir):
        raise ValueError(f"--target_dir {target_dir!r} exists and is not empty")
    with folder_written_atomically(target_dir) as tmp:
        write_hf_folder_from_gguf(gguf_file, tmp, dtype=_DTYPES[dtype], key="--gguf_file")
        if os.path.isdir(target_dir):
            os.rmdir(target_dir)  # empty (checked above)
    logger.info("converted %s -> %s", gguf_file, target_dir)
    return target_dir


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m hybridflow.model_merger", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="operation", required=True)
    merge = sub.add_parser("merge", help="one role checkpoint (global_step_N/actor) -> a Hugging Face directory")
    merge.add_argument("--local_dir", required=True, help="e.g. checkpoints/proj/exp/global_step_10/actor")
    merge.add_argument("--target_dir", required=True)
    merge.add_argument("--hf_model_path", default=None, help="config/tokenizer source if the checkpoint has none")
    convert = sub.add_parser("convert", help="every global_step_N/{actor,critic} of a run, skipping converted ones")
    convert.add_argument("--checkpoint_dir", required=True, help="the run's trainer.default_local_dir")
    convert.add_argument("--target_root", default=None, help="default: the checkpoint dir itself")
    for p in (merge, convert):
        p.add_argument("--backend", default="fsdp", help="fsdp (megatron is not supported)")
        p.add_argument("--dtype", default=None, help="cast weights to bf16/fp16/fp32 (default: as trained)")
    gguf = sub.add_parser("gguf", help="a GGUF file -> a plain Hugging Face directory (dequantized safetensors)")
    gguf.add_argument("--gguf_file", required=True, help="e.g. model.Q4_K_M.gguf")
    gguf.add_argument("--target_dir", required=True)
    gguf.add_argument("--dtype", default="float32", choices=sorted(_DTYPES), help="dtype of the written weights")
    args = parser.parse_args(argv)
    setup_cli_logging()
    try:
        if args.operation == "merge":
            out = merge_checkpoint(
                args.local_dir,
                args.target_dir,
                backend=args.backend,
                hf_model_path=args.hf_model_path,
                dtype=args.dtype,
            )
            print(f"wrote Hugging Face model to {out}")
        elif args.operation == "gguf":
            out = convert_gguf(args.gguf_file, args.target_dir, dtype=args.dtype)
            print(f"wrote Hugging Face model to {out}")
        else:
            written = convert_run(args.checkpoint_dir, args.target_root, backend=args.backend, dtype=args.dtype)
            print(f"converted {len(written)} checkpoint(s)" + "".join(f"\n  {w}" for w in written))
    except (FileNotFoundError, ValueError, ImportError) as err:
        parser.exit(2, f"error: {err}\n")


if __name__ == "__main__":
    main(sys.argv[1:])
