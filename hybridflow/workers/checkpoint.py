"""Engine checkpoints, written and read by every rank together (collective calls).

Model and optimizer go through torch.distributed.checkpoint (DCP): each rank writes its own shards
(FSDP2 DTensors) or, unsharded, the whole tensors, and DCP reshards on load, so a checkpoint saved
on N ranks resumes on M ranks and is read by the model merger without any process group.

Layout of ``local_path`` (one role, e.g. ``global_step_7/actor``)::

    dcp/                                      model + optimizer (DCP: .metadata + __*_*.distcp)
    extra_state_world_size_{W}_rank_{r}.pt    lr scheduler, RNG states, the caller's extra_state
    huggingface/                              config, tokenizer, generation config (rank 0);
                                              full weights too when save_contents has 'hf_model'
"""

from __future__ import annotations

import contextlib
import copy
import glob
import logging
import os
import random
import re
import warnings
from collections.abc import Iterable
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_state_dict,
)

from hybridflow.utils.safe_load import SafeMetadataReader, load_torch_file

logger = logging.getLogger(__name__)

DCP_DIR = "dcp"
HF_DIR = "huggingface"
DEFAULT_CONTENTS = ("model", "optimizer", "extra")
KNOWN_CONTENTS = frozenset(("model", "optimizer", "extra", "hf_model"))
_EXTRA_RE = re.compile(r"extra_state_world_size_(\d+)_rank_(\d+)\.pt$")


def _rank_world() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _check_contents(contents: Iterable[str], what: str) -> set[str]:
    contents = set(contents)
    unknown = contents - KNOWN_CONTENTS
    if unknown:
        raise ValueError(f"unknown checkpoint {what} {sorted(unknown)}; known: {sorted(KNOWN_CONTENTS)}")
    return contents


