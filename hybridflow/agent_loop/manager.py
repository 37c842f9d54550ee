"""AgentLoopManager: the driver's rollout. Prompts in, finished trajectories out, over the servers.

One call of ``generate_sequences``:
1. the rollout workers get ready (``prepare_rollout``: push the trainer's new weights into the engines
   in buckets, wake them) — the hybrid engine's training -> generation switch, timed;
2. the batch is split over ``rollout.agent.num_workers`` agent loop workers, each running one asyncio
   task per trajectory against all the servers (sticky, least-loaded routing);
3. the slices are concatenated in order and the workers release the engines (``release_rollout``:
   sleep, where the engine can).

With ``rollout.over_sample_rate`` a training call keeps the first trajectories to finish and cuts the
rest (``over_sample.py``: a thread polls the workers, then cuts them and aborts the engines).

The agent loop workers are helpers of the rollout group (``spawn_helpers``: Ray actors or objects on
an event loop thread of the driver, as the group's backend decides) and reach the rollout servers
through the group's handles (``handles(SERVER_HANDLE)``); the manager never asks which backend it has.
"""

from __future__ import annotations

import time
import uuid
from concurrent.futures import Future
from typing import Any

import numpy as np

from hybridflow.agent_loop.base import AgentLoopSettings
from hybridflow.agent_loop.over_sample import ABORTED_METRIC, OVER_SAMPLE_ID, OverSampleMonitor, over_sample_target
from hybridflow.agent_loop.server_manager import SERVER_HANDLE, ServerHandle
from hybridflow.agent_loop.worker import AgentLoopWorker, split_indices
from hybridflow.protocol import DataProto
from hybridflow.rewards.streaming import RewardRecipe
from hybridflow.rollout.server import RolloutEngineDiedError, engine_death_named
from hybridflow.single_controller.base.cleanup import cleanup_after_failure, is_shut_down
from hybridflow.single_controller.base.watchdog import wait_with_deadline

PROGRESS_ASK_S = 10.0  # how long a progress reading may take before it counts as no reading


def server_handles(worker_group, role: str | None, engine: str = "?") -> list[ServerHandle]:
    """One handle per rank of ``worker_group`` (the rollout workers), whatever the backend, each knowing
    its origin (``engine``: the rollout's name, the group, the rank) to name it if the engine dies.

    ``role`` names the rollout worker inside a fused (colocated) worker class; None for a plain one.
    """
    handles = worker_group.handles(SERVER_HANDLE, role)
    for rank, handle in enumerate(handles):
        handle.origin = (engine, worker_group.name, rank)
    return handles


def _fill_missing_columns(parts: list[DataProto]) -> None:
    """Slices whose loops returned different extra fields get None for the fields they lack."""
    keys = set().union(*(p.non_tensor_batch.keys() for p in parts))
    for p in parts:
        for key in keys - set(p.non_tensor_batch):
            p.non_tensor_batch[key] = np.array([None] * len(p), dtype=object)


