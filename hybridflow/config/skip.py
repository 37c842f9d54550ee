"""The ``skip`` section (veRL 0.9.1's SkipManagerConfig): replay cached rollouts instead of generating."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from hybridflow.config.base import BaseConfig, doc, section
from hybridflow.config.errors import ConfigError, check_one_of

__all__ = ["SKIP_ACTIONS", "RolloutSkipConfig", "RolloutTqSkipConfig", "AsyncRolloutSkipConfig", "SkipManagerConfig"]


SKIP_ACTIONS = ("cache", "repeat")


@dataclass
class RolloutSkipConfig(BaseConfig):
    """``skip.rollout``: dump the rollouts of some steps once, then reuse them. Enabled, it is checked
    when built: a setting that would silently replay nothing is refused, naming the key."""

    _place: ClassVar[str] = "skip.rollout"  # where the section sits, for messages

    enable: bool = doc(False, "skip generation on the listed steps")
    dump_dir: str = doc("~/.verl/rollout_dump", "where the rollouts are dumped and read back")
    steps: list[int] = doc([], "steps whose rollout is skipped ([]: every step)")
    action: str = doc("cache", "cache | repeat: what a skipped step gets")

    def __post_init__(self):
        if not self.enable:
            return
        at = self._place
        check_one_of(f"{at}.action", self.action, SKIP_ACTIONS)
        if not self.dump_dir:
            raise ConfigError(f"{at}.enable=True needs {at}.dump_dir (a directory of <step>.jsonl dumps)")
        if not self.steps:
            raise ConfigError(
                f"{at}.enable=True with {at}.steps=[] would replay no step (veRL's meaning); list the "
                f"steps to replay, e.g. {at}.steps=[1,2,3]"
            )


@dataclass
class RolloutTqSkipConfig(RolloutSkipConfig):
    """``skip.rollout_tq``: the same for veRL's TransferQueue trainer (not implemented)."""

    _place: ClassVar[str] = "skip.rollout_tq"


@dataclass
class AsyncRolloutSkipConfig(RolloutSkipConfig):
    """``skip.async_rollout``: the same for veRL's fully async policy (not implemented)."""

    _place: ClassVar[str] = "skip.async_rollout"


@dataclass
class SkipManagerConfig(BaseConfig):
    """``skip``: rollout replay."""

    _target_: str = doc("verl.utils.skip.SkipManagerConfig", "the class this section is read into")
    rollout: RolloutSkipConfig = section(RolloutSkipConfig, "the trainer's rollouts")
    rollout_tq: RolloutTqSkipConfig = section(RolloutTqSkipConfig, "the TransferQueue trainer's rollouts")
    async_rollout: AsyncRolloutSkipConfig = section(AsyncRolloutSkipConfig, "the fully async rollouts")
