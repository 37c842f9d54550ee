"""The ``skip`` section (veRL 0.9.1's SkipManagerConfig): replay cached rollouts instead of generating."""

from __future__ import annotations

from dataclasses import dataclass

from hybridflow.config.base import BaseConfig, doc, section

__all__ = ["RolloutSkipConfig", "RolloutTqSkipConfig", "AsyncRolloutSkipConfig", "SkipManagerConfig"]


@dataclass
class RolloutSkipConfig(BaseConfig):
    """``skip.rollout``: dump the rollouts of some steps once, then reuse them."""

    enable: bool = doc(False, "skip generation on the listed steps")
    dump_dir: str = doc("~/.verl/rollout_dump", "where the rollouts are dumped and read back")
    steps: list[int] = doc([], "steps whose rollout is skipped ([]: every step)")
    action: str = doc("cache", "cache | repeat: what a skipped step gets")


@dataclass
class RolloutTqSkipConfig(RolloutSkipConfig):
    """``skip.rollout_tq``: the same for veRL's TransferQueue trainer (not implemented)."""


@dataclass
class AsyncRolloutSkipConfig(RolloutSkipConfig):
    """``skip.async_rollout``: the same for veRL's fully async policy (not implemented)."""


@dataclass
class SkipManagerConfig(BaseConfig):
    """``skip``: rollout replay."""

    _target_: str = doc("verl.utils.skip.SkipManagerConfig", "the class this section is read into")
    rollout: RolloutSkipConfig = section(RolloutSkipConfig, "the trainer's rollouts")
    rollout_tq: RolloutTqSkipConfig = section(RolloutTqSkipConfig, "the TransferQueue trainer's rollouts")
    async_rollout: AsyncRolloutSkipConfig = section(AsyncRolloutSkipConfig, "the fully async rollouts")
