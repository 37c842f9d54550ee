"""Where each section class sits in configs/ppo_trainer.yaml: the link between the declarations and the
yaml tree, derived from ``PPOTrainerConfig`` (every top-level section, and the policy's four sections
inside actor_rollout_ref). The tests check each place key by key (every field's default equals the
yaml's resolved value, every yaml key is a field), so the two cannot drift apart."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from hybridflow.config.base import field_absent, field_follows, is_section
from hybridflow.config.ppo_trainer import ActorRolloutRefConfig, PPOTrainerConfig

__all__ = ["Section", "PPO_TRAINER_SECTIONS", "section_at"]


@dataclass(frozen=True)
class Section:
    """``default()`` is the section at ``path`` (its class built with that place's defaults), less the
    keys in ``absent`` (dotted, relative); ``follows``: the interpolations that place adds."""

    path: str
    cls: type
    default: Callable[[], Any]
    absent: tuple[str, ...] = ()
    follows: dict = field(default_factory=dict)


def _sections(owner: type, prefix: str) -> tuple[Section, ...]:
    out = []
    for f in dataclasses.fields(owner):
        if not is_section(f):
            continue
        follows = field_follows(f)
        out.append(
            Section(
                f"{prefix}{f.name}",
                type(f.default_factory()),
                f.default_factory,
                field_absent(f),
                follows if isinstance(follows, dict) else {},
            )
        )
    return tuple(out)


PPO_TRAINER_SECTIONS: tuple[Section, ...] = _sections(PPOTrainerConfig, "") + _sections(
    ActorRolloutRefConfig, "actor_rollout_ref."
)


def section_at(path: str) -> Section:
    for s in PPO_TRAINER_SECTIONS:
        if s.path == path:
            return s
    raise KeyError(
        f"no section class is declared at {path!r}; declared: {', '.join(s.path for s in PPO_TRAINER_SECTIONS)}"
    )
