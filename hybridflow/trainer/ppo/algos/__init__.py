"""The RL math of hybridflow, one concept per module; ``hybridflow.trainer.ppo.core_algos`` re-exports it."""

from hybridflow.trainer.ppo.algos.advantage import *  # noqa: F401,F403
from hybridflow.trainer.ppo.algos.advantage import __all__ as _adv_all
from hybridflow.trainer.ppo.algos.kl import *  # noqa: F401,F403
from hybridflow.trainer.ppo.algos.kl import __all__ as _kl_all
from hybridflow.trainer.ppo.algos.loss_agg import *  # noqa: F401,F403
from hybridflow.trainer.ppo.algos.loss_agg import __all__ as _agg_all
from hybridflow.trainer.ppo.algos.policy_loss import *  # noqa: F401,F403
from hybridflow.trainer.ppo.algos.policy_loss import __all__ as _pl_all
from hybridflow.trainer.ppo.algos.value_loss import *  # noqa: F401,F403
from hybridflow.trainer.ppo.algos.value_loss import __all__ as _vl_all

__all__ = [*_adv_all, *_kl_all, *_agg_all, *_pl_all, *_vl_all]
