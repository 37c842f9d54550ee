"""LoRA adapters (peft) for the training engine: ``model.lora_rank`` / ``lora_alpha`` / ``target_modules``.

Only the adapters train (the optimizer sees only ``requires_grad`` parameters). Three uses of the
same weights, with no second copy of the base model:

- policy: the peft model as is (base + adapters);
- reference policy: the same module under ``adapters_disabled`` (the base model's log-probs);
- rollout engine, two ways (``model.lora.merge``, veRL's key): merged, where ``merge_lora_stream``
  folds W + scale * B @ A into plain Hugging Face weights (the training model is never modified), or
  as an adapter (veRL's default), where ``split_lora_stream`` gives the frozen base weights once and
  the adapter tensors (peft's saved names) at every sync, and the engine serves base + adapter.

Checkpoints keep peft's parameter names; ``adapter_config.json`` is written next to the config so
that the model merger can fold the adapters in too.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from hybridflow.config.model import HFModelConfig

__all__ = [
    "LoraSpec",
    "lora_spec",
    "apply_lora",
    "adapters_disabled",
    "merge_lora_weights",
    "lora_scaling",
    "peft_model_of",
    "ADAPTER_CONFIG",
    "is_adapter_tensor",
    "split_lora_stream",
    "rollout_gets_adapter",
    "write_adapter_weights",
]

ADAPTER_CONFIG = "adapter_config.json"
_PEFT_PREFIX = "base_model.model."


@dataclass(frozen=True)
class LoraSpec:
    rank: int
    alpha: float = 16.0
    target_modules: Any = "all-linear"  # "all-linear" or a list of module names
    adapter_name: str = "default"
    exclude_modules: Any = None  # module names or a regex that target_modules must skip (peft's)
    adapter_path: str | None = None  # a saved peft adapter to continue training (its own r/alpha/targets)
    task_type: str = "CAUSAL_LM"  # peft's task; TOKEN_CLS (the critic) also trains the value head in full


def lora_spec(
    model: HFModelConfig, section: str = "actor_rollout_ref.model", task_type: str = "CAUSAL_LM"
) -> LoraSpec | None:
    """The LoRA of a typed model section (``section``: its place in the config, for messages): None unless
    ``lora_rank > 0`` or ``lora_adapter_path`` is set. A saved adapter brings its own rank, alpha and targets,
    read from its ``adapter_config.json``, so merging and serving scale it as it was trained."""
    path, exclude = model.lora_adapter_path, model.exclude_modules
    if path:
        saved = read_adapter_config(str(path), f"{section}.lora_adapter_path")
        return LoraSpec(
            rank=int(saved["r"]),
            alpha=float(saved["lora_alpha"]),
            target_modules=saved.get("target_modules") or "all-linear",
            exclude_modules=exclude,
            adapter_path=str(path),
            task_type=task_type,
        )
    if model.lora_rank <= 0:
        return None
    target = model.target_modules if isinstance(model.target_modules, str) else list(model.target_modules)
    return LoraSpec(
        rank=int(model.lora_rank),
        alpha=float(model.lora_alpha),
        target_modules=target,
        exclude_modules=exclude,
        task_type=task_type,
    )


def read_adapter_config(path: str, key: str = "actor_rollout_ref.model.lora_adapter_path") -> dict:
    """A saved peft adapter's ``adapter_config.json``; errors name ``key``."""
    import json
    import os

    config_file = os.path.join(os.path.expanduser(path), ADAPTER_CONFIG)
    if not os.path.isfile(config_file):
        raise FileNotFoundError(
            f"{key}={path!r}: no {ADAPTER_CONFIG} there (a folder written by peft's save_pretrained)"
        )
    with open(config_file) as f:
        saved = json.load(f)
    if saved.get("peft_type", "LORA") != "LORA" or saved.get("use_dora") or saved.get("use_rslora"):
        raise ValueError(
            f"{key}={path!r}: only plain LoRA adapters are supported "
            f"(peft_type={saved.get('peft_type')!r}, use_dora={saved.get('use_dora')}, "
            f"use_rslora={saved.get('use_rslora')})"
        )
    return saved


