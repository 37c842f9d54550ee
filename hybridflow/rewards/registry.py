"""The registry of reward managers (veRL's ``REWARD_MANAGER_REGISTRY``): the built-in managers are listed
here, by name; a user's manager registers with ``@register("name")``."""

from __future__ import annotations

from collections.abc import Callable

from hybridflow.rewards.dapo import DAPORewardManager
from hybridflow.rewards.gdpo import GDPORewardManager
from hybridflow.rewards.genrm import GenRMRewardManager
from hybridflow.rewards.loop_manager import LoopRewardManager, is_loop_manager
from hybridflow.rewards.manager import BatchRewardManager, NaiveRewardManager, RemoteRewardManager
from hybridflow.utils.import_utils import load_class
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
    "gdpo": GDPORewardManager,
    "remote": RemoteRewardManager,
}
for _name, _cls in BUILT_IN.items():
    REWARD_MANAGERS.register(_name, _cls)


def reward_manager_class(manager) -> type:
    """The class ``reward.reward_manager`` (a ``RewardManagerConfig``) names: by name from the registry,
    or (``source=importlib``) the class ``name`` in the file ``module.path``."""
    if manager.source != "importlib":
        return get_reward_manager_cls(manager.name)
    path = manager.module.path if manager.module is not None else None
    if not path:
        raise ValueError("reward.reward_manager.source=importlib needs reward.reward_manager.module.path")
    reference = f"{path}:{manager.name}" if str(path).endswith(".py") else f"{path}.{manager.name}"
    cls = load_class(reference, what="reward.reward_manager.module.path")
    if not isinstance(cls, type):
        raise TypeError(f"reward.reward_manager.name={manager.name} in {path} is a {type(cls).__name__}, not a class")
    return cls


def manager_needs_judge(manager) -> bool:
    """Whether the class ``reward.reward_manager`` names scores with a judge (declares ``needs_judge``).
    A name nothing answers to, or a file that does not load, is no judge here: building the manager
    says what is wrong."""
    try:
        cls = reward_manager_class(manager)
    except (OSError, ValueError, KeyError, ImportError, TypeError, AttributeError):
        return False
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
