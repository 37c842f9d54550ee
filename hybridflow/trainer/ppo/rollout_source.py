"""Where a training step's trajectories come from: the three modes of one driver.

``async_training.mode`` picks one source at start-up (``make_rollout_source``); the trainer's loop is
the same for all: ``for item in source.inputs(step, version): train_step(item)``, whose first phase is
``source.generate(item, ...)`` (dynamic sampling asks ``source.refill`` for more), and which calls
``source.after_update`` once the actor has trained. A source gets what it uses, never the trainer: the
agent loop manager, the stream of prompt batches (whose loader's state is the source's checkpoint), and
``push_weights(version)`` (the trainer's weights to a separate rollout pool).

- ``sync`` (default): a step's prompts are generated when the step starts, with the newest weights.
  Colocated, the hybrid engine pushes the weights at the next generation; with a separate rollout
  pool they are sent right after the update. With ``trainer.v1.sampler.sync_refill_failed_groups`` a group
  whose agent loop raised is dropped and dynamic sampling's refill loop draws one new prompt for it
  (hybridflow's one_step_off and fully_async: the Rollouter replaces it); off, the failure stops the run.
- ``one_step_off``: the rollout pool generates step k+1 while the trainer trains on step k (a
  ``Rollouter`` with staleness 1, weights sent after every step, no partial rollouts).
- ``fully_async``: the ``Rollouter`` streams groups within veRL's staleness budget, weights sent every
  ``trigger_parameter_sync_step`` steps, partial rollouts as configured.

veRL 0.9's V1 trainer modes (``trainer.v1.trainer_mode``) are the same ``Rollouter`` (``v1_schedule``):

- ``colocate_async``: the colocated engines; a step takes ``train_batch_size`` groups, the start budget
  lets ``num_warmup_batches`` batches run ahead (staleness = num_warmup_batches), the weights go to the
  engines after every step. Generation runs while the trainer waits for its groups: once they are taken
  the requests in flight are aborted (keeping their tokens) and the engines sleep; after the update they
  wake with the new weights and the aborted requests continue (partial rollout).
- ``separate_async``: the rollout pool streams groups; a step is ``parameter_sync_step`` mini-batch
  updates, each on ``ppo_mini_batch_size`` groups taken as soon as they are finished, the weights sent
  after the last (trigger = parameter_sync_step); π_old is the cycle's first weights for all of them.

Both sample through ``trainer.v1.sampler`` (``off_policy.py``) and replace every evicted group (stale,
failed, or filtered by dynamic sampling) with one new prompt.

Trinity-RFT's explorer/trainer settings are the same knobs: ``sync_interval`` is
``trigger_parameter_sync_step`` and ``sync_offset`` (how far the explorer runs ahead) is the staleness.

Requests are named by the dataloader batch and row they came from, in every mode, so with
``staleness_threshold=0`` the asynchronous modes sample exactly the synchronous run's tokens.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import numpy as np

from hybridflow.agent_loop.worker import KEEP_FAILED, ROLLOUT_ERROR
from hybridflow.protocol import DataProto
from hybridflow.trainer.ppo.dynamic_sampling import EpochCycler, prompt_batches_for_next_round
from hybridflow.trainer.ppo.metric_utils import flat_metric_values
from hybridflow.trainer.ppo.off_policy import OffPolicySampler, build_sampler, trajectory_version_metrics
from hybridflow.trainer.ppo.rollouter import PromptGroup, Rollouter

MODES = ("sync", "one_step_off", "fully_async")
FAILED_GROUPS = "training/rollout_failure/evicted_samples"  # veRL's name: groups dropped for a failed trajectory


def add_uids(batch: DataProto, gen_index: int, first: int = 0) -> None:
    """Group ids of a dataloader batch: deterministic, so a resumed run names groups as the first did."""
    batch.non_tensor_batch["uid"] = np.array([f"{gen_index}_{first + i}" for i in range(len(batch))], dtype=object)


def staleness_metrics(batch: DataProto, actor_version: int) -> dict[str, float]:
    """Version lag of the step's samples: the actor's updates so far minus the oldest weights a
    sample's tokens came from."""
    versions = batch.non_tensor_batch.get("min_weight_version")
    if versions is None or any(v is None for v in versions):
        return {}
    lag = actor_version - np.asarray(versions, dtype=np.float64)
    return {
        "async/staleness/min": float(lag.min()),
        "async/staleness/mean": float(lag.mean()),
        "async/staleness/max": float(lag.max()),
    }


