"""The ``DataProto.meta_info`` keys that hybridflow's driver, agent loop and workers pass each other: the
contract between them, declared once (name, type, who writes, who reads, why).

``meta_info`` stays a plain dict on the wire (veRL's users put their own keys in it, and veRL's keys keep
veRL's spelling); this table is what hybridflow itself writes and reads. tests/test_meta_info_contract.py
scans hybridflow/ for every ``meta_info`` key the code names and fails on one not declared here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["MetaKey", "META_KEYS", "declared_meta_key"]

DRIVER = "driver (trainer/ppo)"
AGENT_LOOP = "agent loop (agent_loop/)"
ROLLOUT_HOST = "rollout host (workers/rollout_host.py)"
ACTOR_WORKER = "actor/ref worker (workers/actor_rollout_ref_worker.py)"
CRITIC_WORKER = "critic worker (workers/critic_worker.py)"
ACTOR = "DataParallelPPOActor (workers/actor)"
CRITIC = "DataParallelPPOCritic (workers/critic)"
VALIDATION = "validation and generation (trainer/ppo/ray_trainer.py, trainer/eval_utils.py)"
PROTOCOL = "DataProto (protocol.py)"
ANY_WORKER = "every worker method that returns a batch"


@dataclass(frozen=True)
class MetaKey:
    """One key: the Python type of its value, who puts it in, who reads it, and why it exists."""

    name: str
    type: Any
    writers: tuple[str, ...]
    readers: tuple[str, ...]
    doc: str


def _keys(*keys: MetaKey) -> dict[str, MetaKey]:
    return {k.name: k for k in keys}


META_KEYS: dict[str, MetaKey] = _keys(
    # --- sampling of one generate_sequences call (veRL's names; rollout/sampling.py applies them)
    MetaKey("validate", bool, (VALIDATION,), (AGENT_LOOP,), "use rollout.val_kwargs, log under val/"),
    MetaKey("do_sample", bool, (VALIDATION, "user code"), (AGENT_LOOP,), "sample (else greedy) for this call"),
    MetaKey(
        "temperature",
        float,
        (DRIVER, ACTOR_WORKER),
        (AGENT_LOOP, ACTOR),
        "sampling temperature; the actor divides the logits by it so log-probs match the sampling distribution",
    ),
    MetaKey("top_k", int, ("user code",), (AGENT_LOOP,), "top-k override for this call"),
    MetaKey("top_p", float, ("user code",), (AGENT_LOOP,), "nucleus override for this call"),
    MetaKey("response_length", int, ("user code",), (AGENT_LOOP,), "response length override for this call"),
    MetaKey("ignore_eos", bool, ("user code",), (AGENT_LOOP,), "generate past end-of-sequence (benchmarks)"),
    MetaKey("stop_token_ids", list, ("user code",), (AGENT_LOOP,), "stop ids override for this call"),
    MetaKey("eos_token_id", (int, list), ("user code",), (AGENT_LOOP,), "veRL's spelling of the stop ids"),
    MetaKey("pad_token_id", int, (VALIDATION,), (AGENT_LOOP,), "pad id of the prompts' tokenizer"),
    MetaKey("apply_chat_template_kwargs", dict, ("user code",), (AGENT_LOOP,), "chat template arguments"),
    # --- naming the request (traces, resumable partial rollouts, weight versions)
    MetaKey("global_steps", int, (DRIVER, VALIDATION), (AGENT_LOOP,), "the step the request belongs to"),
    MetaKey("sample_offset", int, (ROLLOUT_HOST, DRIVER), (AGENT_LOOP,), "first row's index in the step's batch"),
    MetaKey("weight_version", int, (DRIVER,), (AGENT_LOOP,), "weights the rollout must have before it starts"),
    MetaKey("over_sample_id", str, (AGENT_LOOP,), (AGENT_LOOP,), "names one over-sampled call to its workers"),
    MetaKey("async_rollout", bool, (DRIVER,), (DRIVER,), "a ticket of the asynchronous rollout source"),
    # --- the training batch
    MetaKey("balance_order", list, (DRIVER,), (DRIVER,), "generation order of the rows after balancing"),
    MetaKey("global_token_num", list, (DRIVER,), (DRIVER, ACTOR), "tokens per row (throughput, MFU)"),
    MetaKey("rollout_correction", object, (DRIVER,), (ACTOR,), "the RolloutCorrectionConfig in bypass mode"),
    MetaKey(
        "pi_old_snapshot",
        str,
        (DRIVER,),
        (ACTOR_WORKER,),
        "V1 separate_async: 'save' keeps the weights pi_old came from; 'use' computes with them (one pi_old a cycle)",
    ),
    MetaKey(
        "keep_failed_trajectories",
        bool,
        (DRIVER,),
        (AGENT_LOOP,),
        "sync_refill_failed_groups: a loop that raises fails its own sample (rollout_error column), not the call",
    ),
    MetaKey(
        "distillation", object, (DRIVER,), (ACTOR,), "the DistillationLossConfig when on-policy distillation is on"
    ),
    MetaKey("topk", int, (DRIVER,), ("teacher (workers/judge_worker.py score_tokens)",), "teacher log-probs per token"),
    MetaKey("micro_batch_size", int, (ACTOR_WORKER, CRITIC_WORKER), (ACTOR, CRITIC), "rows per forward"),
    MetaKey("use_dynamic_bsz", bool, (ACTOR_WORKER, CRITIC_WORKER), (ACTOR, CRITIC), "pack by token budget"),
    MetaKey("max_token_len", int, (ACTOR_WORKER, CRITIC_WORKER), (ACTOR, CRITIC), "token budget per forward"),
    # --- answers
    MetaKey("metrics", dict, (ANY_WORKER, AGENT_LOOP), (DRIVER,), "the call's metrics, name -> value(s)"),
    # --- DataProto's own bookkeeping
    MetaKey("_hybridflow_auto_padding", bool, (PROTOCOL,), (PROTOCOL,), "pad this batch to the dp size"),
)


def declared_meta_key(name: str) -> MetaKey:
    """The declaration of ``name`` (KeyError naming the declared keys when there is none)."""
    try:
        return META_KEYS[name]
    except KeyError:
        raise KeyError(
            f"meta_info key {name!r} is not declared in hybridflow.protocol_keys; declared: {', '.join(META_KEYS)}"
        ) from None
