"""The Rollouter: generation running ahead of training, within a staleness budget (driver side).

A background thread takes prompts from the dataloader in order, starts each prompt's group
(``rollout.n`` trajectories) on the agent loop workers (``AgentLoopManager.submit``) and puts
finished groups in a queue; the trainer takes ``prompts_per_step`` finished groups per step.

Staleness (veRL's rule): between two weight syncs the rollouter may start at most
``(1 + staleness_threshold) × prompts_per_step × trigger_parameter_sync_step`` groups, counting the
groups still in flight or waiting in the queue when the period began. So ``staleness_threshold=0`` and
a sync every step generate exactly one step's groups with the newest weights (the synchronous
schedule), ``staleness_threshold=1`` lets the next step's groups be generated while the trainer trains
(one-step-off), larger values run further ahead. Every trajectory records the weight versions its
tokens came from; the trainer logs the version lag.

The budget alone bounds how far generation runs ahead, not how late a slow group is trained: newer
groups could finish first and be taken while an old one is still running. So ``take`` asks the off-policy
sampler (``off_policy.py``) which groups to hand out (oldest weights first), which to evict (``drop``: one
new prompt replaces each) and which still-running group to wait for (``wait``). By default it waits for a
group that would otherwise exceed the lag bound ``max_lag = trigger - 1 + ceil(staleness × trigger)``
(``staleness_bound``): with the budget above there are never more such groups than one step takes, and
every trained sample's lag stays within the bound. A group whose generation failed is, with
``refill_failed``, evicted and replaced the same way (veRL's V1 modes); otherwise the run stops with it.

A weight sync (``sync_weights``): with partial rollouts the agent loop workers hold new requests, the
engines abort the ones in flight (they return the tokens they have), the weights go over, and the held
requests continue from their tokens with the new weights; without partial rollouts the rollouter stops
starting groups and waits for the ones in flight to finish before the weights go over.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field

from hybridflow.protocol import DataProto
from hybridflow.single_controller.base.cleanup import cleanup_after_failure
from hybridflow.single_controller.base.watchdog import Deadline, Watchdog, build_hang_error, default_watchdog
from hybridflow.trainer.ppo.off_policy import OffPolicySampler

logger = logging.getLogger(__name__)

POLL_S = 0.5  # the trainer's waits on the rollouter check their deadline this often


@dataclass
class PromptGroup:
    """One prompt's ``n`` copies, named by the dataloader batch it came from and its row there."""

    gen_index: int  # 1-based count of dataloader batches: names the requests (global_steps in meta_info)
    position: int  # the prompt's row in its batch
    epoch: int
    prompts: DataProto  # n rows (the prompt repeated), uid set, every non-tensor column


@dataclass
class FinishedGroup:
    group: PromptGroup
    output: DataProto  # the prompts' columns + the rollout's tensors
    started_at_version: int
    finished_at: float = field(default_factory=time.perf_counter)


# the classes a checkpoint's driver state may hold (the asynchronous sources' pending and finished groups)
CHECKPOINT_TYPES = (PromptGroup, FinishedGroup)


def staleness_bound(staleness_threshold: float, trigger_parameter_sync_step: int) -> int:
    """The largest version lag a trained sample can have: a group started right after a sync may be
    trained up to ``(1 + s) × trigger`` steps later, one of which is the step that produced its weights."""
    t = int(trigger_parameter_sync_step)
    return t - 1 + int(math.ceil(float(staleness_threshold) * t - 1e-9))