class SyncRolloutSource:
    """Generate each step's prompts when the step starts, with the newest weights (``push_weights`` None:
    the hybrid engine pushes them itself when the next generation starts)."""

    def __init__(
        self,
        manager,
        prompt_batches: EpochCycler,
        n: int,
        do_sample: bool,
        push_weights: Callable[[int], dict] | None,
        prompts_per_step: int,
        max_inflight_batches: int = 1,
        refill_failed: bool = False,
        batch_size: int | None = None,
    ):
        """``max_inflight_batches``: dynamic sampling's prompt batches per refill (0: dynamic sampling is off, a
        refill draws exactly the missing prompts); ``refill_failed``: a group with a failed trajectory is
        dropped (its prompt never trained) and the step's refill replaces it, else the failure stops the run;
        ``batch_size``: prompts per dataloader batch (``data.gen_batch_size``; None: ``prompts_per_step``)."""
        self.manager, self.prompt_batches, self.dataloader = manager, prompt_batches, prompt_batches.loader
        self.n, self.do_sample, self.push_weights = n, do_sample, push_weights
        self.prompts_per_step = prompts_per_step  # groups a step trains
        self.batch_size = batch_size or prompts_per_step  # prompts a dataloader batch holds
        self.max_inflight_batches = max_inflight_batches
        self.refill_failed = refill_failed
        self.epoch = 0
        self._step_prompts = 0  # prompts of this step generated so far: the next uid's number
        self._step_failed = 0  # groups of this step dropped for a failed trajectory
        self._spare: DataProto | None = None  # rows of a batch drawn for an exact refill, not generated yet

    def inputs(self, step: int, version: int) -> Iterator[DataProto]:
        for batch_dict in self.prompt_batches:  # endless; dynamic sampling draws its refills here too
            self.epoch = self.dataloader.state_dict().get("epoch", 0)
            self._step_prompts = self._step_failed = 0
            yield DataProto.from_single_dict(batch_dict)

    def generate(self, prompts: DataProto, timing: dict, metrics: dict, step: int, version: int) -> DataProto:
        """The prompts' ``n`` trajectories each, through the agent loop. uids and request ids continue
        the step's earlier prompts (dynamic sampling's refills), so they never repeat within a step."""
        count, first_uid, self._step_prompts = len(prompts), self._step_prompts, self._step_prompts + len(prompts)
        add_uids(prompts, step, first_uid)
        prompts = prompts.repeat(repeat_times=self.n, interleave=True)
        start = time.perf_counter()
        meta = {"do_sample": self.do_sample, "global_steps": step, "sample_offset": first_uid * self.n}
        meta.update({KEEP_FAILED: True} if self.refill_failed else {})
        out = self.manager.generate_sequences(rollout_request(prompts, {**meta, "weight_version": version}))
        gen_metrics = out.meta_info.pop("metrics", {})
        batch = self._without_failed_groups(without_prompt_tensors(prompts).union(out), metrics)
        if not len(batch):  # every group failed: as many new prompts at once
            return self.generate(self._next_prompts(count), timing, metrics, step, version)
        timing["gen"] = timing.get("gen", 0.0) + time.perf_counter() - start
        timing["update_weights"] = timing.get("update_weights", 0.0) + float(
            np.max(flat_metric_values(gen_metrics.pop("timing_s/update_weights", [0.0])))
        )
        metrics.update({k: v for k, v in gen_metrics.items() if k.startswith(("agent/", "rollout/"))})
        metrics["training/epoch"] = self.epoch
        metrics.update(staleness_metrics(batch, version))
        metrics.update(trajectory_version_metrics(batch, version))
        return batch  # response_mask is the rollout's (1 = the model's own tokens), never rebuilt here

    def refill(
        self, missing_groups: int, batches_so_far: int, max_batches: int, timing: dict, metrics: dict, step, version
    ) -> tuple[DataProto, int]:
        """Dynamic sampling: the next prompt batches of the stream, generated at once (how many:
        ``prompt_batches_for_next_round``); returns the trajectories and the prompt batches they took."""
        if not self.max_inflight_batches:  # failed groups only: exactly one new prompt each
            return self.generate(self._next_prompts(missing_groups), timing, metrics, step, version), 1
        count = prompt_batches_for_next_round(
            missing_groups, self.batch_size, self.max_inflight_batches, batches_so_far, max_batches
        )
        batches = [DataProto.from_single_dict(next(self.prompt_batches)) for _ in range(count)]
        prompts = DataProto.concat(batches) if count > 1 else batches[0]
        return self.generate(prompts, timing, metrics, step, version), count

    def _next_prompts(self, count: int) -> DataProto:
        """The stream's next ``count`` prompts; the rest of a batch drawn for them waits for the next refill."""
        rows = [self._spare] if self._spare is not None else []
        while sum(map(len, rows)) < count:
            rows.append(DataProto.from_single_dict(next(self.prompt_batches)))
        pool = DataProto.concat(rows) if len(rows) > 1 else rows[0]
        self._spare = pool[count:] if len(pool) > count else None
        return pool[:count]

    def _without_failed_groups(self, batch: DataProto, metrics: dict) -> DataProto:
        """``refill_failed``: the groups of the failed trajectories dropped (the step's refill replaces them). More
        failed groups in a step than it trains or draws in one batch (``data.gen_batch_size``) is a bug, not bad
        luck: the run stops."""
        errors = batch.non_tensor_batch.pop(ROLLOUT_ERROR, None)
        if errors is None:
            return batch
        uids = batch.non_tensor_batch["uid"]
        failed = {u for u, e in zip(uids, errors) if e}
        metrics[FAILED_GROUPS] = metrics.get(FAILED_GROUPS, 0) + len(failed)
        self._step_failed += len(failed)
        bound = max(self.prompts_per_step, self.batch_size)
        if self._step_failed > bound:
            raise RuntimeError(
                f"{self._step_failed} prompt groups failed in a step of {self.prompts_per_step} ({self.batch_size} a "
                f"batch): more than a batch holds is a bug, not bad luck (trainer.v1.sampler."
                f"sync_refill_failed_groups); one error: "
                f"{next(e for e in errors if e)}"
            )
        return batch.select_idxs(np.flatnonzero([u not in failed for u in uids])) if failed else batch

    def after_update(self, version: int, metrics: dict) -> None:
        if self.push_weights is not None:  # the hybrid engine pushes the new weights when the next generation starts
            metrics.update(self.push_weights(version))

    def data_state(self, step: int) -> dict:
        return {"dataloader": self.dataloader.state_dict(), "spare_prompts": self._spare}

    def load_data_state(self, state: dict, step: int) -> None:
        self.dataloader.load_state_dict(state["dataloader"])
        self._spare = state.get("spare_prompts")

    def close(self) -> None:
        pass