def rollout_gets_adapter(model: HFModelConfig, rollout_name: str) -> bool:
    """True when a LoRA policy reaches its rollout engine as base weights + adapter rather than merged.

    veRL's ``model.lora.merge`` (default false: adapter) decides for engines that serve adapters
    (vllm); the hf engine runs a plain module and always gets merged weights.
    """
    lora_on = model.lora_rank > 0 or bool(model.lora_adapter_path)
    if not lora_on or rollout_name != "vllm":
        return False
    return not bool((model.lora or {}).get("merge", False))


def apply_lora(module: nn.Module, spec: LoraSpec) -> nn.Module:
    """Wrap a Hugging Face causal LM with fresh LoRA adapters (B = 0: the wrapped model starts equal
    to the base model), or with the saved adapter at ``spec.adapter_path``; every base parameter is frozen."""
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError as err:  # pragma: no cover - peft is a declared dependency of the lora extra
        raise ImportError("model.lora_rank > 0 needs peft: pip install 'hybridflow[lora]'") from err

    if spec.adapter_path:  # continue training a saved adapter (veRL's model.lora_adapter_path)
        from peft import PeftModel

        return PeftModel.from_pretrained(module, spec.adapter_path, adapter_name=spec.adapter_name, is_trainable=True)
    config = LoraConfig(
        r=spec.rank,
        lora_alpha=spec.alpha,
        target_modules=spec.target_modules,
        exclude_modules=_without_the_head(spec.exclude_modules)
        if spec.task_type == "TOKEN_CLS"
        else spec.exclude_modules,
        bias="none",
        task_type=spec.task_type,  # TOKEN_CLS: peft keeps a trainable copy of the value head (score)
    )
    return get_peft_model(module, config, adapter_name=spec.adapter_name)


_HEADS = ("score", "classifier")  # peft's names of a token-classification head (trained in full, not adapted)


def _without_the_head(exclude: Any) -> Any:
    """``exclude_modules`` that also keeps LoRA off the value head (all-linear would adapt it, and peft cannot
    both adapt a layer and train it in full): a list gains the head's names, a regex an alternative."""
    if exclude is None:
        return list(_HEADS)
    if isinstance(exclude, str):
        return rf"(?:{exclude})|(?:.*\.)?(?:{'|'.join(_HEADS)})"
    return [*exclude, *_HEADS]


def peft_model_of(module: nn.Module):
    """The PeftModel under a DDP wrapper (FSDP2 wraps in place), or None when there is none."""
    if isinstance(module, nn.parallel.DistributedDataParallel):
        module = module.module
    return module if hasattr(module, "disable_adapter") and hasattr(module, "peft_config") else None


@contextlib.contextmanager
def adapters_disabled(module: nn.Module):
    """Run ``module`` as its base model (the reference policy of a LoRA actor)."""
    peft_model = peft_model_of(module)
    if peft_model is None:
        raise ValueError("adapters_disabled needs a peft (LoRA) model")
    with peft_model.disable_adapter():
        yield


def lora_scaling(alpha: float, rank: int, use_rslora: bool = False) -> float:
    """peft's scale of B @ A: alpha / r (alpha / sqrt(r) with rank-stabilised LoRA)."""
    return alpha / math.sqrt(rank) if use_rslora else alpha / rank


def merge_lora_weights(
    state_dict: dict[str, torch.Tensor], scaling: float, adapter_name: str = "default"
) -> dict[str, torch.Tensor]:
    """peft-named full weights -> plain Hugging Face names with each adapter folded into its base layer.

    ``...q_proj.base_layer.weight`` + ``scaling * lora_B @ lora_A`` -> ``...q_proj.weight``. Pure: the
    inputs are not modified. Only linear LoRA layers (lora_A/lora_B) are supported.
    """
    a_suffix, b_suffix = f"lora_A.{adapter_name}.weight", f"lora_B.{adapter_name}.weight"
    out: dict[str, torch.Tensor] = {}
    deltas: dict[str, torch.Tensor] = {}
    for key, value in state_dict.items():
        if "lora_embedding_" in key or "lora_magnitude_vector" in key:
            raise ValueError(f"cannot merge {key!r}: only linear LoRA layers are supported")
        if key.endswith(a_suffix):
            prefix = key[: -len(a_suffix)]
            lora_b = state_dict[prefix + b_suffix]
            deltas[prefix + "base_layer.weight"] = (lora_b.float() @ value.float()) * scaling  # (out, in)
        elif ".lora_" in key:
            continue  # lora_B (used above), dropout-free extras
        else:
            out[key] = value
    merged = {}
    for key, value in out.items():
        if key in deltas:
            value = (value.float() + deltas.pop(key)).to(value.dtype)
        if (name := _plain_name(key, adapter_name)) is not None:
            merged[name] = value
    if deltas:
        raise ValueError(f"LoRA adapters without a base weight: {sorted(deltas)[:3]}")
    return merged


