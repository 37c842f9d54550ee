"""The Ray backend: every dispatch mode with 2 and 4 workers, padding, futures, colocation, gloo."""

import numpy as np
import pytest
import torch

ray = pytest.importorskip("ray")

import workers_for_tests as W  # noqa: E402

from hybridflow.protocol import DataProto, DataProtoFuture  # noqa: E402
from hybridflow.single_controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup  # noqa: E402

ray.cloudpickle.register_pickle_by_value(W)  # test workers travel by value: no install needed


def make_batch(n):
    return DataProto.from_dict(
        tensors={"x": torch.arange(n, dtype=torch.float32)},
        non_tensors={"tag": np.array([f"s{i}" for i in range(n)], dtype=object)},
    )


@pytest.fixture(scope="module", params=[2, 4])
def group(request, ray_session):
    pool = RayResourcePool(process_on_nodes=[request.param], use_gpu=False)
    wg = RayWorkerGroup(pool, RayClassWithInitArgs(cls=ray.remote(W.EchoWorker), scale=1.0))
    yield wg
    wg.shutdown()
    pool.release()


def test_methods_bound_by_name(group):
    for name in ("set_value", "add", "whoami", "double", "noop", "apply", "count", "custom", "mesh_double"):
        assert callable(getattr(group, name))
    assert group.world_size in (2, 4)


def test_one_to_all_and_all_to_all(group):
    n = group.world_size
    assert group.set_value(7) == list(range(n))
    # ALL_TO_ALL: each rank gets its own element
    assert group.add(list(range(n)), [10] * n) == [r + 10 + r for r in range(n)]


def test_rank_zero_dispatch_and_execute(group):
    assert group.whoami() == (0, group.world_size)
    assert group.only_rank_zero() == "ran on 0"
    assert group.execute_rank_zero_sync("whoami") == (0, group.world_size)


def test_dp_compute(group):
    n = group.world_size
    assert group.dp_compute(list(range(n))) == [r * 10 + r for r in range(n)]
    with pytest.raises(ValueError, match="world_size"):
        group.dp_compute([1])


@pytest.mark.parametrize("size", [8, 7, 5, 1])
def test_dp_compute_proto_even_and_uneven(group, size):
    out = group.double(make_batch(size))
    assert len(out) == size  # padded for dispatch, unpadded after collect
    assert torch.equal(out.batch["y"], torch.arange(size, dtype=torch.float32) * 2)
    assert list(out.non_tensor_batch["tag"]) == [f"s{i}" for i in range(size)]
    # every rank took a contiguous share when the batch divides
    if size % group.world_size == 0:
        per = size // group.world_size
        assert out.batch["rank"].tolist() == [i // per for i in range(size)]


def test_dp_compute_proto_with_func(group):
    out = group.apply(lambda x: x + 1, make_batch(8))
    assert torch.equal(out.batch["x"], torch.arange(8, dtype=torch.float32) + 1)


def test_dp_compute_metric(group):
    metrics = group.count(make_batch(8))
    assert [m["rank"] for m in metrics] == list(range(group.world_size))
    assert sum(m["n"] for m in metrics) == 8


def test_custom_dispatch(group):
    # rank r receives 3*(r+1), the collect sums
    assert group.custom(3) == sum(3 * (r + 1) for r in range(group.world_size))


def test_non_blocking_chains_into_next_call(group):
    fut = group.double_async(make_batch(8))
    assert isinstance(fut, DataProtoFuture)
    fut2 = group.double_async(fut)  # the future is the next call's input, no driver round trip
    out = group.apply(lambda x: x * 2, fut2)  # a blocking call takes the future too
    assert torch.equal(out.batch["x"], torch.arange(8, dtype=torch.float32) * 8)
    assert torch.equal(fut.get().batch["x"], torch.arange(8, dtype=torch.float32) * 2)


def test_execute_all_sync_and_async(group):
    n = group.world_size
    assert group.execute_all_sync("whoami") == [(r, n) for r in range(n)]
    refs = group.execute_all_async("add", list(range(n)), list(range(n)))
    assert ray.get(refs) == [3 * r for r in range(n)]


def test_mesh_dispatch_one_collecting_rank_per_group(group):
    tp = 2
    group.setup_mesh(tp)
    dp = group.world_size // tp
    out = group.mesh_double(make_batch(4 * dp))
    assert torch.equal(out.batch["x"], torch.arange(4 * dp, dtype=torch.float32) * 2)
    # answers come only from the collecting ranks (even ranks), in dp order
    assert sorted(set(out.batch["rank"].tolist())) == [r for r in range(group.world_size) if r % tp == 0]
    # uneven: padded to the dp size, not the world size
    out = group.mesh_double(make_batch(3))
    assert len(out) == 3


def test_gloo_all_reduce_through_registered_method(group):
    n = group.world_size
    # rank r contributes 2*(r+1); all ranks see the sum
    expected = float(sum(2 * (r + 1) for r in range(n)))
    assert group.all_reduce(2) == [expected] * n
