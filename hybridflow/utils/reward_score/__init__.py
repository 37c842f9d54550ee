"""veRL's import path for the rule-based scorers (``verl.utils.reward_score``), kept as re-exports.

The scorers live in ``hybridflow.rewards.scorers``; ``from hybridflow.utils.reward_score import
gsm8k`` and ``default_compute_score`` keep working with the same objects (one scorer registry).
"""

from hybridflow.rewards.scorers import *  # noqa: F401,F403
from hybridflow.rewards.scorers import Scorer, __all__, _default_compute_score  # noqa: F401
