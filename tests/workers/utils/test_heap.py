"""The worker hands malloc's freed heap back to the OS after each update and generation (the soak's RSS
warm-up, issue 31 point 5)."""

import sys
from types import SimpleNamespace

import pytest
import torch

from hybridflow.config.profiler import ProfilerConfig
from hybridflow.protocol import DataProto
from hybridflow.workers import actor_rollout_ref_worker as worker_module
from hybridflow.workers.actor_rollout_ref_worker import ActorRolloutRefWorker
from hybridflow.workers.profiler import WorkerProfiler
from hybridflow.workers.utils import heap


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="malloc_trim is glibc's")
def test_trim_heap_releases_freed_small_blocks():
    blocks = [bytearray(1000) for _ in range(50_000)]  # 50 MB below the mmap threshold: on the heap
    pin = bytearray(1000)  # above them: the freed run is not the heap's top, which free() may trim itself
    del blocks
    assert heap.trim_heap() is True  # glibc returns 1 only when it gave memory back
    del pin


def test_trim_heap_is_a_no_op_without_glibc(monkeypatch):
    monkeypatch.setattr(heap, "_libc", lambda: None)
    assert heap.trim_heap() is False


def test_worker_trims_after_update_and_after_generation(monkeypatch):
    calls = []
    monkeypatch.setattr(worker_module, "trim_heap", lambda: calls.append(1))
    scheduler = SimpleNamespace(get_last_lr=lambda: [0.1], step=lambda: None)
    worker = SimpleNamespace(
        _require=lambda *a: None,
        config=SimpleNamespace(rollout=SimpleNamespace(temperature=1.0)),
        actor=SimpleNamespace(update_policy=lambda data: {}),
        actor_engine=SimpleNamespace(lr_scheduler=scheduler),
        device="cpu",
        rollout_host=None,
        profiler=WorkerProfiler(ProfilerConfig(), rank=0, role="actor"),  # records nothing
    )
    ActorRolloutRefWorker.update_actor(worker, DataProto.from_dict(tensors={"x": torch.zeros(2)}))
    assert calls == [1]
    ActorRolloutRefWorker.release_rollout(worker)
    assert calls == [1, 1]
