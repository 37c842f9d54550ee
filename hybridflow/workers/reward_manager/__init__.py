"""veRL's import path for the reward managers (``verl.workers.reward_manager``); they live in
``hybridflow.rewards``."""

from hybridflow.rewards.manager import (
    REWARD_MANAGER_REGISTRY,
    BatchRewardManager,
    NaiveRewardManager,
    get_reward_manager_cls,
    register,
)

__all__ = ["REWARD_MANAGER_REGISTRY", "BatchRewardManager", "NaiveRewardManager", "get_reward_manager_cls", "register"]
