"""Earlier spellings of sections veRL 0.9.1 moved: the top-level ``reward_model``,
``custom_reward_function``, ``sandbox_fusion``, ``reward_manager`` and ``ray_init``. Their keys are
mapped once, at load time, onto the canonical place (hybridflow/config/keys/aliases.py); null means
"not set", and two different values for one setting are an error. The keys of the old reward-model
section that 0.9.1 did not move (micro batches, max_length, ...) configure hybridflow's FSDP
reward-model worker."""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass

from hybridflow.config.base import BaseConfig, doc, field_doc, section
from hybridflow.config.engine import FSDPEngineConfig, engine_as_in_yaml
from hybridflow.config.profiler import HOOK_KEYS, TOKEN_RANGE_KEYS, TOOL_NAME_KEYS, ProfilerConfig
from hybridflow.config.reasons import NO_SP, PROFILER, speed_only
from hybridflow.config.reward import ENGINE_KEYS
from hybridflow.config.rollout import RolloutConfig

__all__ = [
    "LegacyRewardModelModelConfig",
    "LegacyRewardEngineConfig",
    "LegacySandboxFusionConfig",
    "LegacyRewardModelConfig",
    "LegacyCustomRewardFunctionConfig",
    "LegacyModuleConfig",
    "LegacyRewardManagerConfig",
    "LegacyRayInitConfig",
]

_RM_SPEED = speed_only("the reward model runs unsharded, in fixed micro-batches")

_ROLLOUT_HINTS = typing.get_type_hints(RolloutConfig)
_RM_ENGINE_KEYS = ("_target_", "wrap_policy", "param_offload", "reshard_after_forward", "fsdp_size", "forward_prefetch")


@dataclass
class LegacyRewardModelModelConfig(BaseConfig):
    """``reward_model.model``: the reward model (path etc. map onto reward.reward_model)."""

    path: str | None = doc(None, "earlier spelling of reward.reward_model.model_path")
    external_lib: str | None = doc(None, "a module imported first")
    trust_remote_code: bool | None = doc(None, "allow the model's own Python code")
    input_tokenizer: str | None = doc(
        None,
        "the tokenizer that decodes the policy's responses (null: the policy's)",
        reason="each row reaches the reward model as its conversation in the reward model's own chat template and "
        "tokenizer (veRL 0.9's reward loop); this tokenizer decodes the response first",
    )
    override_config: dict = doc({}, "config.json overrides of the reward model")
    use_shm: bool = doc(False, "copy the model to shared memory first", note=_RM_SPEED)
    use_remove_padding: bool = doc(False, "padding-free forward", note=_RM_SPEED)
    use_fused_kernels: bool = doc(
        False, "fused kernels", follows="${actor_rollout_ref.model.use_fused_kernels}", note=_RM_SPEED
    )
    fsdp_config: FSDPEngineConfig = section(
        engine_as_in_yaml,
        "the reward model's engine",
        absent=tuple(f.name for f in dataclasses.fields(FSDPEngineConfig) if f.name not in _RM_ENGINE_KEYS),
        note=_RM_SPEED,
    )


# ``reward_model.rollout``: earlier spelling of reward.reward_model.rollout, its engine keys (null: not set)
LegacyRewardEngineConfig = dataclasses.make_dataclass(
    "LegacyRewardEngineConfig",
    [("_target_", str | None, doc(None, "the class this section is read into"))]
    + [
        (k, _ROLLOUT_HINTS[k] | None, doc(None, field_doc(RolloutConfig, k))) for k in ENGINE_KEYS if k != "temperature"
    ],
    bases=(BaseConfig,),
    namespace={"__module__": __name__, "__doc__": "``reward_model.rollout`` (null: not set)."},
)


@dataclass
class LegacySandboxFusionConfig(BaseConfig):
    """Earlier spelling of reward.sandbox_fusion (null: not set)."""

    url: str | None = doc(None, "sandbox URL")
    max_concurrent: int | None = doc(None, "requests in flight at once")
    memory_limit_mb: int | None = doc(None, "memory per sandbox process, in MB")


