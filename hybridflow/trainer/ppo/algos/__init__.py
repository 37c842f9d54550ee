"""Former home of the RL math, kept so that imports written against it keep working.

The modules live in ``hybridflow.algorithms`` (below the workers, which import them); each
``hybridflow.trainer.ppo.algos.<name>`` is the very same module object as
``hybridflow.algorithms.<name>``, so registries and classes are shared, not copied.
"""

import sys

from hybridflow import algorithms as _algorithms
from hybridflow.algorithms import *  # noqa: F401,F403
from hybridflow.algorithms import (
    advantage,
    kl,
    loss_agg,
    policy_loss,
    rollout_correction,
    rollout_correction_metrics,
    value_loss,
)

__all__ = list(_algorithms.__all__)

for _module in (advantage, kl, loss_agg, policy_loss, rollout_correction, rollout_correction_metrics, value_loss):
    sys.modules[f"{__name__}.{_module.__name__.rsplit('.', 1)[-1]}"] = _module
