"""veRL's ``verl.workers.config.model``: re-exports of hybridflow.config's model classes."""

from hybridflow.config.model import HFModelConfig, MtpConfig

__all__ = ["HFModelConfig", "MtpConfig"]
