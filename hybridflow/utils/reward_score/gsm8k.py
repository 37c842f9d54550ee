"""veRL's ``verl.utils.reward_score.gsm8k``: re-exports of ``hybridflow.rewards.scorers.gsm8k``."""

from hybridflow.rewards.scorers.gsm8k import *  # noqa: F401,F403
from hybridflow.rewards.scorers.gsm8k import __all__  # noqa: F401
