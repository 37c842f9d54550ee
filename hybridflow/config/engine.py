"""The training engine's section (``fsdp_config`` of the actor and ref, ``critic.fsdp``; veRL's
engine/fsdp.yaml): sharding, offload, precision and determinism of the FSDP2/DDP engine."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

from hybridflow.config.base import BaseConfig, doc, section, unset
from hybridflow.config.reasons import SP, speed_only
from hybridflow.config.status import noted

__all__ = [
    "MixedPrecisionConfig",
    "QATConfig",
    "QATEngineConfig",
    "FSDPEngineConfig",
    "engine_as_in_yaml",
    "fsdp_size_problem",
]

MODEL_DTYPES = ("fp32", "float32", "bf16", "bfloat16", "fp16", "float16")
_FSDP_SPEED = speed_only("FSDP wrapping/prefetch, torch.compile, chunked entropy, padding buckets")
_OFFLOAD = "CUDA only; on cpu parameters and optimizer state already live in host memory"
_DETERMINISM = (
    "deterministic kernels, cuBLAS/flash-attn/NCCL switches and seeded generators in the worker process "
    "(seed: used only then); see README, Reproducibility"
)
_SET_BY_WORKER = "set by veRL's worker; hybridflow's worker decides (strategy: the section's strategy key)"

_TURBO = {
    "distributed": {
        "fully_shard_parallel_size": 16,
        "tensor_parallel_size": 1,
        "expert_parallel_size": 1,
        "expert_fully_shard_parallel_size": 1,
        "ulysses_parallel_size": 1,
        "fsdp_plan": {
            "param_dtype": "bf16",
            "reduce_dtype": "fp32",
            "output_dtype": "bf16",
            "fsdp_implementation": "native",
            "num_to_forward_prefetch": 1,
            "num_to_backward_prefetch": 1,
        },
    }
}


@dataclass
class MixedPrecisionConfig(BaseConfig):
    """``fsdp_config.mixed_precision`` (hybridflow's; veRL reads the dict when it is added)."""

    param_dtype: str = doc("auto", "compute dtype: auto (bf16 on CUDA, fp32 on cpu), bf16, fp16, fp32")
    reduce_dtype: str = doc("fp32", "dtype of the gradient reduction")
    buffer_dtype: str = doc(
        "fp32", "dtype of the buffers (hybridflow: fp32)", values=("fp32", "float32"), reason="buffers stay in fp32"
    )


@dataclass
class QATConfig(BaseConfig):
    """Quantization-aware training (``actor.qat``; not implemented by hybridflow, refused when enabled)."""

    enable: bool = doc(False, "train with fake-quantized weights")
    mode: str = doc("w4a16", "w4a16 | w4a4")
    group_size: int = doc(16, "block size of the quantization")
    ignore_patterns: list[str] = doc(["lm_head", "embed_tokens", "re:.*mlp.gate$"], "modules left unquantized")
    activation_observer: str = doc("static_minmax", "w4a4: how activation scales are observed")
    quantization_config_path: str | None = doc(None, "a quantization config json for the rollout engine")


@dataclass
class QATEngineConfig(QATConfig):
    """``fsdp_config.qat``: the engine's copy of the QAT settings."""

    _target_: str = doc("verl.workers.config.QATEngineConfig", "the class this section is read into")


@dataclass
class FSDPEngineConfig(BaseConfig):
    """The FSDP2/DDP training engine of a role."""

    # the worker adjusts these for the role it builds (veRL's mutable engine fields)
    _mutable_fields = {"forward_only", "param_offload", "ulysses_sequence_parallel_size", "strategy"}

    _target_: str = doc("verl.workers.config.FSDPEngineConfig", "the class this section is read into")
    wrap_policy: dict = doc({}, "FSDP auto-wrap policy", keys={"min_num_params": noted(_FSDP_SPEED)})
    param_offload: bool = doc(False, "keep parameters in host memory between phases (CUDA)", reason=_OFFLOAD)
    optimizer_offload: bool = doc(False, "keep optimizer state in host memory between phases (CUDA)", reason=_OFFLOAD)
    offload_policy: bool = doc(False, "fsdp2: CPU offload policy of fully_shard", reason=_OFFLOAD)
    reshard_after_forward: bool | int = doc(True, "fsdp2: reshard after forward (True, False or a group size)")
    fsdp_size: int = doc(
        -1,
        "hybrid-sharding group size; -1: the whole world",
        reason="hybrid sharding (HSDP): groups of fsdp_size ranks shard the parameters, the groups replicate one "
        "another; -1: one group",
    )
    forward_prefetch: bool = doc(False, "prefetch the next layer's parameters in forward", note=_FSDP_SPEED)
    model_dtype: str = doc(
        "fp32",
        "dtype the weights are loaded and kept in (the optimizer's master weights when they train)",
        values=MODEL_DTYPES,
        reason="fp32: float32 masters, computed in mixed_precision.param_dtype; bf16/fp16: the weights, their "
        "gradients and AdamW's moments in that dtype, as veRL (less memory, coarser updates)",
    )
    use_orig_params: bool = doc(False, "FSDP1's use_orig_params", note=_FSDP_SPEED)
    seed: int = doc(42, "seed of the worker's generators when full_determinism is on", reason=_DETERMINISM)
    full_determinism: bool = doc(False, "deterministic kernels, seeded generators (slower)", reason=_DETERMINISM)
    ulysses_sequence_parallel_size: int = doc(1, "Ulysses sequence-parallel size (1: off)", reason=SP)
    entropy_from_logits_with_chunking: bool = doc(False, "compute the entropy in chunks", note=_FSDP_SPEED)
    entropy_from_logits_chunk_size: int = doc(2048, "tokens per entropy chunk", note=_FSDP_SPEED)
    use_torch_compile: bool = doc(True, "torch.compile the hot functions", note=_FSDP_SPEED)
    entropy_checkpointing: bool = doc(False, "recompute the entropy in backward", note=_FSDP_SPEED)
    use_no_sync_for_gradient_accumulation: bool = doc(True, "sync gradients at the last micro-batch", note=_FSDP_SPEED)
    pad_to_length: bool = doc(False, "pad packed micro-batches to bucket multiples", note=_FSDP_SPEED)
    pad_to_length_bucket: int = doc(1024, "padding granularity of pad_to_length, in tokens", note=_FSDP_SPEED)
    forward_only: bool = doc(False, "forward passes only (the reference policy)", refused=_SET_BY_WORKER)
    strategy: str = doc("fsdp", "set by the worker from the role's strategy", refused=_SET_BY_WORKER)
    dtype: str = doc(
        "bfloat16",
        "veRL's compute dtype (hybridflow: the workers' is mixed_precision.param_dtype; SFT: auto, bf16 on CUDA)",
        refused="the compute dtype is fsdp_config.mixed_precision.param_dtype (auto: bf16 on CUDA, fp32 on cpu)",
    )
    mixed_precision: MixedPrecisionConfig | None = section(unset, "compute, reduce and buffer dtypes (null: defaults)")
    qat: QATEngineConfig = section(QATEngineConfig, "QAT", refused="quantization-aware training is not implemented")
    turbo_config: dict = doc({}, "FSDP-turbo settings", refused="veRL's FSDP-turbo engine is not implemented")


def fsdp_size_problem(fsdp_size: int, world_size: int, key: str) -> str | None:
    """What is wrong with ``fsdp_size`` (veRL's rule) for ``world_size`` training ranks, named by ``key``; None
    when nothing is: a negative size or one not below the world shards over all ranks, a smaller one must
    divide it."""
    if fsdp_size == 0:
        return f"{key}=0 must be -1 (shard over all ranks) or a positive group size"
    if 0 < fsdp_size < world_size and world_size % fsdp_size:
        return (
            f"{key}={fsdp_size} must divide the number of training ranks ({world_size}), or be -1 to shard over "
            "all of them"
        )
    return None


def engine_as_in_yaml(**values: Any) -> FSDPEngineConfig:
    """An engine section with veRL's yaml values (engine/fsdp.yaml) where they differ from its dataclass
    defaults: wrap_policy ``{min_num_params: 0}``, no ``no_sync`` deferral, the FSDP-turbo block."""
    base = {
        "wrap_policy": {"min_num_params": 0},
        "use_no_sync_for_gradient_accumulation": False,
        "turbo_config": copy.deepcopy(_TURBO),
        "mixed_precision": MixedPrecisionConfig(),
    }
    return FSDPEngineConfig(**{**base, **values})
