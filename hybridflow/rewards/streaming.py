"""Rewards that overlap generation (veRL's reward loop, ``reward.num_workers``): each trajectory is scored
as soon as it finishes, in a process of a pool, while the rest of the batch still generates.

The agent loop worker that finished a trajectory sends it, as a one-row batch, to its ``RewardPool`` and
keeps what the reward function gave (``RuleRewardManager.score_rows``) in the ``STREAMED_SCORES``
column; the driver's reward manager takes those results instead of calling the reward function again and
does the rest as for a batch (score placement, bad samples, DAPO's overlong penalty, extra info,
metrics), so the scores are the batch's. Managers whose rows do not score one by one (``batch``, the
generative judge ``genrm``, a manager of yours that is not a ``NaiveRewardManager``), runs with a reward
model and a reward function handed to the trainer by hand score after generation, on the driver.

The pool's processes are forked from the agent loop worker's event loop thread, so the reward function
(loaded there from ``custom_reward_function.path``) is never pickled, and they die with that thread. ``close``
kills them rather than trusting that: a process killed while it waited on the pool's call queue holds the queue's
lock for good, so a sibling spared by the death signal (forked just before the thread ended) would wait on it
forever, and so would the interpreter's exit, which joins every pool's processes (a CI run hung there).
"""

from __future__ import annotations

import ctypes
import dataclasses
import math
import multiprocessing
import os
import signal
import sys
import threading
from concurrent.futures import Future, ProcessPoolExecutor
from typing import Any

from hybridflow.config.reward import RewardConfig
from hybridflow.rewards.custom import get_custom_reward_fn
from hybridflow.rewards.registry import get_reward_manager_cls, load_reward_manager
from hybridflow.rewards.rule_manager import RuleRewardManager

_PR_SET_PDEATHSIG = 1
_LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None  # loaded before any fork


def bad_sample_kwargs(reward: RewardConfig, manager_cls: type) -> dict:
    """``reward.bad_sample_score`` / ``score_timeout_s`` for hybridflow's rule-based managers. A manager of
    yours that is not one handles its own samples: it gets neither, and setting them is an error."""
    settings = {"bad_sample_score": reward.bad_sample_score, "score_timeout_s": reward.score_timeout_s}
    if issubclass(manager_cls, RuleRewardManager):
        return settings
    defaults = {f.name: f.default for f in dataclasses.fields(RewardConfig)}
    changed = [k for k, v in settings.items() if v != defaults[k]]
    if changed:
        raise ValueError(
            f"reward.{changed[0]} applies to hybridflow's rule-based reward managers (RuleRewardManager); "
            f"reward.reward_manager.name={reward.reward_manager.name} ({manager_cls.__name__}) scores its own samples"
        )
    return {}


@dataclasses.dataclass(frozen=True)
class RewardRecipe:
    """What builds the run's reward manager in any process: the ``reward`` section, ``data.reward_fn_key``
    and the tokenizer (picklable, unlike a reward function loaded from a file)."""

    reward: RewardConfig
    reward_fn_key: str
    tokenizer: Any

    def build(self, num_examine: int):
        """The manager ``reward.reward_manager.name`` with the custom reward function and the reward
        kwargs; it keeps this recipe as ``recipe`` so that the trainer can score in the reward loop."""
        if int(self.reward.num_workers) < 0:
            raise ValueError(f"reward.num_workers={self.reward.num_workers} must be >= 0 (0: score after generation)")
        crf = self.reward.custom_reward_function
        name = self.reward.reward_manager.name
        kwargs = dict(self.reward.reward_kwargs)  # e.g. DAPO's max_resp_len, overlong_buffer_cfg
        kwargs.update(bad_sample_kwargs(self.reward, get_reward_manager_cls(name)))
        manager = load_reward_manager(
            name,
            self.tokenizer,
            num_examine=num_examine,
            compute_score=get_custom_reward_fn(crf.path, crf.name, dict(crf.reward_kwargs)),
            reward_fn_key=self.reward_fn_key,
            **kwargs,
        )
        manager.recipe = self
        return manager


def streamed_reward(reward_fn, use_rm: bool) -> RewardRecipe | None:
    """The recipe the agent loop scores each trajectory with, or None where the driver scores the batch
    (``reward.num_workers=0``, a reward model, a manager that does not score row by row, a reward
    function not built from the config)."""
    recipe = getattr(reward_fn, "recipe", None)
    if recipe is None or use_rm or not getattr(reward_fn, "streams", False) or int(recipe.reward.num_workers) == 0:
        return None
    return recipe


class RewardPool:
    """``processes`` processes, each holding the run's reward manager; ``submit(row)`` scores a one-row
    batch in one of them (a Future of ``score_rows``' list). Started on the first call."""

    def __init__(self, recipe: RewardRecipe, processes: int):
        self.recipe, self.processes = recipe, max(1, int(processes))
        self._pool: ProcessPoolExecutor | None = None

    @classmethod
    def share(cls, recipe: RewardRecipe, agent_workers: int) -> RewardPool:
        """One agent loop worker's share of ``reward.num_workers`` (at least one process)."""
        return cls(recipe, math.ceil(int(recipe.reward.num_workers) / max(1, agent_workers)))

    def submit(self, row) -> Future:
        if self._pool is None:
            manager = self.recipe.build(num_examine=0)  # inherited by the forked processes, never pickled
            context = multiprocessing.get_context("fork")
            forker = threading.get_native_id()  # the pool forks its processes in this thread, on this submit
            self._pool = ProcessPoolExecutor(self.processes, context, initializer=_install, initargs=(manager, forker))
        return self._pool.submit(_score_row, row)

    def close(self) -> None:
        """Cancel what waits and kill the processes (an in-flight score is not needed once the pool closes)."""
        pool, self._pool = self._pool, None
        if pool is None:
            return
        processes = list((pool._processes or {}).values())  # shutdown() forgets them (Python 3.14: kill_workers)
        pool.shutdown(wait=False, cancel_futures=True)
        for process in processes:
            process.kill()


_MANAGER = None  # in a pool process: the reward manager


def _install(manager, forker: int) -> None:
    global _MANAGER
    _MANAGER = manager
    if _LIBC is not None:  # end with the thread that forked this process (the agent loop worker's)
        _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        # the signal is not sent for a thread that ended before prctl ran: then this process ends here
        if not os.path.exists(f"/proc/{os.getppid()}/task/{forker}"):
            raise RuntimeError(f"the thread that forked this reward process ({forker}) has ended")


def _score_row(row) -> list:
    return _MANAGER.score_rows(row)
