"""Weights from the trainer's group to rollout engines in other processes (separate resource pools).

Every trainer rank walks its full parameters in the same order (gathering a sharded one is a
collective); rank 0 groups them into buckets and sends each bucket to every rollout worker. A bucket
goes into Ray's object store once (``ray.put``) and all receivers read it from there; at most two
buckets are in flight, so the trainer gathers the next bucket while the engines load the previous one
and no process ever holds more than two buckets beyond its own weights. The update ends with
``finish(version)``: the engines drop their prefix caches and stamp ``version`` on everything they
generate from then on.

Every wait has a deadline; a receiver that does not answer in time is named (its rank and what it was
asked), instead of the run hanging in silence.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Iterable
from concurrent.futures import Future

import torch

from hybridflow.single_controller.base.direct import HandleKind
from hybridflow.single_controller.base.errors import WorkerError
from hybridflow.workers.rollout.weights import buckets

# methods the rollout worker exposes to receive weights (called directly, not through a WorkerGroup)
RECEIVE_METHOD, FINISH_METHOD = "receive_weights", "finish_weight_sync"


class WeightSyncTimeout(TimeoutError):
    pass


class WeightTarget(ABC):
    """One rollout worker that receives weights. ``send`` returns a handle that ``wait`` resolves; a
    receiver that failed is named by a ``WorkerError`` with its ``group`` (the caller sets it) and rank."""

    group = "rollout"

    def __init__(self, rank: int):
        self.rank = rank

    def failed(self, what: str, error: BaseException, cause: BaseException) -> WorkerError:
        return WorkerError(self.group, f"receive {what}", self.rank, f"{type(error).__name__}: {error}", cause=cause)

    @abstractmethod
    def send(self, method: str, payload) -> object: ...

    @staticmethod
    @abstractmethod
    def wait(targets: list[WeightTarget], handles: list, timeout_s: float, what: str) -> list: ...

    def prepare(self, bucket: list[tuple[str, torch.Tensor]]):
        """What crosses to the receivers for one bucket (Ray: one object-store copy for all)."""
        return bucket


class LocalWeightTarget(WeightTarget):
    """A rollout worker object in this process (in-process backend)."""

    def __init__(self, host, rank: int = 0):
        super().__init__(rank)
        self.host = host

    def send(self, method, payload):
        fut: Future = Future()
        try:
            fut.set_result(getattr(self.host, method)(payload))
        except Exception as e:
            fut.set_exception(e)
        return fut

    @staticmethod
    def wait(targets, handles, timeout_s, what):
        values = []
        for target, handle in zip(targets, handles):
            try:
                values.append(handle.result(timeout=timeout_s))
            except TimeoutError:
                raise
            except Exception as e:
                raise target.failed(what, e, e) from e
        return values


class RayWeightTarget(WeightTarget):
    """A rollout worker in a Ray actor; ``role`` names it inside a fused (colocated) worker class."""

    def __init__(self, actor, role: str | None, rank: int):
        super().__init__(rank)
        self.actor, self.role = actor, role

    def prepare(self, bucket):
        import ray

        return ray.put(bucket)

    def send(self, method, payload):
        if self.role is None:
            return getattr(self.actor, method).remote(payload)
        return self.actor.call_role.remote(self.role, method, payload)

    @staticmethod
    def wait(targets, handles, timeout_s, what):
        import ray

        ready, pending = ray.wait(list(handles), num_returns=len(handles), timeout=timeout_s)
        if pending:
            late = [t.rank for t, h in zip(targets, handles) if h in pending]
            raise WeightSyncTimeout(
                f"weight sync: rollout rank(s) {late} did not acknowledge {what} within "
                f"{timeout_s:.0f} s (the trainer side is done with it); see their logs"
            )
        values = []
        for target, handle in zip(targets, handles):  # all are ready
            try:
                values.append(ray.get(handle))
            except ray.exceptions.RayTaskError as e:
                raise target.failed(what, e, e.cause) from None
        return values


# how a rollout worker group hands out its weight receivers: ``rollout_wg.handles(WEIGHT_RECEIVER, role)``
WEIGHT_RECEIVER = HandleKind(
    in_process=lambda host, rank: LocalWeightTarget(host, rank=rank),
    remote=lambda actor, role, rank: RayWeightTarget(actor, role, rank=rank),
)


def push_weights(
    named_tensors: Iterable[tuple[str, torch.Tensor]],
    targets: list[WeightTarget],
    version: int,
    bucket_bytes: int,
    timeout_s: float = 600.0,
    send: bool = True,
) -> dict[str, float]:
    """Stream ``named_tensors`` to ``targets`` in buckets, then finish with ``version``.

    ``send=False`` (trainer ranks other than 0) only walks the stream, taking part in the gathers.
    Returns timing and size metrics.
    """
    start = time.perf_counter()
    n_bytes = n_buckets = 0
    in_flight: list = []
    if not targets:
        send = False
    for index, bucket in enumerate(buckets(named_tensors, bucket_bytes)):
        if not send:
            continue
        payload = targets[0].prepare(bucket)
        handles = [t.send(RECEIVE_METHOD, payload) for t in targets]
        n_bytes += sum(t.numel() * t.element_size() for _, t in bucket)
        n_buckets += 1
        in_flight.append((index, handles))
        if len(in_flight) == 2:  # wait for bucket i-1 while bucket i travels
            done_index, done = in_flight.pop(0)
            type(targets[0]).wait(targets, done, timeout_s, f"weight bucket {done_index} (version {version})")
    if send:
        for done_index, done in in_flight:
            type(targets[0]).wait(targets, done, timeout_s, f"weight bucket {done_index} (version {version})")
        finish = [t.send(FINISH_METHOD, version) for t in targets]
        type(targets[0]).wait(targets, finish, timeout_s, f"the end of weight update {version}")
    return {
        "timing_s/update_weights": time.perf_counter() - start,
        "rollout/weight_sync_mb": n_bytes / (1 << 20),
        "rollout/weight_sync_buckets": float(n_buckets),
    }
