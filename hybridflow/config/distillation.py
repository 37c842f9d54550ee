"""The ``distillation`` section (veRL 0.9.1's DistillationConfig): on-policy distillation from teacher
models (not implemented by hybridflow; refused when enabled)."""

from __future__ import annotations

from dataclasses import dataclass

from hybridflow.config.base import BaseConfig, doc, placed, section
from hybridflow.config.reward import engine_only, standalone_engine
from hybridflow.config.rollout import RolloutConfig

__all__ = ["DistillationLossConfig", "DistillationTeacherModelConfig", "DistillationConfig"]

_R = "actor_rollout_ref.rollout"


@dataclass
class DistillationLossConfig(BaseConfig):
    """``distillation.distillation_loss``: the student's loss against the teacher."""

    _target_: str = doc("verl.workers.config.DistillationLossConfig", "the class this section is read into")
    loss_mode: str = doc("k3", "divergence estimator: k1, k3, forward_kl_topk, ...")
    topk: int | None = doc(32, "teacher log-probs kept per token for the top-k losses")
    use_task_rewards: bool = doc(True, "add the task rewards to the distillation signal")
    distillation_loss_coef: float = doc(1.0, "weight of the distillation loss")
    loss_max_clamp: float | None = doc(None, "upper clamp of the per-token loss")
    log_prob_min_clamp: float | None = doc(None, "lower clamp of the log-probs")
    use_policy_gradient: bool = doc(False, "use the divergence as a reward in a policy-gradient loss")
    policy_loss_mode: str = doc("vanilla", "that policy loss")
    clip_ratio: float = doc(0.2, "its clip range")
    clip_ratio_low: float = doc(0.2, "its lower clip range")
    clip_ratio_high: float = doc(0.2, "its upper clip range")


@dataclass
class DistillationTeacherModelConfig(BaseConfig):
    """One teacher of ``distillation.teacher_models``."""

    _target_: str = doc("verl.workers.config.DistillationTeacherModelConfig", "the class this section is read into")
    key: str | None = doc(None, "the value of data.teacher_key whose samples this teacher scores")
    model_path: str | None = doc(None, "the teacher's model directory")
    num_replicas: int | None = doc(0, "inference replicas of the teacher")
    inference: RolloutConfig = section(
        placed(standalone_engine, dtype="auto"),
        "the teacher's inference engine",
        absent=engine_only(),
        follows={k: f"${{{_R}.{k}}}" for k in ("name", "dtype", "prompt_length", "response_length", "temperature")},
    )


@dataclass
class DistillationConfig(BaseConfig):
    """``distillation``: on-policy distillation (not implemented)."""

    _target_: str = doc("verl.workers.config.DistillationConfig", "the class this section is read into")
    enabled: bool = doc(False, "distil from the teacher models")
    distillation_loss: DistillationLossConfig = section(DistillationLossConfig, "the distillation loss")
    n_gpus_per_node: int = doc(8, "devices per node of the teachers' pool")
    nnodes: int = doc(0, "nodes of the teachers' pool")
    teacher_models: dict[str, DistillationTeacherModelConfig] = doc(
        {"teacher_model": DistillationTeacherModelConfig()}, "the teachers by name"
    )
    teacher_key: str = doc("data_source", "column that selects a sample's teacher")
