"""Where each section class sits in configs/ppo_trainer.yaml: the link between the declarations and the
yaml tree. The tests check each place key by key (every field's default equals the yaml's resolved
value, every yaml key is a field), so the two cannot drift apart; the config-tree generator and,
later, the key reference read the same table."""

from __future__ import annotations

from dataclasses import dataclass

from hybridflow.config.actor import FSDPActorConfig, RefConfig
from hybridflow.config.algorithm import AlgoConfig
from hybridflow.config.critic import FSDPCriticConfig
from hybridflow.config.model import HFModelConfig
from hybridflow.config.rollout import RolloutConfig

__all__ = ["Section", "PPO_TRAINER_SECTIONS", "section_at"]


@dataclass(frozen=True)
class Section:
    """``cls`` (built with its defaults) is the tree at ``path``, less the keys in ``absent`` (dotted,
    relative: a shared class whose copy here lacks a key, e.g. the critic's checkpoint has no strict)."""

    path: str
    cls: type
    absent: tuple[str, ...] = ()


PPO_TRAINER_SECTIONS: tuple[Section, ...] = (
    Section("algorithm", AlgoConfig),
    Section("actor_rollout_ref.model", HFModelConfig),
    Section("actor_rollout_ref.actor", FSDPActorConfig),
    Section("actor_rollout_ref.ref", RefConfig),
    Section("actor_rollout_ref.rollout", RolloutConfig),
    Section("critic", FSDPCriticConfig, absent=("checkpoint.strict",)),
)


def section_at(path: str) -> Section:
    for s in PPO_TRAINER_SECTIONS:
        if s.path == path:
            return s
    raise KeyError(f"no section class is declared at {path!r}; declared: {', '.join(s.path for s in PPO_TRAINER_SECTIONS)}")
