"""Rewards that overlap generation (veRL's reward loop, ``reward.num_workers``): each trajectory is scored
as soon as it finishes, in a process of a pool, while the rest of the batch still generates.

The agent loop worker that finished a trajectory sends it, as a one-row batch, to its ``RewardPool`` and
keeps what the reward function gave (``RuleRewardManager.score_rows``) in the ``STREAMED_SCORES``
column; the driver's reward manager takes those results instead of calling the reward function again and
does the rest as for a batch (score placement, bad samples, DAPO's overlong penalty, extra info,
metrics), so the scores are the batch's. Managers whose rows do not score one by one (``batch``, the
generative judge ``genrm``, a manager of yours that is not a ``NaiveRewardManager``), runs with a reward
model and a reward function handed to the trainer by hand score after generation, on the driver.

The pool's processes are forked from a host process of their own (``pool_host``: a fresh interpreter that
builds the manager from the picklable ``RewardRecipe``), not from the process that trains: a fork of that
one crashed where another thread's state could not be freed in the copy (``pool_host`` says how). The
reward function (loaded in the host from ``custom_reward_function.path``) is never pickled. The host dies
with the thread that started it and its processes with the host; ``close`` kills the host rather than
waiting on it (a process killed while it waited on its pool's call queue holds the queue's lock for good).
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
import os
import pickle
import queue
import subprocess
import sys
import threading
from concurrent.futures import Future
from concurrent.futures.process import BrokenProcessPool
from multiprocessing.connection import Connection
from typing import Any

from hybridflow.config.base import to_dict
from hybridflow.config.convert import as_dictconfig
from hybridflow.config.reward import RewardConfig, SandboxFusionConfig
from hybridflow.rewards.custom import get_custom_reward_fn
from hybridflow.rewards.loop_manager import LoopRewardManager, is_loop_manager
from hybridflow.rewards.registry import build_reward_manager, reward_manager_class
from hybridflow.rewards.rule_manager import RuleRewardManager
from hybridflow.rewards.sandbox_fusion import shared_semaphore


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


def sandbox_scorer(manager_cls: type, sandbox: SandboxFusionConfig):
    """The manager's built-in scorer with ``reward.sandbox_fusion`` bound (code tests run in that service)."""
    default = getattr(manager_cls, "default_score", None)
    if default is None:
        raise ValueError(
            f"reward.sandbox_fusion.url={sandbox.url}: reward manager {manager_cls.__name__} has no built-in scorer "
            "(a default_score) to run code tests with; score code in your reward function instead"
        )
    return functools.partial(
        default,
        sandbox_fusion_url=sandbox.url,
        concurrent_semaphore=shared_semaphore(sandbox.url, sandbox.max_concurrent),
        memory_limit_mb=sandbox.memory_limit_mb,
    )