class Rollouter:
    def __init__(
        self,
        manager,
        groups: Iterator[PromptGroup],
        prompts_per_step: int,
        staleness_threshold: float,
        trigger_parameter_sync_step: int,
        partial_rollout: bool,
        sampling_meta: dict | None = None,
        watchdog: Watchdog | None = None,
        group=None,
        sampler: OffPolicySampler | None = None,
        refill_failed: bool = False,
    ):
        """``watchdog`` bounds the trainer's waits on the rollout workers (``group``, whose stacks a hang
        report shows); None: the process default. ``sampler``: the off-policy bound (default: wait within
        ``staleness_bound``); ``refill_failed``: a group whose generation failed is replaced, not fatal."""
        if staleness_threshold < 0:
            raise ValueError(f"async_training.staleness_threshold must be >= 0, got {staleness_threshold}")
        if trigger_parameter_sync_step < 1:
            raise ValueError(
                f"async_training.trigger_parameter_sync_step must be >= 1, got {trigger_parameter_sync_step}"
            )
        self.manager = manager
        self.watchdog = watchdog if watchdog is not None else default_watchdog()
        self.group = group
        self._groups = groups
        self.prompts_per_step = prompts_per_step
        self.budget = int(math.floor((1 + staleness_threshold) * prompts_per_step * trigger_parameter_sync_step + 1e-9))
        self.max_lag = staleness_bound(staleness_threshold, trigger_parameter_sync_step)
        self.sampler = sampler or OffPolicySampler(self.max_lag + 1, "wait")
        self.refill_failed = refill_failed
        self._evicted: dict[str, list[int]] = {"off_policy": [], "rollout_failure": []}  # spans since the last take
        self._failures_in_a_row = 0
        self.partial_rollout = partial_rollout
        self.sampling_meta = dict(sampling_meta or {})
        self.version = 0
        self._started_in_period = 0
        self._in_flight: dict[int, tuple[PromptGroup, int]] = {}  # id(future) -> (group, version at its start)
        self._ready: list[FinishedGroup] = []
        self._unconsumed_start: list[PromptGroup] = []  # groups to start before new ones (a resumed run's)
        self._error: BaseException | None = None
        self.finished_total = 0  # groups finished since the start (progress for the watchdog)
        self._stopped = False
        self._holding = False  # a sync is under way: start nothing
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        # idle accounting: time with nothing in flight, since the last ``take``
        self._idle_since: float | None = time.perf_counter()
        self._idle_s = 0.0
        self._window_start = time.perf_counter()

    # ------------------------------------------------------------------------------ lifecycle
    def start(self, pending: list[PromptGroup] | None = None, finished: list[FinishedGroup] | None = None) -> None:
        """``pending``: groups to start before new prompts; ``finished``: groups ready to train as they are
        (a resumed run's); both count against the first period's budget."""
        self._unconsumed_start = list(pending or [])
        self._ready = list(finished or [])
        self._started_in_period = len(self._ready)
        self._thread = threading.Thread(target=self._run, name="hybridflow-rollouter", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=30)

    def _run(self) -> None:
        try:
            while True:
                with self._cond:
                    self._cond.wait_for(
                        lambda: self._stopped or (not self._holding and self._started_in_period < self.budget)
                    )
                    if self._stopped:
                        return
                    group = self._unconsumed_start.pop(0) if self._unconsumed_start else next(self._groups, None)
                    if group is None:
                        return
                    self._started_in_period += 1
                    self._launch(group)
        except BaseException as e:  # surfaced to the trainer by take()
            with self._cond:
                self._error = e
                self._cond.notify_all()

    def _launch(self, group: PromptGroup) -> None:
        """Start one group (called with the lock held)."""
        meta = {
            **self.sampling_meta,
            "global_steps": group.gen_index,
            "sample_offset": group.position * len(group.prompts),
        }
        request = group.prompts.select(
            batch_keys=["input_ids", "attention_mask", "position_ids"],
            non_tensor_batch_keys=list(group.prompts.non_tensor_batch),
        )
        request.meta_info = meta
        future: Future = self.manager.submit(request)
        if self._idle_since is not None:
            self._idle_s += time.perf_counter() - self._idle_since
            self._idle_since = None
        version = self.version
        self._in_flight[id(future)] = (group, version)
        future.add_done_callback(lambda f: self._finished(f, group, version))

    def _finished(self, future: Future, group: PromptGroup, version: int) -> None:
        with self._cond:
            self._in_flight.pop(id(future), None)
            if not self._in_flight:
                self._idle_since = time.perf_counter()
            try:
                out = future.result()
            except BaseException as e:
                if self._stopped:  # cancelled at shutdown
                    return
                self._failures_in_a_row += 1
                if not self.refill_failed or self._failures_in_a_row > self.prompts_per_step:
                    self._error = e  # a failure of every group of a step in a row is a bug, not bad luck
                else:
                    logger.warning(
                        "rollout group %s/%s failed (%r); a new prompt replaces it", group.gen_index, group.position, e
                    )
                    self._evict("rollout_failure", [0])
                self._cond.notify_all()
                return
            self._failures_in_a_row = 0
            out.meta_info.pop("metrics", None)
            columns = group.prompts.select(batch_keys=[], non_tensor_batch_keys=list(group.prompts.non_tensor_batch))
            self._ready.append(FinishedGroup(group, columns.union(out), version))
            self.finished_total += 1
            self._cond.notify_all()

    # ------------------------------------------------------------------------------ trainer side
    def _due_in_flight(self, actor_version: int | None) -> bool:
        """A group still generating that the sampler waits for at ``actor_version`` (``wait``)."""
        if actor_version is None:
            return False
        return any(self.sampler.blocks(version, actor_version) for _, version in self._in_flight.values())

    def _evict(self, reason: str, spans: list[int]) -> None:
        """Groups gone without training (lock held): one new prompt may start for each."""
        self._evicted[reason] += spans
        self._started_in_period -= len(spans)
        self._cond.notify_all()

    def _drop_stale(self, actor_version: int | None) -> None:
        """``drop``: evict the finished groups beyond the off-policy threshold (lock held)."""
        if actor_version is None:
            return
        stale = [g for g in self._ready if self.sampler.stale(g.started_at_version, actor_version)]
        if stale:
            gone = {id(g) for g in stale}
            self._ready = [g for g in self._ready if id(g) not in gone]
            self._evict("off_policy", [self.sampler.span(g.started_at_version, actor_version) for g in stale])

    def replace(self, count: int) -> None:
        """``count`` taken groups were discarded (dynamic sampling's uniform groups): as many new prompts may start."""
        with self._cond:
            self._started_in_period -= count
            self._cond.notify_all()

    def _eviction_metrics(self) -> dict[str, float]:
        """veRL's names for the groups evicted since the last take (lock held)."""
        stale, failed = self._evicted["off_policy"], self._evicted["rollout_failure"]
        self._evicted = {"off_policy": [], "rollout_failure": []}
        out = {
            "training/off_policy/evicted_samples": float(len(stale)),
            "training/rollout_failure/evicted_samples": float(len(failed)),
        }
        if stale:
            out["training/off_policy/evicted_samples_staleness/max"] = float(max(stale))
        return out

    def _wait(self, predicate: Callable[[], bool], deadline: Callable[[], Deadline | None], what: str) -> None:
        """Wait (lock held) until ``predicate``, in bounded steps; past the watchdog's deadline (every
        finished group is progress) raise ``WorkerHangError`` naming the rollout group's stuck ranks."""
        d = deadline()
        while not self._cond.wait_for(predicate, timeout=POLL_S):
            if d is not None and d.expired():
                self._cond.release()  # the report takes the workers' stacks: let their answers land meanwhile
                try:
                    raise build_hang_error(what, d, self.group)
                finally:
                    self._cond.acquire()

    def _deadline(self, groups: int = 0) -> Deadline | None:
        if self.watchdog is None:
            return None
        return self.watchdog.deadline(groups, progress=lambda: self.finished_total)

    def take(
        self, count: int, timeout_s: float | None = None, actor_version: int | None = None
    ) -> tuple[list[FinishedGroup], dict[str, float]]:
        """Wait until ``count`` groups are finished (and, given the trainer's ``actor_version``, no group
        that is due now is still generating); return the oldest-weight ones in prompt order and the wait
        metrics. ``timeout_s`` (else the watchdog's deadline) bounds the wait."""
        start = time.perf_counter()
        with self._cond:

            def ready() -> bool:  # evicts the stale finished groups as it looks
                self._drop_stale(actor_version)
                return (
                    self._error is not None
                    or (len(self._ready) >= count and not self._due_in_flight(actor_version))
                    or (self._thread is not None and not self._thread.is_alive() and not self._in_flight)
                )

            if timeout_s is not None:
                ok = self._cond.wait_for(ready, timeout=timeout_s)
            else:
                self._wait(ready, lambda: self._deadline(count), f"waiting for {count} finished rollout groups")
                ok = True
            if self._error is not None:
                raise RuntimeError("asynchronous rollout failed") from self._error
            if not ok or len(self._ready) < count:
                raise TimeoutError(
                    f"the rollouter produced {len(self._ready)} of {count} groups "
                    f"({len(self._in_flight)} in flight) within {timeout_s} s"
                )
            self._ready = self.sampler.order(self._ready)
            taken, self._ready = self._ready[:count], self._ready[count:]
            now = time.perf_counter()
            idle = self._idle_s + (now - self._idle_since if self._idle_since is not None else 0.0)
            window = max(now - self._window_start, 1e-9)
            self._idle_s, self._window_start = 0.0, now
            if self._idle_since is not None:
                self._idle_since = now
            metrics = {
                "async/rollout_idle_fraction": idle / window,
                "async/queue_size": float(len(self._ready)),
                "async/in_flight_groups": float(len(self._in_flight)),
                "timing_s/wait_for_rollout": now - start,
                **self._eviction_metrics(),
            }
        taken.sort(key=lambda g: (g.group.gen_index, g.group.position))
        return taken, metrics

    def hold(self) -> None:
        """Stop generating: no group starts and, with partial rollouts, the requests in flight return the
        tokens they have (they continue after the next ``sync_weights`` or ``resume_generation``); without,
        wait for the groups in flight to finish with the weights they started with."""
        with self._cond:
            if self._holding:
                return
            self._holding = True
        if self.partial_rollout:
            self.manager.pause()  # nothing new reaches the engines...
            self.manager.abort()  # ...and what runs returns its tokens (it resumes after the sync)
        else:
            with self._cond:
                self._wait(
                    lambda: not self._in_flight or self._error is not None,
                    self._deadline,
                    f"the {len(self._in_flight)} rollout groups in flight before a weight sync",
                )

    @property
    def held(self) -> bool:
        return self._holding

    def resume_generation(self) -> None:
        """End a ``hold`` without new weights (the same version goes on)."""
        with self._cond:
            self._holding = False
            self._cond.notify_all()
        if self.partial_rollout:
            self.manager.resume()

    def sync_weights(self, push: Callable[[], dict], version: int) -> dict:
        """Hold generation (if not held already), send the weights (``push``), resume; see the module docstring."""
        start = time.perf_counter()
        self.hold()
        drained = time.perf_counter()
        try:
            metrics = dict(push() or {})
        except BaseException:
            self._end_hold(version)
            if self.partial_rollout:  # best effort: the push's error is the one to see
                cleanup_after_failure(self.manager, "resume")
            raise
        self._end_hold(version)
        if self.partial_rollout:
            self.manager.resume()
        metrics["timing_s/rollout_hold"] = drained - start
        metrics["timing_s/sync_weights_total"] = time.perf_counter() - start
        return metrics

    def _end_hold(self, version: int) -> None:
        with self._cond:
            self.version = version
            # groups in flight or not yet taken count against the new period (veRL's rule)
            self._started_in_period = len(self._in_flight) + len(self._ready)
            self._holding = False
            self._cond.notify_all()

    def pending(self) -> list[PromptGroup]:
        """Groups pulled from the dataloader but neither finished nor taken (in flight, or queued for a
        restart): a checkpoint saves them so that a resumed run generates them again."""
        with self._cond:
            groups = [g for g, _ in self._in_flight.values()] + list(self._unconsumed_start)
        return sorted(groups, key=lambda g: (g.gen_index, g.position))

    def finished(self) -> list[FinishedGroup]:
        """Groups finished but not taken: a checkpoint saves them as they are (a resumed run trains them)."""
        with self._cond:
            return list(self._ready)
