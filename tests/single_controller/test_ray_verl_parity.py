"""veRL 0.9.1 single-controller API on the Ray backend (issue 14): async actors, TensorDict batches,
non-blocking handles, resource-pool sharing (max_colocate_count), and worker_env."""

import time

import pytest
import torch

ray = pytest.importorskip("ray")

import parity_workers as P  # noqa: E402
from tensordict import NonTensorData, NonTensorStack, TensorDict  # noqa: E402

from hybridflow.protocol import DataProto  # noqa: E402
from hybridflow.single_controller.base import Dispatch  # noqa: E402
from hybridflow.single_controller.base.decorator import DISPATCH_MODE_FN_REGISTRY  # noqa: E402
from hybridflow.single_controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup  # noqa: E402

ray.cloudpickle.register_pickle_by_value(P)


@pytest.fixture(scope="module")
def pool(ray_session):
    pool = RayResourcePool(process_on_nodes=[2], use_gpu=False)
    yield pool
    pool.release()


@pytest.fixture(scope="module")
def parity_group(pool):
    wg = RayWorkerGroup(pool, RayClassWithInitArgs(cls=ray.remote(P.ParityWorker)), worker_env={"HF_TEST_VAR": "on"})
    yield wg
    wg.shutdown()


def test_default_max_colocate_count_is_verls():
    assert RayResourcePool(process_on_nodes=[1], use_gpu=False).max_colocate_count == 10


def test_worker_env_reaches_the_workers(parity_group):
    assert parity_group.env("HF_TEST_VAR") == ["on", "on"]
    assert parity_group.env("RANK") == ["0", "1"]  # the group's own variables are still there


def test_worker_env_cannot_override_rank_or_rendezvous(pool):
    for key in ("RANK", "WORLD_SIZE", "MASTER_ADDR"):
        with pytest.raises(ValueError, match=key):
            RayWorkerGroup(pool, RayClassWithInitArgs(cls=ray.remote(P.ParityWorker)), worker_env={key: "7"})


def test_non_blocking_one_to_all_and_all_to_all_return_object_refs(parity_group):
    one = parity_group.rank_and_later(9)
    assert isinstance(one, list) and all(isinstance(r, ray.ObjectRef) for r in one)
    assert ray.get(one) == [(0, 9), (1, 9)]
    both = parity_group.add_later([1, 2], [10, 20])  # lists of world_size entries are scattered
    assert isinstance(both, list) and all(isinstance(r, ray.ObjectRef) for r in both) and ray.get(both) == [11, 22]
    zero = parity_group.on_rank_zero_later(4)  # rank zero only: the one ObjectRef
    assert isinstance(zero, ray.ObjectRef) and ray.get(zero) == (0, 4)


def test_rank_zero_all_to_all_gets_scalars_unsplit(parity_group):
    assert parity_group.on_rank_zero(5, {"k": 1}) == (0, 5, {"k": 1})
    assert parity_group.execute_func_rank_zero(lambda a, b: a - b, 10, 3) == 7


@pytest.mark.parametrize("n", [4, 5])
def test_dp_compute_proto_with_tensordict(parity_group, n):
    # 5 rows on 2 ranks: padded to 6 for dispatch, 5 come back, in order
    td = TensorDict({"x": torch.arange(float(n))}, batch_size=[n])
    td["name"] = NonTensorStack.from_list([NonTensorData(f"r{i}") for i in range(n)])
    out = parity_group.td_double(td)
    assert isinstance(out, TensorDict) and len(out) == n
    assert out["y"].tolist() == [2.0 * i for i in range(n)]
    assert [x.data for x in out.get("name")] == [f"R{i}" for i in range(n)]
    assert out["rank"].tolist() == [0] * ((n + 1) // 2) + [1] * (n // 2)


def test_async_methods_on_ray_actors(parity_group):
    wg = parity_group
    before = wg.bump(0)
    assert wg.bump(2) == [b + 2 for b in before]  # state kept between calls
    assert wg.loop_is_running() == [True, True]
    assert wg.plain() == ["sync", "sync"]  # sync methods of an async actor still work
    out = wg.double(DataProto.from_dict(tensors={"x": torch.arange(5.0)}))
    assert out.batch["y"].tolist() == [0.0, 2.0, 4.0, 6.0, 8.0]


def test_a_mode_registered_on_the_driver_reaches_the_workers(parity_group):
    # Dispatch.PARITY_TWICE exists only on the driver (parity_workers registers it); it travels by
    # name and the worker processes get it on unpickling. 3 -> 6 on each of 2 ranks, summed.
    assert "PARITY_TWICE" in Dispatch and Dispatch.PARITY_TWICE in DISPATCH_MODE_FN_REGISTRY
    assert parity_group.twice(3) == 12


def test_a_full_pool_fails_at_once_saying_so(ray_session):
    small = RayResourcePool(process_on_nodes=[1], use_gpu=False, max_colocate_count=1)
    first = RayWorkerGroup(small, RayClassWithInitArgs(cls=ray.remote(P.ParityWorker)))
    try:
        start = time.monotonic()
        with pytest.raises(RuntimeError, match="no room.*max_colocate_count=1"):
            RayWorkerGroup(small, RayClassWithInitArgs(cls=ray.remote(P.ParityWorker)))
        assert time.monotonic() - start < 5.0
    finally:
        first.shutdown()
    # the share is back once the first group is gone
    again = RayWorkerGroup(small, RayClassWithInitArgs(cls=ray.remote(P.ParityWorker)))
    assert again.rank_and(1) == [(0, 1)]
    again.shutdown()
    small.release()
