"""The typed rollout section (``RolloutConfig``) -> vLLM engine arguments, checked once before vLLM starts.

Pure: no vLLM import, so every rule here is tested without the engine. What it decides:

- ``dtype: auto`` is float32 on CPU, bfloat16 on CUDA (vLLM's own "auto" picks bf16 on CPU too).
- ``load_format: dummy*`` (veRL's ``dummy``, ``dummy_dtensor``, ``dummy_hf``) starts from random
  weights: the trainer must push its weights before the first generation (the server refuses until
  then). Any other value loads the checkpoint at ``model_path``.
- ``max_model_len: null`` is the model's ``max_position_embeddings`` (veRL's rule); a larger value is
  an error.
- ``enable_chunked_prefill: False`` raises ``max_num_batched_tokens`` to ``max_model_len`` (veRL's rule).
  On CPU chunked prefill is always off: sampled requests carry their own seeds, and when vLLM's CPU build
  chunks a seeded prompt it rewinds the request's generator by an offset that CPU generators do not have
  ("CPU Generator does not use offset"): the engine died as soon as a step's prompts passed
  ``max_num_batched_tokens`` (SmolLM2, 8 prompts x 16 samples of ~100 tokens against 8192).
- ``free_cache_engine`` turns on vLLM's sleep mode on CUDA; CPU has no sleep mode (sleep/wake_up are
  no-ops there).
- KV cache: on CPU its size is an explicit byte budget, ``engine_kwargs.vllm.kv_cache_memory_bytes``
  (vLLM's own argument; on CPU ``gpu_memory_utilization`` would reserve that fraction of the
  machine's RAM). Unset on CPU it is enough for ``max_num_seqs`` full-length sequences, at most
  ``DEFAULT_CPU_KV_CACHE_BYTES`` unless one sequence needs more. On CUDA it is unset by default
  (``gpu_memory_utilization`` sizes it). A budget smaller than one ``max_model_len`` sequence is an error.
- ``tensor_model_parallel_size > 1`` needs that many visible GPUs; refused on CPU.
- ``lora_rank > 0`` (the spec's): LoRA adapters served on top of the base weights (one adapter).
- ``engine_kwargs.vllm`` is passed to vLLM as is (``None`` values dropped) and wins over the above.
- CPU threads: vLLM binds its worker process to cores of its choosing and sets its OMP_NUM_THREADS to
  their count; the trainer's thread variables (``CPU_ENGINE_UNSET_ENV``) are kept from its processes.
  vLLM keeps one core for its scheduler by default: half of a 2-core machine. A colocated engine
  (``rollout.nnodes=0``) generates while the trainer waits, so it gets every core
  (``VLLM_CPU_NUM_OF_RESERVED_CPU=0``, 1.5x the tokens/s on SmolLM2 with 2 cores) unless that
  variable is already set; an engine on a pool of its own keeps vLLM's default, leaving training a core.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any

from hybridflow.config.loader import ConfigError
from hybridflow.config.rollout import RolloutConfig, cpu_tensor_parallel_error
from hybridflow.utils.torch_dtypes import resolve_dtype

DEFAULT_CPU_KV_CACHE_BYTES = 512 << 20
# log-probs of the distribution the token was sampled from: softmax(logits / temperature), after any
# top-k/top-p filter (veRL's default too); without filters that is exactly what the trainer recomputes
LOGPROBS_MODE = "processed_logprobs"
WORKER_EXTENSION = "hybridflow.workers.rollout.vllm_weights.WeightSyncExtension"
LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # vLLM's allowed max_lora_rank values
# torch sizes its thread pool from MKL_NUM_THREADS before OMP_NUM_THREADS, so a trainer's MKL_NUM_THREADS=2
# overrode vLLM's per-worker OMP_NUM_THREADS=1: 2 spinning threads on the 1 core vLLM bound the worker to,
# 7x slower on SmolLM2 (docs/measurements.md, 2026-11-25); OMP_NUM_THREADS would size the engine core's pool
CPU_ENGINE_UNSET_ENV = ("MKL_NUM_THREADS", "OMP_NUM_THREADS")

_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "fp8": 1}
# veRL load formats that mean "the checkpoint at model_path" in vLLM's terms
_REAL_WEIGHT_FORMATS = {"hf": "auto", "dtensor": "auto", "megatron": "auto"}


@dataclass(frozen=True)
class ModelFacts:
    """What the settings need to know about the model, read from its ``config.json``."""

    architectures: tuple[str, ...]
    max_position_embeddings: int | None
    tie_word_embeddings: bool
    num_layers: int | None = None
    num_kv_heads: int | None = None
    head_dim: int | None = None

    @classmethod
    def from_model_dir(cls, model_path: str) -> ModelFacts:
        path = os.path.join(model_path, "config.json")
        if not os.path.isfile(path):
            raise FileNotFoundError(f"vllm rollout: no config.json in model_path {model_path!r}")
        with open(path) as f:
            cfg = json.load(f)
        text = cfg.get("text_config") or cfg  # multimodal configs nest the language model's
        heads = text.get("num_attention_heads")
        head_dim = text.get("head_dim") or (text["hidden_size"] // heads if heads and "hidden_size" in text else None)
        return cls(
            architectures=tuple(cfg.get("architectures") or ()),
            max_position_embeddings=text.get("max_position_embeddings"),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", text.get("tie_word_embeddings", False))),
            num_layers=text.get("num_hidden_layers"),
            num_kv_heads=text.get("num_key_value_heads") or heads,
            head_dim=head_dim,
        )

    def kv_bytes_per_token(self, dtype: str) -> int | None:
        """K and V of every layer for one token (plain attention; None when the config does not say)."""
        if not (self.num_layers and self.num_kv_heads and self.head_dim):
            return None
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * _DTYPE_BYTES.get(dtype, 4)


@dataclass(frozen=True)
class VLLMSettings:
    """Everything the server needs from the config, resolved for one device."""

    device: str
    dtype: str
    max_model_len: int
    sleep_mode: bool  # vLLM's enable_sleep_mode: free_cache_engine on CUDA
    dummy_weights: bool  # started from random weights: generation waits for the first weight push
    kv_cache_bytes: int | None
    engine_args: dict[str, Any] = field(default_factory=dict)  # AsyncEngineArgs(**engine_args)
    unset_env: tuple[str, ...] = ()  # variables removed from the environment vLLM's processes start with
    default_env: dict[str, str] = field(default_factory=dict)  # set for vLLM's processes where not set already


def vllm_settings(
    model_path: str,
    rollout: RolloutConfig,
    device: str,
    facts: ModelFacts,
    trust_remote_code: bool = False,
    cuda_devices: int = 0,
    lora_rank: int = 0,
) -> VLLMSettings:
    """Check the rollout section for this device and build vLLM's engine arguments.

    Raises ConfigError naming the key (``rollout.<key>``) for anything this device cannot do.
    """
    device = "cuda" if str(device).startswith("cuda") else "cpu"
    extra = {k: v for k, v in dict((rollout.engine_kwargs or {}).get("vllm") or {}).items() if v is not None}

    tp = rollout.tensor_model_parallel_size
    if device == "cpu" and (error := cpu_tensor_parallel_error(tp)):
        raise ConfigError(error)
    if tp > 1 and tp > cuda_devices:
        raise ConfigError(
            f"rollout.tensor_model_parallel_size={tp} needs {tp} GPUs visible to the rollout worker, "
            f"but it sees {cuda_devices}"
        )
    if device == "cpu" and extra.get("enable_sleep_mode"):
        raise ConfigError(
            "rollout.engine_kwargs.vllm.enable_sleep_mode=True: vLLM has no sleep mode on cpu "
            "(free_cache_engine is a no-op there)"
        )

    if rollout.full_determinism and device == "cpu":
        raise ConfigError(
            "rollout.full_determinism=True: vLLM's batch-invariant kernels need CUDA; on cpu the hf rollout "
            "(rollout.name=hf) gives it, decoding one sequence at a time"
        )
    dtype = resolve_dtype(rollout.dtype, device)
    max_pos = facts.max_position_embeddings
    max_model_len = rollout.max_model_len
    if max_model_len is None:
        if not max_pos:
            raise ConfigError(
                f"rollout.max_model_len is null and {model_path}/config.json has no "
                "max_position_embeddings; set rollout.max_model_len"
            )
        max_model_len = int(max_pos)
    max_model_len = int(max_model_len)
    if max_pos and max_model_len > max_pos:
        raise ConfigError(
            f"rollout.max_model_len={max_model_len} is larger than the model's max_position_embeddings ({max_pos})"
        )

    max_num_seqs = rollout.max_num_seqs
    max_batched = rollout.max_num_batched_tokens
    chunked = rollout.enable_chunked_prefill and device != "cpu"  # see the module docstring
    if not chunked and max_batched < max_model_len:
        max_batched = max_model_len  # vLLM needs a whole prompt in one batch without chunked prefill

    kv_bytes = extra.pop("kv_cache_memory_bytes", None)
    kv_dtype = dtype if extra.get("kv_cache_dtype", "auto") == "auto" else "fp8"
    per_token = facts.kv_bytes_per_token(kv_dtype)
    if kv_bytes is None and device == "cpu":
        one = per_token * max_model_len if per_token else 0
        kv_bytes = max(min(one * max_num_seqs or DEFAULT_CPU_KV_CACHE_BYTES, DEFAULT_CPU_KV_CACHE_BYTES), one)
    if kv_bytes is not None:
        kv_bytes = int(kv_bytes)
        needed = per_token * max_model_len if per_token else 0
        if kv_bytes < needed:
            raise ConfigError(
                f"KV cache budget {kv_bytes} bytes is too small for one sequence of max_model_len={max_model_len} "
                f"tokens ({needed} bytes at {per_token} bytes/token in {dtype}): raise "
                "rollout.engine_kwargs.vllm.kv_cache_memory_bytes or lower rollout.max_model_len"
            )

    load_format = rollout.load_format
    dummy = load_format.startswith("dummy")
    sleep_mode = rollout.free_cache_engine and device == "cuda"
    args: dict[str, Any] = dict(
        model=model_path,
        dtype=dtype,
        load_format="dummy" if dummy else _REAL_WEIGHT_FORMATS.get(load_format, load_format),
        tensor_parallel_size=tp,
        max_model_len=max_model_len,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_batched,
        enable_chunked_prefill=chunked,
        enable_prefix_caching=rollout.enable_prefix_caching,
        enforce_eager=rollout.enforce_eager,
        gpu_memory_utilization=rollout.gpu_memory_utilization,
        enable_sleep_mode=sleep_mode,
        disable_log_stats=rollout.disable_log_stats,
        seed=rollout.seed,
        trust_remote_code=bool(trust_remote_code),
        # token ids in, token ids out: the engine needs no tokenizer, and stops only where we say
        skip_tokenizer_init=True,
        logprobs_mode=LOGPROBS_MODE,
        worker_extension_cls=WORKER_EXTENSION,
    )
    if kv_bytes is not None:
        args["kv_cache_memory_bytes"] = kv_bytes
    if lora_rank > 0:  # one adapter (the policy's), rank rounded up to one vLLM compiles kernels for
        args.update(
            enable_lora=True, max_loras=1, max_lora_rank=next((r for r in LORA_RANKS if r >= lora_rank), lora_rank)
        )
    args.update(extra)
    return VLLMSettings(
        device=device,
        dtype=args["dtype"],
        max_model_len=max_model_len,
        sleep_mode=bool(args["enable_sleep_mode"]),
        dummy_weights=dummy,
        kv_cache_bytes=args.get("kv_cache_memory_bytes"),
        engine_args=args,
        unset_env=CPU_ENGINE_UNSET_ENV if device == "cpu" else (),
        default_env=_engine_env(rollout, device),
    )


def _engine_env(rollout: RolloutConfig, device: str) -> dict[str, str]:
    """Variables vLLM's processes start with (where not set): the CPU engine's reserved cores, and
    full_determinism's batch-invariant kernels (vLLM then pins its own cuBLAS/NCCL switches)."""
    env = {"VLLM_CPU_NUM_OF_RESERVED_CPU": "0"} if device == "cpu" and rollout.nnodes == 0 else {}
    if rollout.full_determinism:
        env["VLLM_BATCH_INVARIANT"] = "1"
    return env