@dataclasses.dataclass(frozen=True)
class RewardRecipe:
    """What builds the run's reward manager in any process: the ``reward`` section, ``data.reward_fn_key``
    and the tokenizer (picklable, unlike a reward function loaded from a file); ``run_config``: the whole
    run's config as plain dicts, the ``config`` a veRL reward-loop manager class reads (None: the reward
    section and data.reward_fn_key only)."""

    reward: RewardConfig
    reward_fn_key: str
    tokenizer: Any
    run_config: dict | None = None

    def manager_class(self) -> type:
        """``reward.reward_manager``'s class: by name from the registry, or (``source=importlib``) the class
        ``name`` in the file ``module.path``."""
        return reward_manager_class(self.reward.reward_manager)

    def build(self, num_examine: int):
        """The manager ``reward.reward_manager`` names, with the custom reward function and the reward
        kwargs; it keeps this recipe as ``recipe`` so that the trainer can score in the reward loop."""
        if int(self.reward.num_workers) < 0:
            raise ValueError(f"reward.num_workers={self.reward.num_workers} must be >= 0 (0: score after generation)")
        crf = self.reward.custom_reward_function
        cls = self.manager_class()
        runs_as = LoopRewardManager if is_loop_manager(cls) else cls  # a veRL reward-loop class runs wrapped
        kwargs = dict(self.reward.reward_kwargs)  # e.g. DAPO's max_resp_len, overlong_buffer_cfg
        kwargs.update(bad_sample_kwargs(self.reward, runs_as))
        compute_score = get_custom_reward_fn(crf.path, crf.name, dict(crf.reward_kwargs))
        if compute_score is None and self.reward.sandbox_fusion.url:  # veRL binds it to the built-in scorers only
            compute_score = sandbox_scorer(runs_as, self.reward.sandbox_fusion)
        if is_loop_manager(cls):
            tree = self.run_config or {"reward": to_dict(self.reward), "data": {"reward_fn_key": self.reward_fn_key}}
            kwargs["config"] = as_dictconfig(tree)
        manager = build_reward_manager(
            cls, self.tokenizer, num_examine=num_examine, compute_score=compute_score, reward_fn_key=self.reward_fn_key,
            **kwargs,
        )  # fmt: skip
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
    batch in one of them (a Future of ``score_rows``' list). Started on the first call: a host process
    (``pool_host``) that builds the manager and forks the processes, fed through two pipes by two threads
    of this one (rows are written off the event loop: the host reads none while it starts)."""

    def __init__(self, recipe: RewardRecipe, processes: int):
        self.recipe, self.processes = recipe, max(1, int(processes))
        self._host: subprocess.Popen | None = None
        self._lock = threading.Lock()
        self._waiting: dict[int, Future] = {}
        self._tasks = itertools.count()
        self._broken: str | None = None
        self._rows: queue.SimpleQueue | None = None
        self._threads: list[threading.Thread] = []
        self._ready = threading.Event()

    @classmethod
    def share(cls, recipe: RewardRecipe, agent_workers: int) -> RewardPool:
        """One agent loop worker's share of ``reward.num_workers`` (at least one process)."""
        return cls(recipe, math.ceil(int(recipe.reward.num_workers) / max(1, agent_workers)))

    @property
    def host_pid(self) -> int | None:
        return self._host.pid if self._host is not None else None

    @property
    def ready(self) -> bool:
        """A row submitted now does not wait on the host's start: the host has built the manager (or has
        failed: then the row fails at once as a broken pool)."""
        return self._ready.is_set()

    def wait_ready(self, timeout: float) -> bool:
        return self._ready.wait(timeout)

    def submit(self, row) -> Future:
        self.start()
        future: Future = Future()
        with self._lock:
            if self._broken is not None:
                future.set_exception(BrokenProcessPool(self._broken))
                return future
            task = next(self._tasks)
            self._waiting[task] = future
        self._rows.put((task, row))  # pickled by the writer thread, off the event loop
        return future

    def start(self) -> None:
        """Start the host now (it takes seconds to import what scoring needs) unless it runs: call it from the
        thread that submits, whose end the host's ends with."""
        if self._host is not None:
            return
        to_host, from_trainer = os.pipe()
        to_trainer, from_host = os.pipe()
        command = [sys.executable, "-m", "hybridflow.rewards.pool_host"]
        command += [str(to_host), str(from_host), str(self.processes), str(threading.get_native_id())]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}  # what this process imports
        try:
            self._host = subprocess.Popen(command, pass_fds=(to_host, from_host), env=env, stdin=subprocess.DEVNULL)
        finally:
            os.close(to_host)
            os.close(from_host)
        self._broken, self._rows, self._ready = None, queue.SimpleQueue(), threading.Event()
        self._rows.put(self.recipe)
        writer = Connection(from_trainer, readable=False)
        reader = Connection(to_trainer, writable=False)
        self._threads = [
            threading.Thread(target=self._write, args=(writer, self._rows), name="reward-pool-writer", daemon=True),
            threading.Thread(
                target=self._read, args=(reader, self._host, self._ready), name="reward-pool-reader", daemon=True
            ),
        ]
        for thread in self._threads:
            thread.start()

    def _write(self, writer: Connection, rows: queue.SimpleQueue) -> None:
        with writer:
            while (item := rows.get()) is not None:
                try:
                    writer.send_bytes(pickle.dumps(item))
                except OSError:  # the host has ended: the reader fails what waits
                    return

    def _read(self, reader: Connection, host: subprocess.Popen, ready: threading.Event) -> None:
        with reader:
            while True:
                try:
                    task, ok, answer = pickle.loads(reader.recv_bytes())
                except (EOFError, OSError):
                    self._fail(f"the reward host process {host.pid} ended (exit code {host.wait()})")
                    return
                try:  # a result whose class this process cannot import fails its row, not the reader
                    value = pickle.loads(answer)
                except Exception as err:  # noqa: BLE001
                    ok, value = False, RuntimeError(f"the reward host's answer cannot be read here: {err!r}")
                if task is None:  # the host as a whole: started, or failed
                    if ok:
                        ready.set()
                    else:
                        self._fail(str(value))
                    continue
                with self._lock:
                    future = self._waiting.pop(task, None)
                if future is not None and future.set_running_or_notify_cancel():
                    (future.set_result if ok else future.set_exception)(value)

    def _fail(self, reason: str) -> None:
        with self._lock:
            self._broken = self._broken or reason
            waiting, self._waiting = self._waiting, {}
        self._ready.set()  # nothing to wait for: a row submitted now fails at once, and the worker starts anew
        for future in waiting.values():
            if future.set_running_or_notify_cancel():
                future.set_exception(BrokenProcessPool(reason))

    def close(self) -> None:
        """Kill the host, and with it the scoring processes (an in-flight score is not needed once the
        pool closes); what waits fails."""
        host, self._host = self._host, None
        if host is None:
            return
        host.kill()  # its processes end with it (the death signal): a stopped one too
        self._rows.put(None)
        for thread in self._threads:
            thread.join()
        self._fail("the reward pool was closed")
