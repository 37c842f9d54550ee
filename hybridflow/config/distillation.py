"""The ``distillation`` section (veRL 0.9.1's DistillationConfig): on-policy distillation from teacher
models served on rollout engines (hybridflow/trainer/ppo/teacher_setup.py)."""

from __future__ import annotations

from dataclasses import dataclass

from hybridflow.config.base import BaseConfig, doc, placed, section
from hybridflow.config.reasons import CPU_NO_CHUNKED_PREFILL, TARGET
from hybridflow.config.reward import engine_only, standalone_engine
from hybridflow.config.rollout import RolloutConfig, is_user_engine
from hybridflow.config.status import OrYours, honoured, noted, refused

__all__ = ["DistillationLossConfig", "DistillationTeacherModelConfig", "DistillationConfig"]

_R = "actor_rollout_ref.rollout"
_LOSS_MODES = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3", "forward_kl_topk")
_ONE_PROCESS = "each teacher replica is one process of hybridflow's teacher pool; the engine's own parallelism"
_VLLM = "passed to the vllm engine as for the policy's rollout (the hf engine has no such setting)"


@dataclass
class DistillationLossConfig(BaseConfig):
    """``distillation.distillation_loss``: the student's loss against the teacher."""

    _target_: str = doc("verl.workers.config.DistillationLossConfig", "the class this section is read into")
    loss_mode: str = doc(
        "k3",
        "divergence: the reverse-KL estimators k1/kl, abs, k2/mse, k3/low_var_kl, or forward_kl_topk",
        values=_LOSS_MODES,
    )
    topk: int | None = doc(32, "teacher log-probs kept per token for forward_kl_topk")
    use_task_rewards: bool = doc(True, "add the task's policy loss (coef * distillation beside it)")
    distillation_loss_coef: float = doc(1.0, "weight of the distillation loss when use_task_rewards")
    loss_max_clamp: float | None = doc(None, "clamp of the per-token loss to [-x, x]")
    log_prob_min_clamp: float | None = doc(None, "lower clamp of both log-probs in forward_kl_topk")
    use_policy_gradient: bool = doc(False, "use -loss per token as the advantage of a PPO loss")
    policy_loss_mode: str = doc(
        "vanilla", "that policy loss", values=("vanilla",), reason="veRL 0.9.1 implements only vanilla"
    )
    clip_ratio: float = doc(0.2, "its clip range")
    clip_ratio_low: float = doc(0.2, "its lower clip range")
    clip_ratio_high: float = doc(0.2, "its upper clip range")


@dataclass
class DistillationTeacherModelConfig(BaseConfig):
    """One teacher of ``distillation.teacher_models``."""

    _target_: str = doc("verl.workers.config.DistillationTeacherModelConfig", "the class this section is read into")
    key: str | None = doc(None, "the value of distillation.teacher_key whose samples this teacher scores")
    model_path: str | None = doc(None, "the teacher's model directory (same tokenizer as the student)")
    num_replicas: int | None = doc(0, "processes serving this teacher (0, single teacher: the teacher pool's size)")
    inference: RolloutConfig = section(
        placed(standalone_engine, dtype="auto"),
        "the teacher's inference engine (hf | vllm | yours)",
        absent=engine_only(),
        follows={k: f"${{{_R}.{k}}}" for k in ("name", "dtype", "prompt_length", "response_length", "temperature")},
        keys={
            "name": honoured(
                "the teacher's engine: hf, vllm or an AsyncRolloutServer of yours that implements score()",
                values=OrYours(("hf", "vllm"), also=is_user_engine),
            ),
            "temperature": noted("the teacher scores at temperature 1.0 (a forward pass), as veRL does"),
            **dict.fromkeys(
                ("data_parallel_size", "expert_parallel_size", "tensor_model_parallel_size"), noted(_ONE_PROCESS)
            ),
            **dict.fromkeys(
                (
                    "gpu_memory_utilization",
                    "enforce_eager",
                    "cudagraph_capture_sizes",
                    "max_num_batched_tokens",
                    "max_num_seqs",
                    "load_format",
                    "engine_kwargs",
                    "engine_kwargs.vllm.**",
                    "enable_prefix_caching",
                    "disable_log_stats",
                ),
                honoured(_VLLM),
            ),
            "enable_chunked_prefill": honoured(f"{_VLLM}; {CPU_NO_CHUNKED_PREFILL}"),
            "limit_images": refused("multi-modal teachers are not implemented"),
            "skip_tokenizer_init": noted("the teacher scores token ids; its tokenizer is only compared"),
            **dict.fromkeys(
                ("engine_kwargs.sglang.**", "engine_kwargs.trtllm.**"),
                refused("sglang and TensorRT-LLM are not hybridflow rollout engines"),
            ),
        },
    )


@dataclass
class DistillationConfig(BaseConfig):
    """``distillation``: on-policy distillation (the teacher scores the student's sampled tokens)."""

    _target_: str = doc("verl.workers.config.DistillationConfig", "the class this section is read into")
    enabled: bool = doc(False, "distil from the teacher models")
    distillation_loss: DistillationLossConfig = section(DistillationLossConfig, "the distillation loss")
    n_gpus_per_node: int = doc(8, "devices per node of the teachers' pool (a single teacher's replicas when 0)")
    nnodes: int = doc(0, "nodes of the teachers' pool (a single teacher's replicas: n_gpus_per_node x nnodes)")
    teacher_models: dict[str, DistillationTeacherModelConfig] = doc(
        {"teacher_model": DistillationTeacherModelConfig()},
        "the teachers by name (one: it scores every sample; several: routed by teacher_key)",
        keys={
            "*.**": honoured("a teacher added with +: the keys of teacher_model"),
            **dict.fromkeys(("*._target_", "*.inference._target_"), refused(TARGET)),
        },
    )
    teacher_key: str = doc("data_source", "the sample column whose value names the teacher (its key)")