def rollout_request(batch: DataProto, meta_info: dict) -> DataProto:
    """What the agent loop manager takes: the prompt tensors and every non-tensor field the agent loops
    may read, with the call's ``meta_info``."""
    request = batch.select(
        batch_keys=["input_ids", "attention_mask", "position_ids"],
        non_tensor_batch_keys=list(batch.non_tensor_batch),
        deepcopy=False,
    )
    request.meta_info = meta_info
    return request


def without_prompt_tensors(batch: DataProto) -> DataProto:
    """The batch's non-tensor fields, to which the rollout's output (prompts included) is joined."""
    return batch.select(batch_keys=[], non_tensor_batch_keys=list(batch.non_tensor_batch))


class PromptStream:
    """The dataloader as a stream of prompt groups; remembers the groups of the current batch not yet given out."""

    def __init__(self, batches: Iterator, dataloader, n: int, first_gen_index: int):
        self.batches, self.dataloader, self.n = batches, dataloader, n  # batches: the trainer's endless stream
        self.gen_index = first_gen_index  # the next dataloader batch's index
        self._buffer: list[PromptGroup] = []

    def __iter__(self):
        return self

    def __next__(self) -> PromptGroup:
        if not self._buffer:
            batch = DataProto.from_single_dict(next(self.batches))
            epoch = self.dataloader.state_dict().get("epoch", 0)
            add_uids(batch, self.gen_index)
            self._buffer = [
                PromptGroup(self.gen_index, i, epoch, batch[i : i + 1].repeat(self.n, interleave=True))
                for i in range(len(batch))
            ]
            self.gen_index += 1
        return self._buffer.pop(0)

    def buffered(self) -> list[PromptGroup]:
        return list(self._buffer)


