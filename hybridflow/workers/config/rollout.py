"""veRL's ``verl.workers.config.rollout``: re-exports of hybridflow.config's rollout classes."""

from hybridflow.config.rollout import (
    AgentLoopConfig,
    CheckpointEngineConfig,
    CustomAsyncServerConfig,
    MultiTurnConfig,
    PrometheusConfig,
    RolloutConfig,
    SamplingConfig,
    TraceConfig,
)

__all__ = [
    "SamplingConfig",
    "MultiTurnConfig",
    "CustomAsyncServerConfig",
    "AgentLoopConfig",
    "TraceConfig",
    "PrometheusConfig",
    "RolloutConfig",
    "CheckpointEngineConfig",
]
