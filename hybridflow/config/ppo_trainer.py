"""The whole of configs/ppo_trainer.yaml as one declaration: ``PPOTrainerConfig``'s fields are its
top-level sections, in the yaml's order. ``python -m devtools.config_yaml`` writes the yaml
from it (values, interpolations, a comment per key from its doc); a test fails when they drift."""

from __future__ import annotations

from dataclasses import dataclass

from hybridflow.config import rules
from hybridflow.config.actor import FSDPActorConfig, RefConfig
from hybridflow.config.algorithm import AlgoConfig, algorithm_as_in_yaml
from hybridflow.config.base import BaseConfig, doc, section
from hybridflow.config.critic import FSDPCriticConfig
from hybridflow.config.data import DataConfig
from hybridflow.config.distillation import DistillationConfig
from hybridflow.config.legacy import (
    LegacyCustomRewardFunctionConfig,
    LegacyRayInitConfig,
    LegacyRewardManagerConfig,
    LegacyRewardModelConfig,
    LegacySandboxFusionConfig,
)
from hybridflow.config.model import HFModelConfig
from hybridflow.config.profiler import GlobalProfilerConfig
from hybridflow.config.ray import RayKwargsConfig
from hybridflow.config.reasons import MEGATRON
from hybridflow.config.reward import RewardConfig
from hybridflow.config.rollout import NOT_IN_YAML as ROLLOUT_NOT_IN_YAML
from hybridflow.config.rollout import SGLANG, RolloutConfig, rollout_as_in_yaml
from hybridflow.config.skip import SkipManagerConfig
from hybridflow.config.status import honoured, refused
from hybridflow.config.trainer import AsyncTrainingConfig, TrainerConfig
from hybridflow.config.transfer_queue import TransferQueueConfig

__all__ = ["ActorRolloutRefConfig", "PPOTrainerConfig"]

_A = "actor_rollout_ref.actor"
_SGLANG = {"sglang_rollout_mode": refused(SGLANG)}
_MEGATRON = {"megatron.**": refused(MEGATRON)}
_NO_POOLS = "actor and rollout share their workers; separate pools are not implemented yet"
# the policy's rollout follows the data and the actor (veRL's rollout.yaml)
_ROLLOUT_FOLLOWS = {
    "n_gpus_per_node": "${trainer.n_gpus_per_node}",
    "prompt_length": "${data.max_prompt_length}",
    "response_length": "${data.max_response_length}",
    "log_prob_use_dynamic_bsz": f"${{{_A}.use_dynamic_bsz}}",
    "log_prob_max_token_len_per_gpu": f"${{{_A}.ppo_max_token_len_per_gpu}}",
    "mtp": "${actor_rollout_ref.model.mtp}",
    "qat": "${oc.select:actor_rollout_ref.actor.fsdp_config.qat,${oc.select:actor_rollout_ref.actor.megatron.qat,null}}",  # noqa: E501
}


@dataclass
class ActorRolloutRefConfig(BaseConfig):
    """``actor_rollout_ref``: the policy (trained, sampled and frozen as the reference), in one worker group."""

    hybrid_engine: bool = doc(True, "actor, rollout and ref share workers", values=(True,), reason=_NO_POOLS)
    nccl_timeout: int = doc(
        600,
        "seconds a collective of the workers' process group (nccl on CUDA, gloo on cpu) may wait before it fails "
        "(the group of a process holding the policy with the critic or a reward model too)",
    )
    model: HFModelConfig = section(
        HFModelConfig,
        "the policy model (veRL's hf_model.yaml)",
        keys={
            "lora.merge": honoured(
                "how a LoRA policy reaches a vllm rollout: false (veRL's default) base weights once + the adapter at "
                "every sync, true merged weights; the hf rollout always gets merged weights"
            )
        },
    )
    actor: FSDPActorConfig = section(FSDPActorConfig, "the policy's training", keys=_MEGATRON)
    ref: RefConfig = section(RefConfig, "the reference policy's log-prob pass", keys=_MEGATRON)
    rollout: RolloutConfig = section(
        rollout_as_in_yaml, "the inference engine", follows=_ROLLOUT_FOLLOWS, absent=ROLLOUT_NOT_IN_YAML, keys=_SGLANG
    )


