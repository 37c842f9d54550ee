"""Dynamic sampling (DAPO's ``algorithm.filter_groups``): train only on groups that carry a signal.

A group is the responses sampled for one prompt (same ``uid``). When every response of a group gets
the same metric value (all right, all wrong), its group-relative advantages are zero and it only
dilutes the batch. After the rewards, such groups are dropped and new prompt batches are generated
until ``data.train_batch_size`` groups are collected; the surplus of the last batch is trimmed.

One loop serves every rollout source (``fill_with_informative_groups``); its parts:
``informative_rows`` (pure filter), ``GroupAccumulator`` (takes scored groups, says when a batch is
full) and ``prompt_batches_for_next_round`` (how much the synchronous source generates next).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator

import numpy as np

from hybridflow.config.algorithm import FilterGroupsConfig
from hybridflow.protocol import DataProto

__all__ = [
    "REWARD_METRIC",
    "group_metric_values",
    "informative_rows",
    "GroupAccumulator",
    "prompt_batches_for_next_round",
    "fill_with_informative_groups",
    "EpochCycler",
]

# "reward": the sequence's total score before any KL penalty; any other name: a field of the reward
# function's extra info (e.g. "acc" when compute_score returns {"score": ..., "acc": ...})
REWARD_METRIC = "reward"


def group_metric_values(batch: DataProto, metric: str) -> np.ndarray:
    """One float per row: ``reward`` = the row's summed token-level scores, otherwise the reward
    function's extra-info field ``metric`` (kept in ``non_tensor_batch`` by the trainer)."""
    if metric == REWARD_METRIC:
        return batch.batch["token_level_scores"].sum(-1).double().numpy()
    if metric not in batch.non_tensor_batch:
        known = sorted(k for k in batch.non_tensor_batch if k not in ("uid",))
        raise KeyError(
            f"algorithm.filter_groups.metric={metric!r}: the scored batch has no such field; use "
            f"'{REWARD_METRIC}' or a key of the reward function's extra info (non-tensor fields "
            f"present: {known})"
        )
    try:
        return np.asarray(batch.non_tensor_batch[metric], dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError(
            f"algorithm.filter_groups.metric={metric!r}: values are not numbers: "
            f"{list(batch.non_tensor_batch[metric][:4])}"
        ) from None


def informative_rows(uids, values) -> np.ndarray:
    """Boolean mask of the rows whose group (same uid) does NOT have one value for all its members.

    A group of one response is kept (nothing to compare it with), as in DAPO. Values are compared
    exactly (max == min), not by a float std.
    """
    uids = np.asarray(uids, dtype=object)
    values = np.asarray(values, dtype=np.float64)
    if uids.shape != values.shape:
        raise ValueError(f"informative_rows: {uids.shape[0]} uids for {values.shape[0]} values")
    keep = np.ones(len(uids), dtype=bool)
    order = {}
    for i, uid in enumerate(uids):
        order.setdefault(uid, []).append(i)
    for rows in order.values():
        group = values[rows]
        if len(rows) > 1 and group.max() == group.min():
            keep[rows] = False
    return keep


class GroupAccumulator:
    """Collects scored groups until ``target_groups`` informative ones are held.

    ``add`` takes a scored batch (any number of whole groups), drops the uniform groups and keeps
    the rest in arrival order; ``full`` says when enough are held; ``take`` returns exactly
    ``target_groups`` groups (the first to arrive) and counts the trimmed surplus. Usable from a
    synchronous loop or from an asynchronous consumer of finished groups.
    """

    def __init__(self, target_groups: int, metric: str = REWARD_METRIC, filter_uniform: bool = True):
        if target_groups < 1:
            raise ValueError(f"target_groups must be >= 1, got {target_groups}")
        self.target_groups = target_groups
        self.metric, self.filter_uniform = metric, filter_uniform  # False: keep every group (failed-group refills)
        self._parts: list[DataProto] = []
        self._uids: list = []  # kept groups, in arrival order
        self.batches_added = 0
        self.groups_seen = 0
        self.groups_dropped = 0
        self.groups_trimmed = 0

    @property
    def groups_kept(self) -> int:
        return len(self._uids)

    @property
    def missing(self) -> int:
        return max(self.target_groups - len(self._uids), 0)

    @property
    def full(self) -> bool:
        return self.missing == 0

    def add(self, batch: DataProto, prompt_batches: int = 1) -> None:
        """``batch``: scored whole groups, generated from ``prompt_batches`` prompt batches."""
        uids = batch.non_tensor_batch["uid"]
        already = set(self._uids).intersection(uids)
        if already:
            raise ValueError(
                f"GroupAccumulator.add: groups {sorted(already)[:3]} were added before; every "
                "generated batch needs its own uids"
            )
        keep = (
            informative_rows(uids, group_metric_values(batch, self.metric))
            if self.filter_uniform
            else np.ones(len(uids), bool)
        )
        seen = list(dict.fromkeys(uids))
        kept = list(dict.fromkeys(uids[keep]))
        self.batches_added += prompt_batches
        self.groups_seen += len(seen)
        self.groups_dropped += len(seen) - len(kept)
        if kept:
            self._parts.append(batch if keep.all() else batch.select_idxs(np.flatnonzero(keep)))
            self._uids.extend(kept)

    def take(self) -> DataProto:
        """The first ``target_groups`` kept groups as one batch (rows in arrival order); the held
        groups are released. Raises if not ``full``."""
        if not self.full:
            raise RuntimeError(f"GroupAccumulator.take: {self.groups_kept} of {self.target_groups} groups held")
        batch = DataProto.concat(self._parts) if len(self._parts) > 1 else self._parts[0]
        chosen = set(self._uids[: self.target_groups])
        self.groups_trimmed += len(self._uids) - self.target_groups
        if len(chosen) < len(self._uids):
            rows = np.flatnonzero([uid in chosen for uid in batch.non_tensor_batch["uid"]])
            batch = batch.select_idxs(rows)
        self._parts, self._uids = [], []
        return batch

    def metrics(self) -> dict[str, float]:
        return {
            "training/filter_groups/num_gen_batches": float(self.batches_added),
            "training/filter_groups/groups_seen": float(self.groups_seen),
            "training/filter_groups/evicted_samples": float(self.groups_dropped),  # veRL's name: groups dropped
            "training/filter_groups/discarded_surplus_samples": float(self.groups_trimmed),
            "training/filter_groups/kept_groups": float(self.groups_seen - self.groups_dropped),
        }


def prompt_batches_for_next_round(
    missing_groups: int, batch_size: int, max_inflight: int, generated: int, max_num_gen_batches: int
) -> int:
    """How many prompt batches (of ``batch_size`` prompts) the next refill generates at once.

    Like veRL's synchronous DAPO: ask for twice the missing groups (about half of the groups of a
    refill may be dropped again), in whole batches, at most ``max_inflight`` and never past the
    ``max_num_gen_batches`` budget (<= 0: no budget). 0 means the budget is spent.
    """
    wanted = max(1, math.ceil(2 * missing_groups / batch_size))
    count = min(wanted, max_inflight)
    if max_num_gen_batches > 0:
        count = min(count, max_num_gen_batches - generated)
    return max(count, 0)


class EpochCycler:
    """An endless stream of the loader's batches, epoch after epoch: the training loop and dynamic
    sampling's refills draw from the same stream, so the loader's state counts every batch used."""

    def __init__(self, loader):
        self.loader = loader
        self._epoch: Iterator | None = None

    def __iter__(self) -> EpochCycler:
        return self

    def __next__(self):
        for _ in range(2):  # the current epoch, else a fresh one
            if self._epoch is None:
                self._epoch = iter(self.loader)
            try:
                return next(self._epoch)
            except StopIteration:
                self._epoch = None
        raise RuntimeError("the training dataloader yields no batch")


Refill = Callable[[int, int], tuple[DataProto, int]]


def fill_with_informative_groups(
    scored: DataProto, target_groups: int, settings: FilterGroupsConfig, refill: Refill
) -> tuple[DataProto, dict[str, float]]:
    """Dynamic sampling's one loop, for every rollout source: keep ``scored``'s informative groups and
    call ``refill(missing_groups, prompt_batches_so_far) -> (scored groups, prompt batches they took)``
    until ``target_groups`` are held (at most ``max_num_gen_batches`` prompt batches; <= 0: no limit).
    Returns exactly ``target_groups`` groups and the step's filter metrics. With ``settings.enable`` off
    it only refills the groups ``scored`` lacks (a rollout source drops the failed ones) and keeps all."""
    acc = GroupAccumulator(target_groups, settings.metric, filter_uniform=settings.enable)
    acc.add(scored)
    while not acc.full:
        if 0 < settings.max_num_gen_batches <= acc.batches_added:
            raise RuntimeError(
                f"dynamic sampling: {acc.batches_added} prompt batches generated (algorithm.filter_groups."
                f"max_num_gen_batches={settings.max_num_gen_batches}) but only {acc.groups_kept} of "
                f"{target_groups} groups have differing '{settings.metric}' values; {acc.groups_dropped} of "
                f"{acc.groups_seen} groups were uniform. The data may be too easy or too hard for the "
                "model; raise max_num_gen_batches, or set it to 0 for no limit"
            )
        batch, prompt_batches = refill(acc.missing, acc.batches_added)
        acc.add(batch, prompt_batches=prompt_batches)
    return acc.take(), acc.metrics() if settings.enable else {}


def merge_round_metrics(rounds: list[dict]) -> dict:
    """One step's metrics from several generation rounds: times (``timing_s/``) and sizes (``_mb``)
    add up; everything else is joined into one list (the logged value is its mean)."""
    merged: dict = {}
    for key in dict.fromkeys(k for r in rounds for k in r):
        values = [v if isinstance(v, (list, tuple)) else [v] for v in (r[key] for r in rounds if key in r)]
        if key.startswith("timing_s/") or key.endswith("_mb"):
            merged[key] = float(sum(float(x) for v in values for x in v))
        else:
            merged[key] = [x for v in values for x in v]
    return merged
