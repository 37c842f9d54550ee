"""veRL's ``verl.workers.config``: the workers' config classes, re-exported from hybridflow.config.
Megatron's (``McoreActorConfig``, ``McoreEngineConfig``, ...) and the other engines' are refused by
name with the reason (module ``__getattr__`` of hybridflow.config.refused)."""

from hybridflow.config.actor import ActorConfig, FSDPActorConfig, PolicyLossConfig, RefConfig, RouterReplayConfig
from hybridflow.config.checkpoint import CheckpointConfig
from hybridflow.config.critic import CriticConfig, FSDPCriticConfig
from hybridflow.config.engine import FSDPEngineConfig, MixedPrecisionConfig, QATConfig, QATEngineConfig
from hybridflow.config.model import CriticModelConfig, HFModelConfig, MtpConfig
from hybridflow.config.optimizer import FSDPOptimizerConfig, OptimizerConfig
from hybridflow.config.profiler import ProfilerConfig
from hybridflow.config.refused import __getattr__  # noqa: F401
from hybridflow.config.rollout import (
    AgentLoopConfig,
    CheckpointEngineConfig,
    CustomAsyncServerConfig,
    DisaggregationConfig,
    MultiTurnConfig,
    PrometheusConfig,
    RolloutConfig,
    SamplingConfig,
    TraceConfig,
)

__all__ = [
    "ActorConfig",
    "FSDPActorConfig",
    "RefConfig",
    "PolicyLossConfig",
    "RouterReplayConfig",
    "CheckpointConfig",
    "CriticConfig",
    "FSDPCriticConfig",
    "OptimizerConfig",
    "FSDPOptimizerConfig",
    "FSDPEngineConfig",
    "MixedPrecisionConfig",
    "QATConfig",
    "QATEngineConfig",
    "HFModelConfig",
    "CriticModelConfig",
    "MtpConfig",
    "ProfilerConfig",
    "RolloutConfig",
    "SamplingConfig",
    "MultiTurnConfig",
    "AgentLoopConfig",
    "CustomAsyncServerConfig",
    "CheckpointEngineConfig",
    "TraceConfig",
    "PrometheusConfig",
    "DisaggregationConfig",
]
