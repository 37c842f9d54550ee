"""Sections of hybridflow's yaml with a test's changes on top. Workers, engines and settings classes
read whole validated sections (the defaults live in configs/*.yaml only), so tests start from the
yaml too: ``section("actor_rollout_ref.actor.optim", lr=1e-2)``."""

from __future__ import annotations

import copy

from hybridflow.config.convert import omega_conf_to_dataclass
from hybridflow.config.engine import FSDPEngineConfig
from hybridflow.config.loader import default_config
from hybridflow.config.optimizer import FSDPOptimizerConfig


def _merge(base: dict, changes: dict) -> dict:
    for key, value in changes.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict) and value:
            _merge(base[key], value)
        else:
            base[key] = value
    return base


def section(path: str, config: str = "ppo_trainer", **changes) -> dict:
    node = default_config(config)
    for part in path.split("."):
        node = node[part]
    return _merge(copy.deepcopy(node), changes)


def optim(**changes) -> FSDPOptimizerConfig:
    """``actor.optim`` with ``changes``, read into its typed section (what the engine takes)."""
    path = "actor_rollout_ref.actor.optim"
    return omega_conf_to_dataclass(section(path, **changes), FSDPOptimizerConfig, path=path)


def fsdp_config(**changes) -> dict:
    return section("actor_rollout_ref.actor.fsdp_config", **changes)


def fsdp_engine(**changes) -> FSDPEngineConfig:
    """``actor.fsdp_config`` with ``changes``, read into its typed section (what the engine takes)."""
    return omega_conf_to_dataclass(fsdp_config(**changes), FSDPEngineConfig, path="actor_rollout_ref.actor.fsdp_config")


def _grad_clip(changes: dict) -> dict:
    """``grad_clip`` (the spelling before veRL 0.9.1) also sets ``optim.clip_grad``, as load_config maps it."""
    if "grad_clip" in changes:
        changes = {**changes, "optim": {**changes.get("optim", {}), "clip_grad": changes["grad_clip"]}}
    return changes


def actor(**changes) -> dict:
    """The actor section as the worker hands it to DataParallelPPOActor (use_remove_padding, from
    actor_rollout_ref.model, off unless changed)."""
    return section("actor_rollout_ref.actor", **{"use_remove_padding": False, **_grad_clip(changes)})


def critic(**changes) -> dict:
    """The critic section (critic.model.use_remove_padding off unless changed; ``use_remove_padding=``
    is a shortcut for it)."""
    changes = _grad_clip(changes)
    packed = changes.pop("use_remove_padding", False)
    changes["model"] = {**changes.get("model", {}), "use_remove_padding": packed}
    return section("critic", **changes)