@dataclass
class PPOTrainerConfig(BaseConfig):
    """configs/ppo_trainer.yaml: veRL 0.9.1's ppo_trainer tree, key for key."""

    data: DataConfig = section(DataConfig, "the training and validation prompts")
    actor_rollout_ref: ActorRolloutRefConfig = section(ActorRolloutRefConfig, "the policy: actor, rollout, reference")
    critic: FSDPCriticConfig = section(FSDPCriticConfig, "the value model (GAE)", keys=_MEGATRON)
    reward: RewardConfig = section(
        RewardConfig,
        "rewards (veRL 0.9.1's section; the earlier spellings are at the end)",
        absent=("reward_kwargs",),
        keys={
            "reward_kwargs.**": honoured(
                "keyword arguments of the reward manager, e.g. dapo's max_resp_len and overlong_buffer_cfg, genrm's "
                "template, template_path, parser, unparsable_score and chat_template"
            )
        },
    )
    algorithm: AlgoConfig = section(algorithm_as_in_yaml, "how rewards become advantages")
    trainer: TrainerConfig = section(TrainerConfig, "the run: steps, devices, logging, checkpoints, validation")
    async_training: AsyncTrainingConfig = section(
        AsyncTrainingConfig, "hybridflow: veRL's fully async keys, plus the mode of the one driver"
    )
    ray_kwargs: RayKwargsConfig = section(RayKwargsConfig, "Ray start-up (ray_init at the end is the earlier spelling)")
    global_profiler: GlobalProfilerConfig = section(GlobalProfilerConfig, "profiling: the tool, steps, role defaults")
    distillation: DistillationConfig = section(
        DistillationConfig, "on-policy distillation from teacher models served on rollout engines"
    )
    transfer_queue: TransferQueueConfig = section(
        TransferQueueConfig, "veRL's TransferQueue", refused="the TransferQueue data plane is not implemented"
    )
    skip: SkipManagerConfig = section(
        SkipManagerConfig,
        "replay cached rollouts instead of generating",
        refused="replaying dumped rollouts is implemented for skip.rollout only",
        keys=dict.fromkeys(("rollout.enable", "rollout.dump_dir", "rollout.steps", "rollout.action"), honoured()),
    )
    model_engine: str = doc("dp", "training backend", values=("dp",), reason="FSDP2/DDP is hybridflow's only backend")
    reward_model: LegacyRewardModelConfig = section(
        LegacyRewardModelConfig,
        "legacy: veRL's earlier reward-model section (moved keys map onto reward.*)",
        absent=("reward_kwargs",),
    )
    custom_reward_function: LegacyCustomRewardFunctionConfig = section(
        LegacyCustomRewardFunctionConfig, "legacy: earlier spelling of reward.custom_reward_function"
    )
    sandbox_fusion: LegacySandboxFusionConfig = section(LegacySandboxFusionConfig, "legacy: reward.sandbox_fusion")
    reward_manager: LegacyRewardManagerConfig = section(LegacyRewardManagerConfig, "legacy: reward.reward_manager")
    ray_init: LegacyRayInitConfig = section(LegacyRayInitConfig, "legacy: earlier spelling of ray_kwargs.ray_init")

    def validate(self, device: str, visible_devices: int | None = None, judge_scored: bool = False) -> list[str]:
        """Every cross-key rule of the run, each section's and those across sections (``hybridflow.config.rules``).
        Raises ConfigError listing every error; returns notes (settings ignored here, doubtful combinations)."""
        return rules.check_ppo_trainer(self, device, visible_devices, judge_scored)
