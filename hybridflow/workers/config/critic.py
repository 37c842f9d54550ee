"""veRL's ``verl.workers.config.critic``: re-exports of hybridflow.config's critic classes."""

from hybridflow.config.critic import CriticConfig, FSDPCriticConfig
from hybridflow.config.refused import __getattr__  # noqa: F401

__all__ = ["CriticConfig", "FSDPCriticConfig"]
