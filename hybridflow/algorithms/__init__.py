"""The RL math of hybridflow: pure functions on tensors (advantage estimators, policy/value losses,
loss aggregation, KL penalties and controllers, rollout correction), one concept per module.

A leaf package beside ``rewards`` and ``utils``: it imports nothing of hybridflow above ``utils``, so
the workers (which compute the losses) and the trainer (which computes advantages) both import it
without a worker ever importing the driver. ``hybridflow.trainer.ppo.core_algos`` re-exports it
under veRL's import path (same objects, same registries).
"""

from hybridflow.algorithms.advantage import *  # noqa: F401,F403
from hybridflow.algorithms.advantage import __all__ as _adv_all
from hybridflow.algorithms.advantage_gdpo import *  # noqa: F401,F403
from hybridflow.algorithms.advantage_gdpo import __all__ as _gdpo_all
from hybridflow.algorithms.advantage_otb import *  # noqa: F401,F403
from hybridflow.algorithms.advantage_otb import __all__ as _otb_all
from hybridflow.algorithms.kl import *  # noqa: F401,F403
from hybridflow.algorithms.kl import __all__ as _kl_all
from hybridflow.algorithms.loss_agg import *  # noqa: F401,F403
from hybridflow.algorithms.loss_agg import __all__ as _agg_all
from hybridflow.algorithms.policy_loss import *  # noqa: F401,F403
from hybridflow.algorithms.policy_loss import __all__ as _pl_all
from hybridflow.algorithms.policy_loss_cov import *  # noqa: F401,F403
from hybridflow.algorithms.policy_loss_cov import __all__ as _pl_cov_all
from hybridflow.algorithms.policy_loss_logprob import *  # noqa: F401,F403
from hybridflow.algorithms.policy_loss_logprob import __all__ as _pl_logprob_all
from hybridflow.algorithms.policy_loss_ratio import *  # noqa: F401,F403
from hybridflow.algorithms.policy_loss_ratio import __all__ as _pl_ratio_all
from hybridflow.algorithms.value_loss import *  # noqa: F401,F403
from hybridflow.algorithms.value_loss import __all__ as _vl_all

__all__ = [
    *_adv_all,
    *_gdpo_all,
    *_otb_all,
    *_kl_all,
    *_agg_all,
    *_pl_all,
    *_pl_cov_all,
    *_pl_logprob_all,
    *_pl_ratio_all,
    *_vl_all,
]
