"""Ray backend: colocated roles, named actors, capacity errors (each test owns its resource pool)."""

import numpy as np
import pytest
import torch

ray = pytest.importorskip("ray")

import workers_for_tests as W  # noqa: E402

from hybridflow.protocol import DataProto  # noqa: E402
from hybridflow.single_controller.ray import (  # noqa: E402
    RayClassWithInitArgs,
    RayResourcePool,
    RayWorkerGroup,
    create_colocated_worker_cls,
)

ray.cloudpickle.register_pickle_by_value(W)  # test workers travel by value: no install needed


def make_batch(n):
    return DataProto.from_dict(
        tensors={"x": torch.arange(n, dtype=torch.float32)},
        non_tensors={"tag": np.array([f"s{i}" for i in range(n)], dtype=object)},
    )


def test_colocated_roles_share_a_process(ray_session):
    pool = RayResourcePool(process_on_nodes=[2], use_gpu=False)
    cls = create_colocated_worker_cls(
        {
            "actor_rollout": RayClassWithInitArgs(cls=ray.remote(W.EchoWorker), scale=3.0),
            "critic": RayClassWithInitArgs(cls=ray.remote(W.CriticLikeWorker)),
        }
    )
    fused = RayWorkerGroup(pool, cls)
    groups = fused.spawn(prefix_set={"actor_rollout", "critic"})
    try:
        actor, critic = groups["actor_rollout"], groups["critic"]
        assert actor.pid() == critic.pid()  # same PID per rank: one process hosts both roles
        assert len(set(actor.pid())) == 2
        out = actor.double(make_batch(4))
        assert torch.equal(out.batch["y"], torch.arange(4, dtype=torch.float32) * 6)  # scale=3 reached the role
        vals = critic.values(make_batch(4))
        assert torch.equal(vals.batch["v"], torch.arange(4, dtype=torch.float32) + 100)
        assert not hasattr(critic, "double")  # each view only has its role's methods
    finally:
        fused.shutdown()
        pool.release()


def test_named_actors_and_attach(ray_session):
    pool = RayResourcePool(process_on_nodes=[2], use_gpu=False)
    wg = RayWorkerGroup(pool, RayClassWithInitArgs(cls=ray.remote(W.EchoWorker)), name_prefix="named_test")
    try:
        assert wg.worker_names == ["named_test_0", "named_test_1"]
        again = RayWorkerGroup.from_detached(
            "named_test", wg.worker_names, RayClassWithInitArgs(cls=ray.remote(W.EchoWorker))
        )
        assert again.pid() == wg.pid()
    finally:
        wg.shutdown()
        pool.release()


def test_too_many_workers_fails_fast_with_a_clear_message(ray_session):
    total = int(ray.cluster_resources()["CPU"])
    pool = RayResourcePool(process_on_nodes=[total + 1], use_gpu=False)
    with pytest.raises(RuntimeError, match=rf"asks for {total + 1} worker\(s\).*cluster is too small"):
        RayWorkerGroup(pool, RayClassWithInitArgs(cls=ray.remote(W.EchoWorker)))
