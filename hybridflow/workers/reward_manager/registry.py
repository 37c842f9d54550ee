"""veRL's ``verl.workers.reward_manager.registry``: the registry of reward manager classes."""

from hybridflow.rewards.manager import REWARD_MANAGER_REGISTRY, get_reward_manager_cls, register

__all__ = ["REWARD_MANAGER_REGISTRY", "get_reward_manager_cls", "register"]
