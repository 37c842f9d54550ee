"""Rewards: reward managers that apply rule-based scorers to a batch, and custom scorer loading.

The scorers themselves live in ``hybridflow.utils.reward_score`` (veRL's import path).
"""

from hybridflow.rewards.custom import get_custom_reward_fn
from hybridflow.rewards.manager import (
    REWARD_MANAGER_REGISTRY,
    REWARD_MANAGERS,
    BatchRewardManager,
    NaiveRewardManager,
    RewardComputationError,
    get_reward_manager_cls,
    load_reward_manager,
    register_reward_manager,
    reward_metrics,
)
from hybridflow.utils.reward_score import default_compute_score, register_scorer

__all__ = [
    "REWARD_MANAGER_REGISTRY",
    "REWARD_MANAGERS",
    "BatchRewardManager",
    "NaiveRewardManager",
    "RewardComputationError",
    "default_compute_score",
    "get_custom_reward_fn",
    "get_reward_manager_cls",
    "load_reward_manager",
    "register_reward_manager",
    "register_scorer",
    "reward_metrics",
]
