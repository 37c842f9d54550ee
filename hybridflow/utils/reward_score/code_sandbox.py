"""veRL's ``verl.utils.reward_score.code_sandbox``: re-exports of ``hybridflow.rewards.scorers.code_sandbox``."""

from hybridflow.rewards.scorers.code_sandbox import *  # noqa: F401,F403
from hybridflow.rewards.scorers.code_sandbox import __all__  # noqa: F401
