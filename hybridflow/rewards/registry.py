"""The registry of reward managers (veRL's ``REWARD_MANAGER_REGISTRY``): the built-in managers are listed
here, by name; a user's manager registers with ``@register("name")``."""

from __future__ import annotations

from collections.abc import Callable

from hybridflow.rewards.dapo import DAPORewardManager
from hybridflow.rewards.genrm import GenRMRewardManager
from hybridflow.rewards.loop_manager import LoopRewardManager, is_loop_manager
from hybridflow.rewards.manager import BatchRewardManager, NaiveRewardManager
from hybridflow.utils.registry import Registry

REWARD_MANAGERS: Registry[type] = Registry("Reward manager", unknown="Unknown reward manager: {name}")
REWARD_MANAGER_REGISTRY = REWARD_MANAGERS  # veRL's name (verl.workers.reward_manager.registry)


def register_reward_manager(name: str, *, override: bool = False):
    """Class decorator: make a reward manager available to ``load_reward_manager(name, ...)``.
    The same class again is fine; a different class under a taken name is an error."""
    return REWARD_MANAGERS.register(name, override=override)


register = register_reward_manager  # veRL's spelling: ``@register("name")``


def get_reward_manager_cls(name: str) -> type:
    """The class registered under ``name``; unknown names raise (a ValueError, as in veRL, and a
    KeyError) listing the known ones."""
    return REWARD_MANAGERS[name]


BUILT_IN = {
    "naive": NaiveRewardManager,
    "batch": BatchRewardManager,
    "dapo": DAPORewardManager,
    "genrm": GenRMRewardManager,
}
for _name, _cls in BUILT_IN.items():
    REWARD_MANAGERS.register(_name, _cls)


def manager_needs_judge(name) -> bool:
    """Whether the registered reward manager ``name`` scores with a judge (unknown names: no)."""
    cls = REWARD_MANAGERS.get(str(name), None) if name is not None else None
    return bool(getattr(cls, "needs_judge", False))


def load_reward_manager(
    reward_manager_name: str, tokenizer, num_examine: int, compute_score: Callable | None = None, **kwargs
):
    """Build the registered manager ``reward_manager_name`` (config: reward_model.reward_manager)."""
    return build_reward_manager(
        get_reward_manager_cls(reward_manager_name), tokenizer, num_examine, compute_score, **kwargs
    )


def build_reward_manager(cls: type, tokenizer, num_examine: int, compute_score: Callable | None = None, **kwargs):
    """A manager of class ``cls``; a veRL reward-loop class (``RewardManagerBase``) runs inside
    ``LoopRewardManager`` (``config``: what it reads, veRL's whole config tree)."""
    if is_loop_manager(cls):
        return LoopRewardManager(cls, tokenizer, num_examine, compute_score, **kwargs)
    return cls(tokenizer=tokenizer, num_examine=num_examine, compute_score=compute_score, **kwargs)
