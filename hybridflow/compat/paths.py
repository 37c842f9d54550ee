"""The table of veRL's import paths and what serves each (read by ``hybridflow.compat.finder``).

``MODULES``: a veRL path that is one of hybridflow's modules under another name; importing it gives that very
module object (so registries and classes are shared, not copied), and its submodules follow
(``hybridflow.utils.reward_score.gsm8k`` is ``hybridflow.rewards.scorers.gsm8k``).

``NAMES``: a veRL path that gathers names from several homes: ``{home module: "name name ..."}``. ``*`` takes
the home's ``__all__``, ``alias=name`` renames, and ``__getattr__`` makes the home's module ``__getattr__`` the
fallback for names not listed (the refused Megatron classes). A path that is also a package on disk (the
generic helpers of ``hybridflow.utils``, the yaml tree of ``hybridflow.trainer.config``) keeps its files and
gains the names; any other path is a module without a file. Names resolve on first use.
"""

MODULES: dict[str, str] = {
    "hybridflow.utils.reward_score": "hybridflow.rewards.scorers",
    "hybridflow.utils.reward_score.math_reward": "hybridflow.rewards.scorers.math",
    "hybridflow.utils.reward_score.search_r1_like_qa_em": "hybridflow.rewards.scorers.qa_em",
    "hybridflow.utils.dataset.rl_dataset": "hybridflow.data.rl_dataset",
    "hybridflow.trainer.ppo.algos": "hybridflow.algorithms",
    "hybridflow.tools.utils.tool_registry": "hybridflow.utils.tool_config",
    "hybridflow.tools.schemas": "hybridflow.utils.tool_schemas",
    "hybridflow.workers.reward_manager.registry": "hybridflow.rewards.registry",
    "hybridflow.experimental.agent_loop.single_turn_agent_loop": "hybridflow.agent_loop.single_turn_agent",
    "hybridflow.experimental.agent_loop.tool_agent_loop": "hybridflow.agent_loop.tool_agent",
    "hybridflow.experimental.agent_loop.tool_parser": "hybridflow.agent_loop.tool_parser",
    "hybridflow.utils.tensordict_utils": "hybridflow.utils.tensordicts",
    "hybridflow.utils.device": "hybridflow.utils.accelerator",
    "hybridflow.trainer.ppo.checkpoint_callback": "hybridflow.trainer.checkpoint_callback",
}

_ACTOR = "ActorConfig FSDPActorConfig RefConfig PolicyLossConfig RouterReplayConfig"
_ROLLOUT = (
    "SamplingConfig MultiTurnConfig CustomAsyncServerConfig AgentLoopConfig TraceConfig PrometheusConfig RolloutConfig "
    "CheckpointEngineConfig ServerConfig"
)
_ALGORITHM = "AlgoConfig FilterGroupsConfig KLControlConfig"

