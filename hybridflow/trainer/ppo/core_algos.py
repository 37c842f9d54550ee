"""veRL-compatible entry point to the RL math: ``from hybridflow.trainer.ppo import core_algos``.

The implementations live in ``hybridflow.algorithms`` (advantage, policy_loss, loss_agg, kl,
value_loss), a leaf package that the workers import too; this module only re-exports them, plus
the masked tensor helpers, so code written against ``verl.trainer.ppo.core_algos`` keeps working
after switching the import (same objects, same registries).
"""

from hybridflow.algorithms import *  # noqa: F401,F403
from hybridflow.algorithms import __all__ as _algos_all
from hybridflow.utils.torch_functional import (  # noqa: F401
    entropy_from_logits,
    logprobs_from_logits,
    masked_mean,
    masked_sum,
    masked_var,
    masked_whiten,
)

__all__ = [
    *_algos_all,
    "entropy_from_logits",
    "logprobs_from_logits",
    "masked_mean",
    "masked_sum",
    "masked_var",
    "masked_whiten",
]
