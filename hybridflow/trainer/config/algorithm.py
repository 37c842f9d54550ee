"""veRL's ``verl.trainer.config.algorithm``: re-exports of hybridflow.config's algorithm classes."""

from hybridflow.config.algorithm import AlgoConfig, FilterGroupsConfig, KLControlConfig
from hybridflow.config.rollout_correction import RolloutCorrectionConfig

__all__ = ["AlgoConfig", "FilterGroupsConfig", "KLControlConfig", "RolloutCorrectionConfig"]
