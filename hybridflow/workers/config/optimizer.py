"""veRL's ``verl.workers.config.optimizer``: re-exports of hybridflow.config's optimizer classes."""

from hybridflow.config.optimizer import FSDPOptimizerConfig, OptimizerConfig
from hybridflow.config.refused import __getattr__  # noqa: F401

__all__ = ["OptimizerConfig", "FSDPOptimizerConfig"]
