"""The ranks of a Ray worker group meet at a store rank 0 bound on a kernel-given port when it started
(published in Ray's key-value store), not at a port picked free beforehand and bound later, which another
process could take in between (CI failed so once, EADDRINUSE)."""

import pytest

ray = pytest.importorskip("ray")

import workers_for_tests as W  # noqa: E402

from hybridflow.single_controller.base import rendezvous  # noqa: E402
from hybridflow.single_controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup  # noqa: E402

ray.cloudpickle.register_pickle_by_value(W)


def test_ranks_meet_at_the_store_rank0_bound_and_the_entry_is_dropped(ray_session):
    from ray.experimental.internal_kv import _internal_kv_get

    seen = []
    for _ in range(2):  # two groups in one session: each its own rendezvous
        pool = RayResourcePool(process_on_nodes=[2], use_gpu=False)
        group = RayWorkerGroup(pool, RayClassWithInitArgs(cls=ray.remote(W.RendezvousWorker)))
        try:
            answers = group.meet()
            assert [a["sum"] for a in answers] == [2.0, 2.0]
            assert answers[0]["port"] == answers[1]["port"]  # rank 1 read the port rank 0 published
            assert answers[0]["listens"] and not answers[1]["listens"]  # rank 0's own process holds it
            key = answers[0]["id"]
            assert key and key == answers[1]["id"]
            assert _internal_kv_get(key.encode(), namespace=rendezvous.NAMESPACE) is None  # dropped once up
            seen.append(key)
        finally:
            group.shutdown()
            pool.release()
    assert seen[0] != seen[1]


def test_a_rank_gives_up_naming_the_group_when_rank0_never_publishes(ray_session, monkeypatch):
    monkeypatch.setenv(rendezvous.ID_ENV, "nobody-publishes-this")
    monkeypatch.setenv("WG_PREFIX", "my_group")
    with pytest.raises(
        TimeoutError, match="rank 0 of worker group my_group did not publish its torch.distributed store"
    ):
        rendezvous.join_store(1, 2, "127.0.0.1", timeout_s=0.3)