class AsyncRolloutSource:
    """One-step-off and fully asynchronous training over a ``Rollouter`` (see the module docstring);
    ``group``: the rollout workers (whose watchdog bounds the waits and whose stacks a hang report shows)."""

    def __init__(
        self,
        manager,
        prompt_batches: EpochCycler,
        n: int,
        do_sample: bool,
        push_weights: Callable[[int], dict],
        group,
        prompts_per_step: int,
        staleness: float,
        trigger: int,
        partial: bool,
        sampler: OffPolicySampler | None = None,
        refill_failed: bool = False,
        colocated: bool = False,
    ):
        """``sampler``/``refill_failed``: see ``Rollouter``; ``colocated``: the engines share the trainer's
        processes (V1 colocate_async): they generate only while the trainer waits for its groups."""
        self.sampler, self.refill_failed, self.colocated = sampler, refill_failed, colocated
        self.manager, self.prompt_batches, self.dataloader = manager, prompt_batches, prompt_batches.loader
        self.n, self.do_sample, self.push_weights, self.group = n, do_sample, push_weights, group
        self.prompts_per_step = prompts_per_step
        self.staleness, self.trigger, self.partial = staleness, trigger, partial
        self._pending_restart: list[PromptGroup] = []
        self._finished_restart: list = []  # FinishedGroup
        self.stream: PromptStream | None = None
        self.rollouter: Rollouter | None = None
        self.epoch = 0
        self._gen_offset = 0  # dataloader batches pulled beyond the step count when the run (re)started

    def inputs(self, step: int, version: int) -> Iterator[DataProto]:
        if self.rollouter is None:  # generation starts at the first step's batch (after a resume: the saved one)
            first = step + 1 + self._gen_offset
            self.stream = PromptStream(self.prompt_batches, self.dataloader, self.n, first_gen_index=first)
            self.rollouter = Rollouter(
                self.manager,
                self.stream,
                self.prompts_per_step,
                self.staleness,
                self.trigger,
                self.partial,
                sampling_meta={"do_sample": self.do_sample},
                watchdog=getattr(self.group, "watchdog", None),
                group=self.group,
                sampler=self.sampler,
                refill_failed=self.refill_failed,
            )
            self.rollouter.version = version
            self.rollouter.start(pending=self._pending_restart, finished=self._finished_restart)
        while True:
            yield DataProto(meta_info={"async_rollout": True})

    def generate(
        self, ticket: DataProto | None, timing: dict, metrics: dict, step: int, version: int, count: int | None = None
    ) -> DataProto:
        """The next ``count`` (default: a step's) finished groups, in prompt order; waiting is the
        trainer's idle time, logged as timing_s/gen. The wait has the rollout group's watchdog
        deadline; every finished group is progress."""
        start = time.perf_counter()
        if self.colocated and self.rollouter.held:  # a refill before the update: generate on the same weights
            self.push_weights(version)  # wakes the engines (their weights are current)
            self.rollouter.resume_generation()
        finished, wait_metrics = self.rollouter.take(count or self.prompts_per_step, actor_version=version)
        if self.colocated:  # the trainer's turn: the requests in flight stop, keeping their tokens
            self.rollouter.hold()
            self.group.release_rollout()
        timing["gen"] = timing.get("gen", 0.0) + time.perf_counter() - start
        batch = DataProto.concat([f.output for f in finished])
        metrics.update(wait_metrics)
        metrics.update(staleness_metrics(batch, version))
        metrics.update(trajectory_version_metrics(batch, version, self.rollouter.sampler.versions_per_cycle))
        self.epoch = finished[-1].group.epoch
        metrics["training/epoch"] = self.epoch
        return batch

    def refill(
        self, missing_groups: int, batches_so_far: int, max_batches: int, timing: dict, metrics: dict, step, version
    ) -> tuple[DataProto, int]:
        """Dynamic sampling: the next ``missing_groups`` finished groups (one round counts as one batch); the
        discarded groups' places go to as many new prompts."""
        self.rollouter.replace(missing_groups)
        return self.generate(None, timing, metrics, step, version, count=missing_groups), 1

    def after_update(self, version: int, metrics: dict) -> None:
        if version % self.trigger:
            return
        metrics.update(self.rollouter.sync_weights(lambda: self.push_weights(version), version))

    def data_state(self, step: int) -> dict:
        """The dataloader at the generation frontier plus every group pulled but not trained: a resumed
        run trains the finished ones as they are and generates the others again first, so no group is
        lost or trained twice."""
        if self.rollouter is None:  # saved before generation started (or right after a resume)
            pending, finished = list(self._pending_restart), list(self._finished_restart)
        else:
            pending, finished = self.rollouter.pending() + self.stream.buffered(), self.rollouter.finished()
        return {
            "dataloader": self.dataloader.state_dict(),
            "pending_groups": pending,
            "finished_groups": finished,
            "next_gen_index": self.stream.gen_index if self.stream else step + 1,
        }

    def load_data_state(self, state: dict, step: int) -> None:
        self.dataloader.load_state_dict(state["dataloader"])
        self._pending_restart = list(state.get("pending_groups") or [])
        self._finished_restart = list(state.get("finished_groups") or [])
        next_index = state.get("next_gen_index")
        if next_index is not None:
            self._gen_offset = int(next_index) - (step + 1)

    def close(self) -> None:
        if self.rollouter is not None:
            self.rollouter.stop()


