"""hybridflow's configuration declared as typed sections: every key once, with its type, its default and a
one-line doc. configs/*.yaml are generated from these declarations (``python -m devtools.config_yaml`` in a
source checkout; tests fail when a file drifts).

The bottom layer of the package: it imports nothing of hybridflow, so every other layer can take the
typed section it needs. veRL's import paths serve these classes (``hybridflow.base_config``,
``hybridflow.trainer.config``, ``hybridflow.workers.config``; ``omega_conf_to_dataclass`` also at
``hybridflow.utils`` and ``hybridflow.utils.config``: the table of ``hybridflow.compat``). Megatron's (and
other engines') classes are refused by name.
"""

from hybridflow.config.actor import ActorConfig, FSDPActorConfig, PolicyLossConfig, RefConfig, RouterReplayConfig
from hybridflow.config.algorithm import AlgoConfig, FilterGroupsConfig, KLControlConfig, PFPPOConfig
from hybridflow.config.base import BaseConfig, field_doc, to_dict
from hybridflow.config.checkpoint import CheckpointConfig
from hybridflow.config.convert import CONFIG_CLASSES, omega_conf_to_dataclass, resolve_target
from hybridflow.config.critic import CriticConfig, FSDPCriticConfig
from hybridflow.config.data import DataConfig, DataSamplerConfig
from hybridflow.config.distillation import DistillationConfig, DistillationLossConfig, DistillationTeacherModelConfig
from hybridflow.config.engine import FSDPEngineConfig, MixedPrecisionConfig, QATConfig, QATEngineConfig
from hybridflow.config.errors import ConfigError
from hybridflow.config.model import CriticModelConfig, HFModelConfig, MtpConfig
from hybridflow.config.module import ModuleConfig
from hybridflow.config.optimizer import FSDPOptimizerConfig, OptimizerConfig
from hybridflow.config.ppo_trainer import ActorRolloutRefConfig, PPOTrainerConfig
from hybridflow.config.profiler import (
    GlobalProfilerConfig,
    NPUToolConfig,
    NsightToolConfig,
    PrecisionDebuggerToolConfig,
    ProfilerConfig,
    TorchMemoryToolConfig,
    TorchProfilerScheduleConfig,
    TorchProfilerToolConfig,
)
from hybridflow.config.ray import RayInitConfig, RayKwargsConfig
from hybridflow.config.refused import __getattr__  # noqa: F401  (Megatron's classes: refused by name)
from hybridflow.config.reward import RewardConfig, RewardManagerConfig, RewardModelConfig, SandboxFusionConfig
from hybridflow.config.rollout import (
    AgentLoopConfig,
    CheckpointEngineConfig,
    CustomAsyncServerConfig,
    DisaggregationConfig,
    MultiTurnConfig,
    PrometheusConfig,
    RolloutConfig,
    SamplingConfig,
    ServerConfig,
    TraceConfig,
)
from hybridflow.config.rollout_correction import RolloutCorrectionConfig
from hybridflow.config.sft_trainer import SFTTrainerConfig
from hybridflow.config.skip import SkipManagerConfig
from hybridflow.config.trainer import AsyncTrainingConfig, HybridRolloutSwitchConfig, TrainerConfig
from hybridflow.config.transfer_queue import TransferQueueConfig

__all__ = [
    "BaseConfig",
    "ConfigError",
    "omega_conf_to_dataclass",
    "resolve_target",
    "CONFIG_CLASSES",
    "field_doc",
    "to_dict",
    "AlgoConfig",
    "KLControlConfig",
    "FilterGroupsConfig",
    "PFPPOConfig",
    "RolloutCorrectionConfig",
    "ActorConfig",
    "FSDPActorConfig",
    "RefConfig",
    "PolicyLossConfig",
    "RouterReplayConfig",
    "CriticConfig",
    "FSDPCriticConfig",
    "OptimizerConfig",
    "FSDPOptimizerConfig",
    "FSDPEngineConfig",
    "MixedPrecisionConfig",
    "QATConfig",
    "QATEngineConfig",
    "CheckpointConfig",
    "ProfilerConfig",
    "HFModelConfig",
    "CriticModelConfig",
    "MtpConfig",
    "RolloutConfig",
    "SamplingConfig",
    "MultiTurnConfig",
    "AgentLoopConfig",
    "CustomAsyncServerConfig",
    "CheckpointEngineConfig",
    "TraceConfig",
    "PrometheusConfig",
    "DisaggregationConfig",
    "ServerConfig",
    "PPOTrainerConfig",
    "ActorRolloutRefConfig",
    "DataConfig",
    "DataSamplerConfig",
    "ModuleConfig",
    "TrainerConfig",
    "AsyncTrainingConfig",
    "HybridRolloutSwitchConfig",
    "RewardConfig",
    "RewardManagerConfig",
    "RewardModelConfig",
    "SandboxFusionConfig",
    "DistillationConfig",
    "DistillationLossConfig",
    "DistillationTeacherModelConfig",
    "RayKwargsConfig",
    "RayInitConfig",
    "SkipManagerConfig",
    "SFTTrainerConfig",
    "TransferQueueConfig",
    "GlobalProfilerConfig",
    "NsightToolConfig",
    "NPUToolConfig",
    "TorchProfilerToolConfig",
    "TorchProfilerScheduleConfig",
    "TorchMemoryToolConfig",
    "PrecisionDebuggerToolConfig",
]