@dataclass
class LegacyRewardModelConfig(BaseConfig):
    """``reward_model``: veRL's earlier reward-model section."""

    num_workers: int | None = doc(None, "earlier spelling of reward.num_workers")
    reward_manager: str | None = doc(None, "earlier spelling of reward.reward_manager.name")
    enable: bool | None = doc(None, "earlier spelling of reward.reward_model.enable")
    enable_resource_pool: bool | None = doc(None, "earlier spelling of reward.reward_model.enable_resource_pool")
    n_gpus_per_node: int | None = doc(None, "earlier spelling of reward.reward_model.n_gpus_per_node")
    nnodes: int | None = doc(None, "earlier spelling of reward.reward_model.nnodes")
    reward_loop_source: str | None = doc(None, "earlier spelling of reward.reward_manager.source")
    reward_loop_module_path: str | None = doc(None, "earlier spelling of reward.reward_manager.module.path")
    reward_loop_class_name: str | None = doc(None, "earlier spelling of reward.reward_manager.module.name")
    model: LegacyRewardModelModelConfig = section(LegacyRewardModelModelConfig, "the reward model")
    rollout: LegacyRewardEngineConfig = section(LegacyRewardEngineConfig, "its inference engine")
    strategy: str = doc("fsdp", "the reward model's training engine (forward only)", note=_RM_SPEED)
    micro_batch_size: int | None = doc(None, "deprecated global micro-batch of the scoring pass")
    micro_batch_size_per_gpu: int | None = doc(None, "samples per scoring forward on one rank")
    reward_kwargs: dict = doc(
        {}, "earlier spelling of reward.reward_kwargs (added with +reward_model.reward_kwargs.<key>)"
    )
    max_length: int | None = doc(
        None, "tokens scored per sample; null: no cut", refused="the reward-model worker does not implement it"
    )
    ulysses_sequence_parallel_size: int = doc(1, "sequence-parallel size", values=(1,), reason=NO_SP)
    use_dynamic_bsz: bool = doc(False, "pack by token count", follows="${critic.use_dynamic_bsz}", note=_RM_SPEED)
    forward_max_token_len_per_gpu: int = doc(
        32768, "token budget per forward", follows="${critic.forward_max_token_len_per_gpu}", note=_RM_SPEED
    )
    launch_reward_fn_async: bool = doc(
        False,
        "compute rule rewards in the background",
        note="a speed setting: hybridflow scores each trajectory as it finishes, overlapping generation, in "
        "reward.num_workers processes (the same scores)",
    )
    use_reward_loop: bool = doc(True, "veRL's reward loop (hybridflow scores in its reward workers)", note=_RM_SPEED)
    sandbox_fusion: LegacySandboxFusionConfig = section(
        LegacySandboxFusionConfig, "earlier spelling of reward.sandbox_fusion"
    )
    profiler: ProfilerConfig = section(
        ProfilerConfig,
        "the reward model's profiling",
        follows={"tool_config": "${actor_rollout_ref.actor.profiler.tool_config}"},
        absent=(*HOOK_KEYS, *TOKEN_RANGE_KEYS, *TOOL_NAME_KEYS),
        refused=PROFILER,
    )


@dataclass
class LegacyCustomRewardFunctionConfig(BaseConfig):
    """``custom_reward_function``: earlier spelling of reward.custom_reward_function (null: not set)."""

    path: str | None = doc(None, "a .py file")
    name: str | None = doc(None, "the function in it")
    reward_kwargs: dict = doc({}, "extra keyword arguments bound to the function")


@dataclass
class LegacyModuleConfig(BaseConfig):
    """``reward_manager.module`` (null: not set)."""

    _target_: str | None = doc(None, "the class this section is read into")
    path: str | None = doc(None, "file of the reward manager")
    name: str | None = doc(None, "the class in it")


@dataclass
class LegacyRewardManagerConfig(BaseConfig):
    """``reward_manager``: veRL main's spelling of reward.reward_manager (null: not set)."""

    _target_: str | None = doc(None, "the class this section is read into")
    source: str | None = doc(None, "register | importlib")
    name: str | None = doc(None, "name in the registry, or the class in module")
    module: LegacyModuleConfig = section(LegacyModuleConfig, "the file of an importlib reward manager")


@dataclass
class LegacyRayInitConfig(BaseConfig):
    """``ray_init``: earlier spelling of ray_kwargs.ray_init (timeline_json_file: ray_kwargs's)."""

    num_cpus: int | None = doc(None, "CPUs Ray may use")
    timeline_json_file: str | None = doc(None, "earlier spelling of ray_kwargs.timeline_json_file")
    address: str | None = doc(None, "Ray address")
    include_dashboard: bool | None = doc(None, "start the dashboard")
