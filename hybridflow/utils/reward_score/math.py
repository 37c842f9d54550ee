"""veRL's ``verl.utils.reward_score.math``: re-exports of ``hybridflow.rewards.scorers.math``."""

from hybridflow.rewards.scorers.math import *  # noqa: F401,F403
from hybridflow.rewards.scorers.math import __all__  # noqa: F401
