"""veRL's ``verl.workers.config.actor``: re-exports of hybridflow.config's actor classes."""

from hybridflow.config.actor import ActorConfig, FSDPActorConfig, PolicyLossConfig, RefConfig, RouterReplayConfig
from hybridflow.config.refused import __getattr__  # noqa: F401

__all__ = ["ActorConfig", "FSDPActorConfig", "RefConfig", "PolicyLossConfig", "RouterReplayConfig"]
