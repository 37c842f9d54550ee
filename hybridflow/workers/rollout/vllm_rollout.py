"""``vllm`` rollout engine (GPU): vLLM's offline ``LLM`` in the worker's own process.

vLLM is imported inside ``__init__`` only, so this module (and the registry entry) costs nothing on
machines without it. Install it with ``pip install hybridflow[vllm]``.

Weights: the hybrid engine calls ``load_weights`` with the trainer's full state dict between the
training and the generation phase. The tensors go straight into the vLLM model through its own
``load_weights`` (which knows the fused qkv/gate_up layouts and tied embeddings), via
``LLM.apply_model``; no file is written. With one GPU per engine (tensor_parallel_size=1) the engine
core is kept in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0`` unless the caller set it), so
that call is a plain in-process function call on the model: no copy through IPC.

Memory: with ``enable_sleep_mode`` (``free_cache_engine`` in the config), ``sleep(level=1)`` offloads
the weights and drops the KV cache while the trainer runs; ``wake_up()`` brings them back.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from typing import Any

import torch

from hybridflow.protocol import DataProto
from hybridflow.workers.rollout.base import (
    BaseRollout,
    NamedTensors,
    assemble_rollout_output,
    iter_named_tensors,
    register_rollout,
    response_mask_through_eos,
)
from hybridflow.workers.rollout.sampling import (
    SamplingParams,
    as_id_list,
    resolve_sampling,
    sampling_params_from_config,
)

INSTALL_HINT = "the vllm rollout needs vLLM: pip install hybridflow[vllm] (CUDA only)"


def _import_vllm():
    try:
        import vllm
    except ImportError as e:
        raise ImportError(f"{INSTALL_HINT} ({e})") from e
    return vllm


def _load_into_model(weights: list[tuple[str, torch.Tensor]], model: torch.nn.Module) -> int:
    # runs where the vLLM model lives (this process for tp=1); module level so it pickles for tp>1
    model.load_weights(weights)
    return len(weights)


@register_rollout("vllm")
class VLLMRollout(BaseRollout):
    """Generate with ``vllm.LLM``.

    Args:
        model_path: Hugging Face directory (config + tokenizer; weights too unless
            ``load_format: dummy``, in which case ``load_weights`` must run before generating).
        config: the rollout config section (veRL keys: tensor_model_parallel_size, dtype,
            gpu_memory_utilization, enforce_eager, free_cache_engine, max_model_len,
            max_num_batched_tokens, max_num_seqs, prompt_length, response_length, load_format,
            seed, calculate_log_probs, engine_kwargs.vllm, and the sampling keys).
        pad_token_id, eos_token_id: defaults for every call (meta_info may override them).
    """

    def __init__(
        self,
        model_path: str,
        config: Mapping[str, Any],
        pad_token_id: int,
        eos_token_id: int | list[int],
        trust_remote_code: bool = False,
    ):
        tp_size = int(config.get("tensor_model_parallel_size", 1))
        # the engine core in this process makes load_weights a direct call (see module docstring)
        if tp_size == 1:
            os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        else:  # apply_model sends a function to the worker processes
            os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
        vllm = _import_vllm()
        self._sampling_params_cls = vllm.SamplingParams

        self.train_params, self.val_params = sampling_params_from_config(config)
        self.pad_token_id = int(pad_token_id)
        self.eos_token_id = as_id_list(eos_token_id)
        self.calculate_log_probs = bool(config.get("calculate_log_probs", False))
        self.sleep_enabled = bool(config.get("free_cache_engine", True))

        max_model_len = config.get("max_model_len", None) or (
            int(config.get("prompt_length", 512)) + self.train_params.response_length
        )
        engine_kwargs = dict((config.get("engine_kwargs", None) or {}).get("vllm", None) or {})
        engine_kwargs = {k: v for k, v in engine_kwargs.items() if v is not None}
        # config conventions -> vLLM's: "auto" dtype is bfloat16 on CUDA here (vLLM's "auto" would pick
        # float16 for float32 checkpoints); veRL's dummy_* load formats are vLLM's "dummy" (random init,
        # the trainer's weights arrive through load_weights before the first generation)
        dtype = str(config.get("dtype", "auto"))
        load_format = str(config.get("load_format", "auto"))
        self.llm = vllm.LLM(
            model=model_path,
            tensor_parallel_size=tp_size,
            dtype="bfloat16" if dtype == "auto" else dtype,
            gpu_memory_utilization=float(config.get("gpu_memory_utilization", 0.5)),
            enforce_eager=bool(config.get("enforce_eager", True)),
            max_model_len=int(max_model_len),
            max_num_batched_tokens=int(config.get("max_num_batched_tokens", 8192)),
            max_num_seqs=int(config.get("max_num_seqs", 1024)),
            enable_chunked_prefill=bool(config.get("enable_chunked_prefill", True)),
            enable_sleep_mode=self.sleep_enabled,
            load_format="dummy" if load_format.startswith("dummy") else load_format,
            seed=int(config.get("seed", 0)),
            skip_tokenizer_init=False,
            trust_remote_code=trust_remote_code,
            disable_log_stats=bool(config.get("disable_log_stats", True)),
            **engine_kwargs,
        )

    # ------------------------------------------------------------------------------- generate

    def sampling_params(self, params: SamplingParams, eos_ids: list[int]):
        """vLLM SamplingParams for one call (greedy: temperature 0; top_k -1 disables)."""
        kwargs: dict[str, Any] = dict(
            n=1,
            max_tokens=params.response_length,
            ignore_eos=params.ignore_eos,
            stop_token_ids=eos_ids,
            logprobs=0 if self.calculate_log_probs else None,
            detokenize=False,
        )
        if params.greedy:
            kwargs.update(temperature=0.0, top_p=1.0, top_k=-1)
        else:
            kwargs.update(
                temperature=params.temperature,
                top_p=params.top_p,
                top_k=params.top_k if params.top_k > 0 else -1,
            )
        return self._sampling_params_cls(**kwargs)

    def generate_sequences(self, prompts: DataProto) -> DataProto:
        meta = prompts.meta_info
        params = resolve_sampling(self.train_params, self.val_params, meta)
        eos_ids = as_id_list(meta["eos_token_id"]) if meta.get("eos_token_id") is not None else self.eos_token_id
        pad_id = int(meta["pad_token_id"]) if meta.get("pad_token_id") is not None else self.pad_token_id

        outputs = self.llm.generate(
            [{"prompt_token_ids": ids} for ids in prompt_token_ids(prompts)],
            sampling_params=self.sampling_params(params, eos_ids),
            use_tqdm=False,
        )
        completions = [out.outputs[0] for out in outputs]  # n=1: one completion per prompt row
        token_lists = [list(c.token_ids)[: params.response_length] for c in completions]
        responses, lengths = _pad_lists(token_lists, params.response_length, pad_id)  # (B, R), (B,)
        response_mask = response_mask_through_eos(
            responses, [] if params.ignore_eos else eos_ids, valid_lengths=lengths
        )

        extra = {}
        if self.calculate_log_probs:
            # logprobs=0 returns the sampled token's log prob at each position
            rows = [
                [step[tok].logprob for step, tok in zip(c.logprobs or [], toks)]
                for c, toks in zip(completions, token_lists)
            ]
            log_probs, _ = _pad_lists(rows, params.response_length, 0.0, dtype=torch.float32)
            extra["rollout_log_probs"] = log_probs
        return assemble_rollout_output(
            prompts, responses, response_mask, extra_tensors=extra,
            extra_meta={"generated_tokens": int(response_mask.sum())},
        )

    # ---------------------------------------------------------------------- weights / memory

    def load_weights(self, named_tensors: NamedTensors) -> int:
        weights = list(iter_named_tensors(named_tensors))
        if hasattr(self.llm, "apply_model"):  # vLLM >= 0.8 (V0 and V1 engines)
            self.llm.apply_model(functools.partial(_load_into_model, weights))
        else:  # older vLLM: the model lives in this process's driver worker
            _load_into_model(weights, self.llm.llm_engine.model_executor.driver_worker.model_runner.model)
        # cached prefixes were computed with the old weights
        if hasattr(self.llm, "reset_prefix_cache"):
            self.llm.reset_prefix_cache()
        return len(weights)

    def sleep(self, level: int = 1) -> None:
        if self.sleep_enabled:
            self.llm.sleep(level=level)

    def wake_up(self, tags: list[str] | None = None) -> None:
        if not self.sleep_enabled:
            return
        if tags:
            self.llm.wake_up(tags=tags)
        else:
            self.llm.wake_up()


def prompt_token_ids(prompts: DataProto) -> list[list[int]]:
    """Unpadded prompt ids per row: ``raw_prompt_ids`` when the dataset kept them, else the
    attention-masked part of the left-padded ``input_ids``."""
    raw = prompts.non_tensor_batch.get("raw_prompt_ids", None)
    if raw is not None:
        return [list(map(int, ids)) for ids in raw]
    ids = prompts.batch["input_ids"].tolist()
    mask = prompts.batch["attention_mask"].bool().tolist()
    return [[t for t, keep in zip(row, row_mask) if keep] for row, row_mask in zip(ids, mask)]


def _pad_lists(rows: list[list], length: int, pad_value, dtype: torch.dtype = torch.long):
    """(B, length) tensor right-padded with ``pad_value``, and each row's length (B,)."""
    out = torch.full((len(rows), length), pad_value, dtype=dtype)
    lengths = torch.tensor([len(r) for r in rows], dtype=torch.long)
    for i, row in enumerate(rows):
        if row:
            out[i, : len(row)] = torch.tensor(row, dtype=dtype)
    return out, lengths
