"""veRL's ``verl.workers.config.engine``: re-exports of hybridflow.config's engine classes."""

from hybridflow.config.engine import FSDPEngineConfig, MixedPrecisionConfig, QATEngineConfig
from hybridflow.config.refused import __getattr__  # noqa: F401

__all__ = ["FSDPEngineConfig", "MixedPrecisionConfig", "QATEngineConfig"]