NAMES: dict[str, dict[str, str]] = {
    # veRL's package-level helper: ``from verl.utils import omega_conf_to_dataclass``
    "hybridflow.utils": {"hybridflow.config.convert": "omega_conf_to_dataclass"},
    "hybridflow.utils.config": {
        "hybridflow.config.loader": "ConfigError config_dir available_configs default_config raw_default_config "
        "check_overrides suggest_keys load_config parse_cli main_entry omega_conf_to_dataclass"
    },
    "hybridflow.utils.dataset": {"hybridflow.data.rl_dataset": "RLHFDataset"},
    "hybridflow.utils.seqlen_balancing": {
        "hybridflow.trainer.ppo.balance": "get_group_balanced_partitions",
        "hybridflow.workers.utils.dynamic_batch": "get_seqlen_balanced_partitions prepare_dynamic_batch "
        "rearrange_micro_batches",
        "hybridflow.workers.utils.micro_batches": "get_reverse_idx restore_dynamic_batch",
    },
    "hybridflow.base_config": {"hybridflow.config.base": "BaseConfig"},
    # veRL 0.9's reward-loop managers: ``from verl.experimental.reward_loop.reward_manager.base import ...``
    "hybridflow.experimental.reward_loop.reward_manager": {
        "hybridflow.rewards.registry": "register get_reward_manager_cls",
        "hybridflow.rewards.loop_manager": "RewardManagerBase",
    },
    "hybridflow.experimental.reward_loop.reward_manager.base": {"hybridflow.rewards.loop_manager": "RewardManagerBase"},
    # veRL's config tree (yaml, for hydra.searchpath) is a package on disk; its classes are these
    "hybridflow.trainer.config": {
        "hybridflow.config.algorithm": _ALGORITHM,
        "hybridflow.config.rollout_correction": "RolloutCorrectionConfig",
        "hybridflow.config.checkpoint": "CheckpointConfig",
        "hybridflow.config.refused": "__getattr__",
    },
    "hybridflow.trainer.config.algorithm": {
        "hybridflow.config.algorithm": _ALGORITHM,
        "hybridflow.config.rollout_correction": "RolloutCorrectionConfig",
    },
    "hybridflow.trainer.config.config": {
        "hybridflow.config.checkpoint": "CheckpointConfig",
        "hybridflow.config.refused": "__getattr__",
    },
    "hybridflow.trainer.ppo.core_algos": {
        "hybridflow.algorithms": "*",
        "hybridflow.utils.torch_functional": "entropy_from_logits logprobs_from_logits masked_mean masked_sum "
        "masked_var masked_whiten",
    },
    "hybridflow.workers.config": {
        "hybridflow.config.actor": _ACTOR,
        "hybridflow.config.checkpoint": "CheckpointConfig",
        "hybridflow.config.critic": "CriticConfig FSDPCriticConfig",
        "hybridflow.config.optimizer": "OptimizerConfig FSDPOptimizerConfig",
        "hybridflow.config.engine": "FSDPEngineConfig MixedPrecisionConfig QATConfig QATEngineConfig",
        "hybridflow.config.model": "HFModelConfig CriticModelConfig MtpConfig",
        "hybridflow.config.profiler": "ProfilerConfig",
        "hybridflow.config.rollout": _ROLLOUT + " DisaggregationConfig",
        "hybridflow.config.refused": "__getattr__",
    },
    "hybridflow.workers.config.actor": {"hybridflow.config.actor": _ACTOR, "hybridflow.config.refused": "__getattr__"},
    "hybridflow.workers.config.critic": {
        "hybridflow.config.critic": "CriticConfig FSDPCriticConfig",
        "hybridflow.config.refused": "__getattr__",
    },
    "hybridflow.workers.config.engine": {
        "hybridflow.config.engine": "FSDPEngineConfig MixedPrecisionConfig QATEngineConfig",
        "hybridflow.config.refused": "__getattr__",
    },
    "hybridflow.workers.config.model": {"hybridflow.config.model": "HFModelConfig MtpConfig"},
    "hybridflow.workers.config.optimizer": {
        "hybridflow.config.optimizer": "OptimizerConfig FSDPOptimizerConfig",
        "hybridflow.config.refused": "__getattr__",
    },
    "hybridflow.workers.config.rollout": {"hybridflow.config.rollout": _ROLLOUT},
    "hybridflow.workers.fsdp_workers": {
        "hybridflow.workers.actor_rollout_ref_worker": "ActorRolloutRefWorker",
        "hybridflow.workers.critic_worker": "CriticWorker",
        "hybridflow.workers.reward_model_worker": "RewardModelWorker",
    },
    "hybridflow.workers.reward_manager": {
        "hybridflow.rewards.registry": "REWARD_MANAGER_REGISTRY get_reward_manager_cls register",
        "hybridflow.rewards.manager": "BatchRewardManager NaiveRewardManager",
    },
    "hybridflow.tools.utils": {},
    "hybridflow.experimental": {},
    "hybridflow.experimental.reward_loop": {},
    "hybridflow.experimental.agent_loop": {
        "hybridflow.agent_loop.base": "AgentLoopBase AgentLoopOutput register",
        "hybridflow.agent_loop.manager": "AgentLoopManager",
        "hybridflow.agent_loop.worker": "AgentLoopWorker",
        "hybridflow.agent_loop.single_turn_agent": "SingleTurnAgentLoop",
        "hybridflow.agent_loop.tool_agent": "ToolAgentLoop",
        "hybridflow.agent_loop.trace": "get_trajectory_info",
    },
    "hybridflow.experimental.agent_loop.agent_loop": {
        "hybridflow.agent_loop.base": "AGENT_LOOPS AgentLoopBase AgentLoopOutput register",
        "hybridflow.agent_loop.manager": "AgentLoopManager",
        "hybridflow.agent_loop.server_manager": "AsyncLLMServerManager=ServerManager",
        "hybridflow.agent_loop.worker": "AgentLoopWorker",
        "hybridflow.agent_loop.trace": "get_trajectory_info",
    },
}
