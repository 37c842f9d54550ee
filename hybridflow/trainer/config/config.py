"""veRL's ``verl.trainer.config.config``: re-export of hybridflow.config's CheckpointConfig."""

from hybridflow.config.checkpoint import CheckpointConfig

__all__ = ["CheckpointConfig"]