class AgentLoopManager:
    def __init__(
        self,
        settings: AgentLoopSettings,
        rollout_wg,
        tokenizer,
        role: str | None = "actor_rollout",
        hybrid_engine: bool = True,
        loop_kwargs: dict | None = None,
        resume_on_abort: bool = False,
        reward: RewardRecipe | None = None,
    ):
        """``hybrid_engine``: the rollout shares its processes with the actor (wake/push/sleep around each
        generation); otherwise weights reach the engines from outside (a separate rollout pool).
        ``resume_on_abort``: partial rollouts (aborted requests continue after a weight update).
        ``reward``: each trajectory is scored as it finishes (``hybridflow.rewards.streaming``)."""
        self.settings = settings
        self.streams_rewards = reward is not None
        self.rollout_wg = rollout_wg
        self.hybrid_engine = hybrid_engine
        self.engine = settings.rollout.name if settings.rollout is not None else "?"
        servers = server_handles(rollout_wg, role, self.engine)
        pad = tokenizer.pad_token_id
        self.workers = rollout_wg.spawn_helpers(
            AgentLoopWorker,
            settings.num_workers,
            settings,
            servers,
            tokenizer,
            pad,
            loop_kwargs,
            resume_on_abort,
            reward,
        )
        self._next_worker = 0

    # ------------------------------------------------------------------------------------------
    def generate_sequences(self, prompts: DataProto) -> DataProto:
        metrics: dict[str, Any] = {}
        step = prompts.meta_info.get("global_steps")
        step = f"{step} (validation)" if prompts.meta_info.get("validate", False) else step
        if self.hybrid_engine:
            metrics.update(self.prepare_rollout(prompts.meta_info.get("weight_version"), step))
        start = time.perf_counter()
        try:
            parts = self._run_workers(prompts)
        except BaseException:
            if self.hybrid_engine:  # best effort, skipped on a group the watchdog shut down: the error stays
                cleanup_after_failure(self.rollout_wg, "release_rollout")
            raise
        if self.hybrid_engine:
            with engine_death_named(self.engine, "release_rollout (putting it to sleep)", step):
                self.rollout_wg.release_rollout()
        metrics["timing_s/generate_sequences"] = time.perf_counter() - start
        aborted = [p.meta_info.get("metrics", {}).pop(ABORTED_METRIC, None) for p in parts]
        if any(a is not None for a in aborted):  # an over-sampled call: the share of the batch cut
            metrics["agent/over_sample/aborted_ratio"] = sum(a[0] for a in aborted if a) / max(len(prompts), 1)
        _fill_missing_columns(parts)
        out = DataProto.concat(parts) if len(parts) > 1 else parts[0]
        worker_metrics = out.meta_info.pop("metrics", {})
        # the output carries only its metrics: the request-naming keys of the call (global_steps,
        # sample_offset, ...) describe the request, and would conflict when batches are concatenated
        out.meta_info = {"metrics": {**worker_metrics, **{k: [v] for k, v in metrics.items()}}}
        return out

    def prepare_rollout(self, version: int | None, step=None) -> dict:
        """Training -> generation on every rollout worker (wake the engines, push the new weights); the
        slowest rank's timings, the step's cost."""
        with engine_death_named(self.engine, "prepare_rollout (waking it and loading the new weights)", step):
            prepared = [p or {} for p in self.rollout_wg.prepare_rollout(version)]
        return {k: max(p.get(k, 0.0) for p in prepared) for k in sorted({k for p in prepared for k in p})}

    def _run_workers(self, prompts: DataProto) -> list[DataProto]:
        """The batch in slices over the agent loop workers, under the rollout group's watchdog deadline
        (finished trajectories are progress); over-sampled calls are cut by a monitor thread."""
        slices = split_indices(len(prompts), len(self.workers))
        target = len(prompts)
        if not prompts.meta_info.get("validate", False) and self.settings.over_sample_rate > 0:
            target = over_sample_target(len(prompts), self.settings.over_sample_rate)
        call = {OVER_SAMPLE_ID: uuid.uuid4().hex} if target < len(prompts) else {}
        chunks, first = [], int(prompts.meta_info.get("sample_offset", 0))  # the step's earlier rows come first
        for start, end in slices:
            part = prompts[start:end]
            part.meta_info = {**prompts.meta_info, "sample_offset": first + start, **call}
            chunks.append(part)
        monitor = None
        if call:
            monitor = OverSampleMonitor(
                target, progress=lambda: self._kept(call[OVER_SAMPLE_ID]), cut=lambda: self._cut(call[OVER_SAMPLE_ID])
            )
        rows = max((len(c) for c in chunks), default=0)
        watchdog = getattr(self.rollout_wg, "watchdog", None)
        deadline = watchdog.deadline(rows, progress=self.completed_trajectories) if watchdog is not None else None
        try:
            parts = wait_with_deadline(
                [self.workers.call(i, "generate_sequences", c) for i, c in enumerate(chunks)],
                deadline,
                group=self.rollout_wg,
                what=f"generate_sequences ({len(prompts)} trajectories over {len(chunks)} agent loop workers)",
            )
        except BaseException as e:
            if monitor is not None:
                monitor.stop(reraise=False)  # the generation's own error is the one to see
            if isinstance(e, RolloutEngineDiedError):  # without the transport's wrapper (Ray's RayTaskError)
                cause = getattr(e, "cause", None)  # None in process: the error itself (raising None hid it)
                raise (cause if isinstance(cause, BaseException) else e) from None
            raise
        if monitor is not None:
            monitor.stop()
        return parts

    def _kept(self, call_id: str) -> int:
        return sum(p.get(call_id, 0) for p in self._ask_workers("over_sample_progress", timeout_s=PROGRESS_ASK_S))

    def _cut(self, call_id: str) -> None:
        """Every worker first (no new request leaves, what comes back ends its trajectory), then the engines."""
        wait_with_deadline(
            self.workers.call_all("cut", call_id),
            None,
            group=self.rollout_wg,
            what="agent loop workers: cut (rollout.over_sample_rate)",
        )
        self.abort()

    def completed_trajectories(self) -> int:
        """Trajectories finished so far (the watchdog's progress reading: a short bounded ask, never a
        hang report of its own)."""
        return int(sum(self._ask_workers("completed_trajectories", timeout_s=PROGRESS_ASK_S)))

    # ------------------------------------------------------------------------------------------
    # streaming (asynchronous training): one request batch at a time, without the hybrid switches
    def submit(self, prompts: DataProto) -> Future:
        """Start ``prompts`` (e.g. one prompt's group) on the next agent loop worker; the Future gives
        the finished DataProto. ``prompts.meta_info`` names the requests (global_steps, sample_offset)."""
        index = self._next_worker % len(self.workers)
        self._next_worker += 1
        return self.workers.future(index, "generate_sequences", prompts)

    def _ask_workers(self, method: str, timeout_s: float) -> list:
        """The workers' answers within ``timeout_s``, else ``TimeoutError``."""
        return self.workers.ask_all(method, timeout_s)

    def _call_workers(self, method: str) -> list:
        """Every agent loop worker's answer, under the rollout group's watchdog deadline."""
        return wait_with_deadline(
            self.workers.call_all(method), None, group=self.rollout_wg, what=f"agent loop workers: {method}"
        )

    def pause(self) -> None:
        """Hold every new request (and re-sent aborted ones) in the agent loop workers."""
        self._call_workers("pause")

    def resume(self) -> None:
        self._call_workers("resume")

    def in_flight(self) -> int:
        """Requests being served right now, over all agent loop workers."""
        return int(sum(self._call_workers("in_flight")))

    def abort(self) -> None:
        """Stop the requests in flight on every engine (they return what they have)."""
        self.rollout_wg.abort_rollout()

    def shutdown(self) -> None:
        # what the tracers buffered reaches the store (not after the watchdog shut the rollout group down:
        # the wait would run under the deadline of workers that are gone)
        if self.settings.trace is not None and not is_shut_down(self.rollout_wg):
            self._call_workers("close_tracer")
        if self.streams_rewards and not is_shut_down(self.rollout_wg):  # else the pools die with their workers
            self._call_workers("close_rewards")
        self.workers.close()