def merge_lora_stream(
    named_tensors: Iterable[tuple[str, torch.Tensor]], scaling: float, adapter_name: str = "default"
) -> Iterator[tuple[str, torch.Tensor]]:
    """Streaming ``merge_lora_weights``: peft-named (name, tensor) pairs in, plain Hugging Face names out,
    each adapted layer emitted as soon as its base weight, lora_A and lora_B have all been seen."""
    a_suffix, b_suffix = f"lora_A.{adapter_name}.weight", f"lora_B.{adapter_name}.weight"
    parts: dict[str, dict[str, torch.Tensor]] = {}  # layer prefix -> {"base", "a", "b"}
    for key, value in named_tensors:
        if "lora_embedding_" in key or "lora_magnitude_vector" in key:
            raise ValueError(f"cannot merge {key!r}: only linear LoRA layers are supported")
        if key.endswith(a_suffix):
            prefix, part = key[: -len(a_suffix)], "a"
        elif key.endswith(b_suffix):
            prefix, part = key[: -len(b_suffix)], "b"
        elif key.endswith("base_layer.weight"):
            prefix, part = key[: -len("base_layer.weight")], "base"
        elif ".lora_" in key:
            continue
        else:
            if (name := _plain_name(key, adapter_name)) is not None:
                yield name, value
            continue
        layer = parts.setdefault(prefix, {})
        layer[part] = value
        if len(layer) == 3:
            base = parts.pop(prefix)["base"]
            delta = (layer["b"].float() @ layer["a"].float()) * scaling  # (out, in)
            yield _hf_name(prefix + "base_layer.weight"), (base.float() + delta).to(base.dtype)
    if parts:
        raise ValueError(f"incomplete LoRA layers in the weight stream: {sorted(parts)[:3]}")


def write_adapter_weights(directory: str, tensors: dict[str, torch.Tensor]) -> None:
    """``directory/adapter_model.safetensors`` as peft's ``save_pretrained`` writes it (peft's saved names, as
    ``split_lora_stream`` gives them); with ``adapter_config.json`` beside it, ``PeftModel.from_pretrained``
    and ``model.lora_adapter_path`` read the folder."""
    import os

    from safetensors.torch import save_file

    os.makedirs(directory, exist_ok=True)
    save_file({k: v.contiguous() for k, v in tensors.items()}, os.path.join(directory, "adapter_model.safetensors"))


def is_adapter_tensor(name: str) -> bool:
    """A LoRA A/B matrix under peft's names (the adapter part of a weight stream)."""
    return ".lora_A." in name or ".lora_B." in name


def split_lora_stream(
    named_tensors: Iterable[tuple[str, torch.Tensor]], adapter_name: str = "default", with_base: bool = True
) -> Iterator[tuple[str, torch.Tensor]]:
    """peft-named (name, tensor) pairs -> the base weights under plain Hugging Face names (only when
    ``with_base``) and the adapter's A/B matrices under the names peft saves them with
    (``...q_proj.lora_A.weight``, adapter name dropped), unmerged."""
    for key, value in named_tensors:
        if "lora_embedding_" in key or "lora_magnitude_vector" in key:
            raise ValueError(f"cannot serve {key!r} as an adapter: only linear LoRA layers are supported")
        if is_adapter_tensor(key):
            if key.endswith(f".{adapter_name}.weight"):
                yield key[: -len(f".{adapter_name}.weight")] + ".weight", value
        elif ".lora_" in key:
            continue
        elif with_base and (name := _plain_name(key, adapter_name)) is not None:
            yield name, value


def _plain_name(key: str, adapter_name: str) -> str | None:
    """A peft name of a weight that is not a LoRA matrix under its Hugging Face name; None for the frozen original
    of a module peft trains in full (``modules_to_save``: the critic's value head), whose trained copy counts."""
    if ".original_module." in key:
        return None
    return _hf_name(key.replace(f".modules_to_save.{adapter_name}.", "."))


def _hf_name(key: str) -> str:
    if key.startswith(_PEFT_PREFIX):
        key = key[len(_PEFT_PREFIX) :]
    return key.replace(".base_layer.", ".")
