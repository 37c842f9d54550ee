"""Where a training step's trajectories come from: the three modes of one driver.

``async_training.mode`` picks one source at start-up; the trainer's loop is the same for all:
``for item in source.inputs(): train_step(item)``, whose first phase is ``source.generate(item)`` and
which calls ``source.after_update`` once the actor has trained.

- ``sync`` (default): a step's prompts are generated when the step starts, with the newest weights.
  Colocated, the hybrid engine pushes the weights at the next generation; with a separate rollout
  pool they are sent right after the update.
- ``one_step_off``: the rollout pool generates step k+1 while the trainer trains on step k (a
  ``Rollouter`` with staleness 1, weights sent after every step, no partial rollouts).
- ``fully_async``: the ``Rollouter`` streams groups within veRL's staleness budget, weights sent every
  ``trigger_parameter_sync_step`` steps, partial rollouts as configured.

Trinity-RFT's explorer/trainer settings are the same knobs: ``sync_interval`` is
``trigger_parameter_sync_step`` and ``sync_offset`` (how far the explorer runs ahead) is the staleness.

Requests are named by the dataloader batch and row they came from, in every mode, so with
``staleness_threshold=0`` the asynchronous modes sample exactly the synchronous run's tokens.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import numpy as np

from hybridflow.protocol import DataProto
from hybridflow.trainer.ppo.dynamic_sampling import GroupAccumulator
from hybridflow.trainer.ppo.metric_utils import flat_metric_values, timer
from hybridflow.trainer.ppo.rollouter import PromptGroup, Rollouter
from hybridflow.workers.rollout.weight_transfer import WEIGHT_RECEIVER, WeightTarget

MODES = ("sync", "one_step_off", "fully_async")


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


def weight_targets(rollout_wg, role: str | None) -> list[WeightTarget]:
    """The rollout workers as receivers of the trainer's weights (the group builds them for its backend)."""
    return rollout_wg.handles(WEIGHT_RECEIVER, role)


