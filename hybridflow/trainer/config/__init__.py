"""veRL's ``verl.trainer.config``: the algorithm's config classes (re-exported from hybridflow.config),
and the directory of veRL's config tree (``actor/dp_actor.yaml``, ``rollout/rollout.yaml``, ...) that a
veRL config composes with ``hydra.searchpath: [pkg://hybridflow.trainer.config]``. The yaml here is
generated from configs/ppo_trainer.yaml by ``python -m hybridflow.devtools.config_tree``."""

from hybridflow.config.algorithm import AlgoConfig, FilterGroupsConfig, KLControlConfig
from hybridflow.config.checkpoint import CheckpointConfig
from hybridflow.config.rollout_correction import RolloutCorrectionConfig
from hybridflow.trainer.config import algorithm, config

__all__ = [
    "AlgoConfig",
    "FilterGroupsConfig",
    "KLControlConfig",
    "RolloutCorrectionConfig",
    "CheckpointConfig",
    "algorithm",
    "config",
]
