"""veRL 0.9.1 single-controller API on the in-process backend (issue 14): the open dispatch-mode
registry, async methods, unsplit rank-zero arguments and dispatch/collect info. Groups
come from the ``inprocess_group`` fixture (tests/single_controller/conftest.py), which shuts them down."""

import asyncio
import inspect

import parity_workers as P
import pytest
import torch
from tensordict import NonTensorData, NonTensorStack, TensorDict

from hybridflow.protocol import DataProto
from hybridflow.single_controller.base import ClassWithInitArgs, Dispatch, Worker, register
from hybridflow.single_controller.base.decorator import (
    DISPATCH_MODE_FN_REGISTRY,
    get_predefined_dispatch_fn,
    register_dispatch_mode,
    update_dispatch_mode,
)

# ----------------------------------------------------------------------------- dispatch registry


def _times_ten(worker_group, x):
    return ([x * 10] * worker_group.world_size,), {}


def _plus_one(worker_group, outputs):
    return [o + 1 for o in outputs]


def _minus(worker_group, x):
    return ([-x] * worker_group.world_size,), {}


@pytest.fixture
def times_ten_mode():
    mode = register_dispatch_mode("test_times_ten", _times_ten, _plus_one)
    yield mode
    DISPATCH_MODE_FN_REGISTRY.pop(mode, None)
    Dispatch.remove("TEST_TIMES_TEN")


def test_register_and_update_a_dispatch_mode(times_ten_mode, inprocess_group):
    assert times_ten_mode is Dispatch.TEST_TIMES_TEN and "TEST_TIMES_TEN" in Dispatch
    assert get_predefined_dispatch_fn(Dispatch.TEST_TIMES_TEN) == {"dispatch_fn": _times_ten, "collect_fn": _plus_one}
    assert DISPATCH_MODE_FN_REGISTRY[Dispatch.DP_COMPUTE_PROTO]["dispatch_fn"] is not None

    class W(Worker):
        @register(dispatch_mode=Dispatch.TEST_TIMES_TEN)
        def echo(self, x):
            return x

    # dispatch: 3 -> 30 on the rank; collect: +1 -> [31]
    assert inprocess_group(ClassWithInitArgs(W)).echo(3) == [31]
    # a taken name is refused (veRL asserts; ours is also a ValueError)
    with pytest.raises(AssertionError, match="TEST_TIMES_TEN"):
        register_dispatch_mode("test_times_ten", _times_ten, _plus_one)
    # update: groups built afterwards use the new functions: 3 -> -3, +1 -> [-2]
    update_dispatch_mode(Dispatch.TEST_TIMES_TEN, _minus, _plus_one)
    assert inprocess_group(ClassWithInitArgs(W)).echo(3) == [-2]
    with pytest.raises(AssertionError, match="not registered"):
        update_dispatch_mode(Dispatch.TEST_TIMES_TEN.__class__("NOT_A_MODE", 999), _minus, _plus_one)


def test_custom_dispatch_dict_still_works(inprocess_group):
    class W(Worker):
        @register(dispatch_mode={"dispatch_fn": _times_ten, "collect_fn": _plus_one})
        def echo(self, x):
            return x

    assert inprocess_group(ClassWithInitArgs(W)).echo(2) == [21]
    with pytest.raises(ValueError, match="collect_fn"):
        register(dispatch_mode={"dispatch_fn": _times_ten})


# ----------------------------------------------------------------------------- async methods


def test_async_methods_stay_coroutines_and_return_values(inprocess_group):
    assert inspect.iscoroutinefunction(P.AsyncWorker.bump)  # Ray sees an async actor; worker code may await it
    wg = inprocess_group(ClassWithInitArgs(P.AsyncWorker))
    assert wg.bump(2) == [2] and wg.bump(3) == [5]  # values, not coroutines; state kept between calls
    assert wg.loop_is_running() == [True]
    assert wg.plain() == ["sync"]
    out = wg.double(DataProto.from_dict(tensors={"x": torch.arange(3.0)}))
    assert out.batch["y"].tolist() == [0.0, 2.0, 4.0]


def test_async_methods_callable_from_inside_a_running_event_loop(inprocess_group):
    wg = inprocess_group(ClassWithInitArgs(P.AsyncWorker))

    async def driver():
        return wg.bump(7)

    assert asyncio.run(driver()) == [7]


def test_async_failure_names_the_method(inprocess_group):
    class Bad(Worker):
        @register(dispatch_mode=Dispatch.ONE_TO_ALL)
        async def fail(self):
            raise RuntimeError("async boom")

    with pytest.raises(Exception, match="fail.*async boom|async boom") as err:
        inprocess_group(ClassWithInitArgs(Bad)).fail()
    assert "'fail'" in str(err.value)


# ----------------------------------------------------------------------------- arguments


def test_rank_zero_with_all_to_all_passes_arguments_unsplit(inprocess_group):
    wg = inprocess_group(ClassWithInitArgs(P.ParityWorker))
    assert wg.on_rank_zero(5, {"k": [1, 2]}) == (0, 5, {"k": [1, 2]})
    # veRL's execute_func_rank_zero: ALL_TO_ALL + RANK_ZERO, func(*args)
    assert wg.execute_func_rank_zero(lambda a, b: a * b, 6, 7) == 42
    assert wg.add(2, 3) == [5]  # ALL_TO_ALL with scalars on every rank


def test_dp_compute_proto_takes_a_tensordict(inprocess_group):
    wg = inprocess_group(ClassWithInitArgs(P.ParityWorker))
    td = TensorDict({"x": torch.arange(3.0)}, batch_size=[3])
    td["name"] = NonTensorStack.from_list([NonTensorData(n) for n in ("a", "b", "c")])
    out = wg.td_double(td)
    assert isinstance(out, TensorDict) and out["y"].tolist() == [0.0, 2.0, 4.0]
    assert [x.data for x in out.get("name")] == ["A", "B", "C"]


def test_non_blocking_one_to_all_returns_the_handles(inprocess_group):
    class W(Worker):
        @register(dispatch_mode=Dispatch.ONE_TO_ALL, blocking=False)
        def later(self, x):
            return x + 1

    handles = inprocess_group(ClassWithInitArgs(W)).later(1)
    assert isinstance(handles, list) and [h.result() for h in handles] == [2]


# ----------------------------------------------------------------------------- dispatch / collect info


def test_get_and_set_dispatch_collect(monkeypatch):
    # a rank-0 Worker built outside any group writes MASTER_ADDR/MASTER_PORT into os.environ unless they are set
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "29500")
    inner = Worker()
    inner._register_dispatch_collect_info("train", dp_rank=3, is_collect=False)
    assert inner.get_dispatch_collect() == {"dispatch_dp_rank": {"train": 3}, "collect_dp_rank": {"train": False}}
    outer = Worker()
    outer.set_dispatch_collect(mesh_name="ref", **inner.get_dispatch_collect())  # veRL's engine workers do this
    assert outer._query_dispatch_info("ref") == 3 and outer.query_collect_info("ref") is False
    with pytest.raises(ValueError, match="already registered"):
        outer.set_dispatch_collect("ref", {"x": 0}, {"x": True})
    with pytest.raises(ValueError, match="already registered"):
        inner._register_dispatch_collect_info("train", 0, True)
    outer.set_dispatch_collect("both", {"a": 1, "b": 2}, {"a": True, "b": False})  # veRL: the last mesh's values
    assert outer._query_dispatch_info("both") == 2 and outer.query_collect_info("both") is False
    assert outer.get_dispatch_collect()["dispatch_dp_rank"] == {"ref": 3, "both": 2}