class SyncRolloutSource:
    """Generate each step's prompts when the step starts."""

    def __init__(self, trainer):
        self.trainer = trainer
        self.epoch = 0

    def inputs(self) -> Iterator[DataProto]:
        t = self.trainer
        for batch_dict in t.prompt_batches:  # endless; dynamic sampling draws its refills here too
            self.epoch = t.train_dataloader.state_dict().get("epoch", 0)
            yield DataProto.from_single_dict(batch_dict)

    def generate(self, batch: DataProto, timing: dict, metrics: dict, first_uid: int = 0) -> DataProto:
        """``first_uid``: prompts of this step generated before (dynamic sampling's refills), so that
        uids and request ids of a refill never repeat the step's earlier ones."""
        t = self.trainer
        n = int(t.config.actor_rollout_ref.rollout.n)
        add_uids(batch, t.global_steps, first_uid)
        batch = batch.repeat(repeat_times=n, interleave=True)
        start = time.perf_counter()
        batch, gen_metrics = t.rollout(
            batch,
            {
                "do_sample": bool(t.config.actor_rollout_ref.rollout.do_sample),
                "global_steps": t.global_steps,
                "sample_offset": first_uid * n,
                "weight_version": t.actor_version,
            },
        )
        timing["gen"] = timing.get("gen", 0.0) + time.perf_counter() - start
        timing["update_weights"] = timing.get("update_weights", 0.0) + float(
            np.max(flat_metric_values(gen_metrics.pop("timing_s/update_weights", [0.0])))
        )
        metrics.update({k: v for k, v in gen_metrics.items() if k.startswith(("agent/", "rollout/"))})
        metrics["training/epoch"] = self.epoch
        metrics.update(staleness_metrics(batch, t.actor_version))
        return batch  # response_mask is the rollout's (1 = the model's own tokens), never rebuilt here

    def after_update(self, actor_version: int, metrics: dict) -> None:
        t = self.trainer
        if t.hybrid_engine:
            return  # the hybrid engine pushes the new weights when the next generation starts
        metrics.update(t.push_weights_to_rollout(actor_version))

    def data_state(self) -> dict:
        return {"dataloader": self.trainer.train_dataloader.state_dict()}

    def load_data_state(self, state: dict) -> None:
        self.trainer.train_dataloader.load_state_dict(state["dataloader"])

    def close(self) -> None:
        pass


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
    """One-step-off and fully asynchronous training over a ``Rollouter`` (see the module docstring)."""

    def __init__(self, trainer, mode: str):
        self.trainer = trainer
        cfg = trainer.config
        a = cfg.async_training
        self.mode = mode
        self.prompts_per_step = int(cfg.data.train_batch_size)
        if mode == "fully_async":  # veRL: a step takes require_batches mini-batches of prompts
            self.prompts_per_step = int(a.require_batches) * int(cfg.actor_rollout_ref.actor.ppo_mini_batch_size)
        if mode == "one_step_off":
            staleness, trigger, partial = 1.0, 1, False
        else:
            staleness, trigger, partial = (
                float(a.staleness_threshold),
                int(a.trigger_parameter_sync_step),
                bool(a.partial_rollout),
            )
        self.trigger = trigger
        self.partial = partial
        self.staleness = staleness
        self._pending_restart: list[PromptGroup] = []
        self.stream: PromptStream | None = None
        self.rollouter: Rollouter | None = None
        self.epoch = 0

    def _start(self) -> None:
        t = self.trainer
        rollout = t.config.actor_rollout_ref.rollout
        self.stream = PromptStream(
            t.prompt_batches, t.train_dataloader, int(rollout.n), first_gen_index=t.global_steps + 1 + self._gen_offset
        )
        self.rollouter = Rollouter(
            t.async_rollout_manager,
            self.stream,
            self.prompts_per_step,
            self.staleness,
            self.trigger,
            self.partial,
            sampling_meta={"do_sample": bool(rollout.do_sample)},
            watchdog=getattr(t.rollout_wg, "watchdog", None),
            group=t.rollout_wg,
        )
        self.rollouter.version = t.actor_version
        self.rollouter.start(pending=self._pending_restart)

    _gen_offset = 0  # dataloader batches pulled beyond global_steps when the run (re)started

    def inputs(self) -> Iterator[DataProto]:
        if self.rollouter is None:
            self._start()
        while True:
            yield DataProto(meta_info={"async_rollout": True})

    def generate(
        self, ticket: DataProto, timing: dict, metrics: dict, first_uid: int = 0, count: int | None = None
    ) -> DataProto:
        """The next ``count`` (default: a step's) finished groups, in prompt order; waiting is the
        trainer's idle time, logged as timing_s/gen."""
        start = time.perf_counter()
        count = count or self.prompts_per_step
        # the wait has the rollout group's watchdog deadline; every finished group is progress
        t = self.trainer
        finished, wait_metrics = self.rollouter.take(count, actor_version=t.actor_version)
        timing["gen"] = timing.get("gen", 0.0) + time.perf_counter() - start
        batch = DataProto.concat([f.output for f in finished])
        metrics.update(wait_metrics)
        metrics.update(staleness_metrics(batch, self.trainer.actor_version))
        self.epoch = finished[-1].group.epoch
        metrics["training/epoch"] = self.epoch
        return batch

    def sample(self, ticket: DataProto, timing: dict, metrics: dict) -> DataProto:
        """The step's scored batch: groups taken from the rollouter and scored; with
        algorithm.filter_groups, groups whose metric is uniform are dropped and more are taken until
        the step is full (at most max_num_gen_batches steps' worth)."""
        t = self.trainer
        settings = t.filter_groups
        if not settings.enable:
            return t.generate_and_score(ticket, timing, metrics)
        acc = GroupAccumulator(self.prompts_per_step, settings.metric)
        rounds = 0
        while not acc.full:
            if 0 < settings.max_num_gen_batches <= rounds:
                raise RuntimeError(
                    f"dynamic sampling: {rounds} rounds of groups taken (algorithm.filter_groups.max_num_gen_batches="
                    f"{settings.max_num_gen_batches}) but only {acc.groups_kept} of {self.prompts_per_step} groups "
                    "have "
                    f"differing '{settings.metric}' values; raise max_num_gen_batches, or set it to 0 for no limit"
                )
            batch = self.generate(ticket, timing, metrics, count=acc.missing if rounds else self.prompts_per_step)
            with timer("reward", timing):
                t.compute_reward(batch, metrics)
            acc.add(batch, prompt_batches=1)
            rounds += 1
        metrics.update(acc.metrics())
        return acc.take()

    def after_update(self, actor_version: int, metrics: dict) -> None:
        if actor_version % self.trigger:
            return
        t = self.trainer
        metrics.update(self.rollouter.sync_weights(lambda: t.push_weights_to_rollout(actor_version), actor_version))

    def data_state(self) -> dict:
        """The dataloader at the generation frontier plus every group pulled but not trained: a resumed
        run generates those again first, so no group is lost or trained twice."""
        if self.rollouter is None:  # saved before generation started (or right after a resume)
            pending = list(self._pending_restart)
        else:
            pending = self.rollouter.pending() + self.stream.buffered()
        gen_index = self.stream.gen_index if self.stream else self.trainer.global_steps + 1
        return {
            "dataloader": self.trainer.train_dataloader.state_dict(),
            "pending_groups": pending,
            "next_gen_index": gen_index,
        }

    def load_data_state(self, state: dict) -> None:
        self.trainer.train_dataloader.load_state_dict(state["dataloader"])
        self._pending_restart = list(state.get("pending_groups") or [])
        next_index = state.get("next_gen_index")
        if next_index is not None:
            self._gen_offset = int(next_index) - (self.trainer.global_steps + 1)

    def close(self) -> None:
        if self.rollouter is not None:
            self.rollouter.stop()


def make_rollout_source(trainer):
    mode = str(trainer.config.async_training.mode)
    if mode not in MODES:
        raise ValueError(f"async_training.mode={mode!r} is not one of {', '.join(MODES)}")
    return SyncRolloutSource(trainer) if mode == "sync" else AsyncRolloutSource(trainer, mode)


__all__ = [
    "MODES",
    "AsyncRolloutSource",
    "PromptStream",
    "SyncRolloutSource",
    "add_uids",
    "make_rollout_source",
    "staleness_metrics",
    "weight_targets",
]