def make_rollout_source(
    config,
    manager,
    prompt_batches: EpochCycler,
    rollout_wg,
    push_weights: Callable[[int], dict] | None,
    max_inflight_batches: int = 1,
):
    """The source ``async_training.mode`` names. ``config``: the ppo_trainer tree (read here only);
    ``push_weights(version)``: the trainer's weights to a separate rollout pool (None: the hybrid engine);
    ``max_inflight_batches``: dynamic sampling's prompt batches per refill (synchronous mode; 0: it is off)."""
    mode = str(config.async_training.mode)
    if mode not in MODES:
        raise ValueError(f"async_training.mode={mode!r} is not one of {', '.join(MODES)}")
    rollout = config.actor_rollout_ref.rollout
    common = (manager, prompt_batches, int(rollout.n), bool(rollout.do_sample))
    a = config.async_training
    prompts_per_step = int(config.data.train_batch_size)
    v1 = config.trainer.v1
    if v1.trainer_mode != "sync":
        steps, staleness, trigger = v1_schedule(config)
        sampler = build_sampler(v1.sampler, trigger)
        colocated = v1.trainer_mode == "colocate_async"
        schedule = (steps, staleness, trigger, True, sampler, True, colocated)
        return AsyncRolloutSource(*common, push_weights, rollout_wg, *schedule)
    refill_failed = bool(v1.sampler.sync_refill_failed_groups)  # V1's sync mode: hybridflow's three schedules
    if mode == "sync":
        batch_size = int(config.data.gen_batch_size or prompts_per_step)  # DAPO's generation batch
        return SyncRolloutSource(
            *common, push_weights, prompts_per_step, max_inflight_batches, refill_failed, batch_size
        )
    if mode == "one_step_off":
        schedule = (1.0, 1, False, None, refill_failed)
        return AsyncRolloutSource(*common, push_weights, rollout_wg, prompts_per_step, *schedule)
    # veRL: a fully asynchronous step takes require_batches mini-batches of prompts
    prompts_per_step = int(a.require_batches) * int(config.actor_rollout_ref.actor.ppo_mini_batch_size)
    schedule = (float(a.staleness_threshold), int(a.trigger_parameter_sync_step), bool(a.partial_rollout))
    return AsyncRolloutSource(*common, push_weights, rollout_wg, prompts_per_step, *schedule, None, refill_failed)


def v1_schedule(config) -> tuple[int, float, int]:
    """A V1 asynchronous mode as the Rollouter's schedule: (groups a training round takes, staleness of
    the start budget, actor updates between weight syncs). See the module docstring."""
    v1 = config.trainer.v1
    if v1.trainer_mode == "colocate_async":
        return int(config.data.train_batch_size), float(v1.colocate_async.num_warmup_batches), 1
    s = v1.separate_async
    mini = int(config.actor_rollout_ref.actor.ppo_mini_batch_size)
    return mini, float(s.num_warmup_batches), int(s.parameter_sync_step)


__all__ = [
    "MODES",
    "AsyncRolloutSource",
    "PromptStream",
    "SyncRolloutSource",
    "add_uids",
    "rollout_request",
    "without_prompt_tensors",
    "make_rollout_source",
    "v1_schedule",
    "staleness_metrics",
]
