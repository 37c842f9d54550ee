"""The in-process backend runs the same registered methods through the same dispatch/collect code, and
its shutdown gives back what the group set in the process."""

import os
import pickle

import numpy as np
import pytest
import torch
import workers_for_tests as W

from hybridflow.protocol import DataProto, DataProtoFuture
from hybridflow.single_controller.base import ClassWithInitArgs, WorkerError
from hybridflow.single_controller.base.errors import WorkerDiedError, WorkerGroupShutDownError, WorkerHangError
from hybridflow.single_controller.inprocess import InProcessWorkerGroup, create_colocated_worker_cls


def make_batch(n):
    return DataProto.from_dict(
        tensors={"x": torch.arange(n, dtype=torch.float32)},
        non_tensors={"tag": np.array([f"s{i}" for i in range(n)], dtype=object)},
    )


DIST_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


@pytest.fixture
def group(inprocess_group):  # tests/single_controller/conftest.py: shut down after the test
    return inprocess_group(ClassWithInitArgs(W.EchoWorker, scale=2.0))


def test_same_methods_same_results(group):
    assert group.world_size == 1
    assert group.set_value(3) == [0]
    assert group.whoami() == (0, 1)
    assert group.only_rank_zero() == "ran on 0"
    out = group.double(make_batch(5))
    assert torch.equal(out.batch["y"], torch.arange(5, dtype=torch.float32) * 4)
    assert group.custom(3) == 3
    assert group.count(make_batch(4)) == [{"rank": 0, "n": 4}]


def test_worker_lives_in_the_driver_process(group):
    assert group.pid() == [os.getpid()]
    group.set_value(41)
    assert group.workers[0].value == 41  # the worker object is right here to inspect (and to breakpoint in)


def test_futures_chain(group):
    fut = group.double_async(make_batch(4))
    assert isinstance(fut, DataProtoFuture)
    out = group.double_async(fut).get()
    assert torch.equal(out.batch["x"], torch.arange(4, dtype=torch.float32) * 4)


def test_gloo_all_reduce_world_one_and_shutdown_gives_everything_back(monkeypatch):
    import torch.distributed as dist

    for key in DIST_ENV:
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.2")  # one of them set before: it comes back as it was
    assert not dist.is_initialized()
    group = InProcessWorkerGroup(ClassWithInitArgs(W.EchoWorker))
    try:
        assert group.all_reduce(5) == [5.0]  # the worker opened the default gloo group
        assert dist.is_initialized() and dist.get_world_size() == 1
        assert os.environ["RANK"] == "0" and os.environ["WORLD_SIZE"] == "1"
    finally:
        group.shutdown()
    assert not dist.is_initialized()
    assert {key: os.environ.get(key) for key in DIST_ENV} == dict.fromkeys(DIST_ENV) | {"MASTER_ADDR": "127.0.0.2"}


def test_a_world_of_one_opens_its_group_even_when_its_port_is_taken(monkeypatch):
    """CI failed once with EADDRINUSE: another process took the picked MASTER_PORT before the worker bound it."""
    import socket

    import torch.distributed as dist

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        for key in DIST_ENV:
            monkeypatch.delenv(key, raising=False)
        monkeypatch.setenv("MASTER_PORT", str(taken.getsockname()[1]))
        group = InProcessWorkerGroup(ClassWithInitArgs(W.EchoWorker))
        try:
            assert group.all_reduce(7) == [7.0]
            assert dist.get_world_size() == 1
        finally:
            group.shutdown()
    assert not dist.is_initialized()


@pytest.mark.skipif(not os.path.exists("/proc/sys/net/ipv4/ip_local_port_range"), reason="Linux's ephemeral range")
def test_rendezvous_ports_are_picked_where_outgoing_connections_do_not_land():
    """A port in the kernel's ephemeral range can become some outgoing connection's source port before
    the store binds it (a world > 1 still rendezvouses over TCP)."""
    import socket

    from hybridflow.single_controller.base.worker import find_free_port

    with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
        low, high = (int(v) for v in f.read().split())
    ports = [find_free_port() for _ in range(20)]
    assert all(not low <= port <= high and port >= 20000 for port in ports), ports
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", ports[0]))  # and it is free


def test_error_names_method_and_rank(group):
    with pytest.raises(WorkerError, match=r"'fail_on', rank 0") as info:
        group.fail_on(0)
    assert isinstance(info.value.__cause__, ValueError) and info.value.cause is info.value.__cause__


@pytest.mark.parametrize(
    "error",
    [
        WorkerError("g", "m", 1, "trace", cause=ValueError("boom")),
        WorkerDiedError("g", "m", 1, "gone"),
        WorkerHangError("g", "m", 1, "stuck", stuck_ranks=[1], report_path="/tmp/r"),
        WorkerGroupShutDownError("g", "m", "a test"),
    ],
    ids=lambda e: type(e).__name__,
)
def test_worker_errors_pickle_with_their_fields_and_cause(error):
    """They cross processes (an agent loop worker, a trainer rank pushing weights, reraise a group's error)."""
    error.add_note("a note")
    back = pickle.loads(pickle.dumps(error))
    assert type(back) is type(error) and str(back) == str(error) and back.__notes__ == ["a note"]
    assert (back.group, back.method, back.rank) == (error.group, error.method, error.rank)
    assert repr(back.cause) == repr(error.cause) and vars(back).keys() == vars(error).keys()


def test_colocated_in_process(inprocess_group):
    fused = inprocess_group(
        create_colocated_worker_cls({"actor": ClassWithInitArgs(W.EchoWorker), "critic": W.CriticLikeWorker})
    )
    views = fused.spawn(prefix_set=["actor", "critic"])
    assert views["actor"].pid() == views["critic"].pid()
    out = views["critic"].values(make_batch(3))
    assert torch.equal(out.batch["v"], torch.arange(3, dtype=torch.float32) + 100)


class EngineOwner(W.EchoWorker):
    """Counts the calls of release_engines (a rollout worker stops its engine there)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.released = 0

    def release_engines(self):
        self.released += 1


def test_shutdown_releases_the_workers_engines_once(inprocess_group):
    group = inprocess_group(ClassWithInitArgs(EngineOwner))
    worker = group.workers[0]
    group.shutdown()
    group.shutdown()
    assert worker.released == 1


def test_shutdown_of_a_colocated_group_releases_every_roles_engines(inprocess_group):
    fused = inprocess_group(
        create_colocated_worker_cls({"actor": ClassWithInitArgs(EngineOwner), "critic": ClassWithInitArgs(EngineOwner)})
    )
    views = fused.spawn(prefix_set=["actor", "critic"])
    roles = fused.workers[0]._roles
    views["critic"].shutdown()
    fused.shutdown()
    assert [roles["actor"].released, roles["critic"].released] == [1, 1]


def test_shutdown_of_a_stuck_group_returns_at_once_and_releases_nothing(inprocess_group):
    import threading
    import time

    group = inprocess_group(ClassWithInitArgs(EngineOwner))
    worker = group.workers[0]
    started, go_on = threading.Event(), threading.Event()
    group._host.thread.submit(lambda: (started.set(), go_on.wait(30)))  # a call stuck in the group's thread
    assert started.wait(10)
    begin = time.monotonic()
    group.shutdown()
    took = time.monotonic() - begin
    go_on.set()
    assert took < 5 and worker.released == 0