@contextlib.contextmanager
def quiet_no_pg():
    """DCP warns each time it runs without a process group; for us that is an intended mode."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninitialized")
        yield


def extra_state_path(local_path: str, world_size: int, rank: int) -> str:
    return os.path.join(local_path, f"extra_state_world_size_{world_size}_rank_{rank}.pt")


# --- RNG ------------------------------------------------------------------------------------------
def get_rng_state() -> dict[str, Any]:
    state = {"cpu": torch.get_rng_state(), "numpy": np.random.get_state(), "random": random.getstate()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()  # this rank's device only
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["cpu"])
    np.random.set_state(state["numpy"])
    random.setstate(state["random"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


# --- Hugging Face directory -----------------------------------------------------------------------
def _hf_class_name(module: torch.nn.Module) -> str | None:
    """The transformers class under wrappers (FSDP2 subclasses it as ``FSDP<Name>``; DDP holds it)."""
    if isinstance(module, torch.nn.parallel.DistributedDataParallel):
        module = module.module
    for cls in type(module).__mro__:
        if cls.__module__.startswith("transformers."):
            return cls.__name__
    return None


def _config_for_save(hf_config, module: torch.nn.Module):
    """A copy of the config that names the model class, so the merger can rebuild the right head."""
    config = copy.deepcopy(hf_config)
    if not getattr(config, "architectures", None):
        name = _hf_class_name(module)
        if name is not None:
            config.architectures = [name]
    return config


def write_hf_model(
    state_dict: dict[str, torch.Tensor], config, target_dir: str, dtype: torch.dtype | None = None
) -> None:
    """Write ``config.json`` + safetensors for ``state_dict`` (full, unwrapped names) into ``target_dir``.

    The model is built on the meta device (no random init of a large model) and takes the given
    tensors as its parameters; tied weights are re-tied so save_pretrained stores them once.
    """
    import transformers

    config = copy.deepcopy(config)
    arch = (getattr(config, "architectures", None) or [None])[0]
    model_cls = getattr(transformers, arch, None) if arch else None
    if model_cls is None:
        logger.warning("config names no known architecture (%r); writing it as AutoModelForCausalLM", arch)
        model_cls = transformers.AutoModelForCausalLM
    if dtype is not None:
        state_dict = {k: v.to(dtype) if v.is_floating_point() else v for k, v in state_dict.items()}
    float_dtypes = {v.dtype for v in state_dict.values() if v.is_floating_point()}
    if len(float_dtypes) == 1:  # loaders default to the config's dtype: make it the stored one
        config.dtype = next(iter(float_dtypes))
    with torch.device("meta"):
        model = model_cls.from_config(config) if model_cls is transformers.AutoModelForCausalLM else model_cls(config)
    result = model.load_state_dict(state_dict, strict=False, assign=True)
    model.tie_weights()
    missing = [k for k, v in model.state_dict().items() if v.is_meta]  # not given and not tied to a given one
    if missing or result.unexpected_keys:
        raise ValueError(
            f"checkpoint does not match {model_cls.__name__}: missing {missing[:5]}, "
            f"unexpected {list(result.unexpected_keys)[:5]}"
        )
    os.makedirs(target_dir, exist_ok=True)
    model.save_pretrained(target_dir, safe_serialization=True)


def _save_hf_files(local_path: str, config, tokenizer, generation_config) -> None:
    hf_dir = os.path.join(local_path, HF_DIR)
    os.makedirs(hf_dir, exist_ok=True)
    if config is not None:
        config.save_pretrained(hf_dir)
    if tokenizer is not None:
        tokenizer.save_pretrained(hf_dir)
    if generation_config is not None:
        generation_config.save_pretrained(hf_dir)


# --- save / load ----------------------------------------------------------------------------------
def save_engine_checkpoint(
    engine,
    local_path: str,
    hf_config=None,
    tokenizer=None,
    extra_state: dict | None = None,
    save_contents: Iterable[str] = DEFAULT_CONTENTS,
) -> None:
    """Save ``engine`` (a TrainEngine) under ``local_path``. Every rank must call it."""
    contents = _check_contents(save_contents, "save_contents")
    rank, world = _rank_world()
    os.makedirs(local_path, exist_ok=True)

    if "model" in contents or "optimizer" in contents:
        if "optimizer" in contents and engine.optimizer is not None:
            model_sd, optim_sd = get_state_dict(engine.module, engine.optimizer)
            state = {"model": model_sd, "optimizer": optim_sd}
        else:
            state = {"model": get_model_state_dict(engine.module)}
        with quiet_no_pg():
            dcp.save(state, checkpoint_id=os.path.join(local_path, DCP_DIR))

    if "extra" in contents:
        scheduler = engine.lr_scheduler.state_dict() if engine.lr_scheduler is not None else None
        torch.save(
            {"lr_scheduler": scheduler, "rng": get_rng_state(), "extra_state": extra_state},
            extra_state_path(local_path, world, rank),
        )

    module = engine.module
    if hf_config is None:
        hf_config = getattr(engine.unwrapped, "config", None)
    config = _config_for_save(hf_config, module) if hf_config is not None else None
    if "hf_model" in contents:
        if config is None:
            raise ValueError("save_contents has 'hf_model' but no hf_config was given and the model has none")
        # collective: every rank gathers, rank 0 writes
        full = get_model_state_dict(module, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if rank == 0:
            write_hf_model(full, config, os.path.join(local_path, HF_DIR))
    if rank == 0:
        _save_hf_files(local_path, config, tokenizer, getattr(engine.unwrapped, "generation_config", None))
    if world > 1:
        dist.barrier()  # the call returns only once the whole checkpoint is on disk


def _find_extra_state(local_path: str, rank: int, world: int) -> str | None:
    exact = extra_state_path(local_path, world, rank)
    if os.path.exists(exact):
        return exact
    # saved on a different number of ranks: scheduler state is the same on every rank, so take the
    # matching rank if there is one, else rank 0 (RNG streams then differ from an uninterrupted run)
    found = {}
    for p in glob.glob(os.path.join(local_path, "extra_state_world_size_*_rank_*.pt")):
        m = _EXTRA_RE.search(os.path.basename(p))
        if m:
            found[int(m.group(2))] = p
    if not found:
        return None
    logger.warning(
        "no extra state for world size %d in %s; using one saved with a different world size", world, local_path
    )
    return found.get(rank, found.get(0, next(iter(found.values()))))


def _has_optimizer_state(dcp_path: str) -> bool:
    metadata = SafeMetadataReader(dcp_path).read_metadata()
    return any(key.startswith("optimizer.") for key in metadata.state_dict_metadata)


def load_engine_checkpoint(engine, local_path: str, load_contents: Iterable[str] = DEFAULT_CONTENTS) -> dict | None:
    """Restore what ``save_engine_checkpoint`` wrote; returns the caller's ``extra_state`` (or None).

    Every rank must call it. The world size may differ from the one that saved (DCP reshards).
    """
    contents = _check_contents(load_contents, "load_contents")
    rank, world = _rank_world()
    if not os.path.isdir(local_path):
        raise FileNotFoundError(f"checkpoint directory {local_path!r} does not exist")

    if "model" in contents or "optimizer" in contents:
        dcp_path = os.path.join(local_path, DCP_DIR)
        if not os.path.exists(os.path.join(dcp_path, ".metadata")):
            raise FileNotFoundError(f"{local_path!r} holds no model checkpoint ({DCP_DIR}/.metadata is missing)")
        if "optimizer" in contents and engine.optimizer is not None:
            if not _has_optimizer_state(dcp_path):
                raise ValueError(
                    f"{local_path!r} was saved without optimizer state; "
                    "leave 'optimizer' out of load_contents to load the weights only"
                )
            model_sd, optim_sd = get_state_dict(engine.module, engine.optimizer)
            state = {"model": model_sd, "optimizer": optim_sd}
            with quiet_no_pg():
                dcp.load(state, storage_reader=SafeMetadataReader(dcp_path))
            set_state_dict(
                engine.module, engine.optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"]
            )
        else:
            state = {"model": get_model_state_dict(engine.module)}
            with quiet_no_pg():
                dcp.load(state, storage_reader=SafeMetadataReader(dcp_path))
            set_model_state_dict(engine.module, state["model"])

    extra_state = None
    if "extra" in contents:
        path = _find_extra_state(local_path, rank, world)
        if path is None:
            raise FileNotFoundError(f"{local_path!r} holds no extra_state_world_size_*_rank_*.pt")
        saved = load_torch_file(path)  # weights_only: a replaced file cannot run code
        if engine.lr_scheduler is not None and saved.get("lr_scheduler") is not None:
            engine.lr_scheduler.load_state_dict(saved["lr_scheduler"])
        set_rng_state(saved["rng"])
        extra_state = saved.get("extra_state")
    if world > 1:
        dist.barrier()
    return extra_state
