"""`@register` and the dispatch modes.

A dispatch mode is a pair of functions: ``dispatch_fn(worker_group, *args, **kwargs) -> (args, kwargs)``
turns the driver's arguments into one list per argument with one entry per rank, and
``collect_fn(worker_group, outputs) -> result`` turns the ranks' answers into one value. Both are
shared by every backend (Ray, in-process); only execution differs.
"""

from __future__ import annotations

import functools
from enum import Enum
from typing import Any, Callable

from hybridflow.protocol import DataProto, DataProtoFuture

MAGIC_ATTR = "__hybridflow_register__"


class Dispatch(Enum):
    RANK_ZERO = "rank_zero"
    ONE_TO_ALL = "one_to_all"
    ALL_TO_ALL = "all_to_all"
    DP_COMPUTE = "dp_compute"
    DP_COMPUTE_PROTO = "dp_compute_proto"
    DP_COMPUTE_PROTO_WITH_FUNC = "dp_compute_proto_with_func"
    DP_COMPUTE_METRIC = "dp_compute_metric"


class Execute(Enum):
    ALL = "all"
    RANK_ZERO = "rank_zero"


# ---------------------------------------------------------------- dispatch / collect functions


def _broadcast(worker_group, *args, **kwargs):
    n = worker_group.world_size
    return tuple([a] * n for a in args), {k: [v] * n for k, v in kwargs.items()}


def dispatch_one_to_all(worker_group, *args, **kwargs):
    return _broadcast(worker_group, *args, **kwargs)


def dispatch_rank_zero(worker_group, *args, **kwargs):
    return _broadcast(worker_group, *args, **kwargs)


def collect_rank_zero(worker_group, outputs):
    return outputs[0]


def dispatch_all_to_all(worker_group, *args, **kwargs):
    return args, kwargs


def collect_all_to_all(worker_group, outputs):
    return outputs


def dispatch_dp_compute(worker_group, *args, **kwargs):
    """Arguments are already lists with one entry per rank."""
    n = worker_group.world_size
    for name, value in list(enumerate(args)) + list(kwargs.items()):
        if not isinstance(value, (list, tuple)) or len(value) != n:
            raise ValueError(
                f"DP_COMPUTE expects every argument to be a list of length world_size={n}; "
                f"argument {name!r} is {type(value).__name__}"
                + (f" of length {len(value)}" if isinstance(value, (list, tuple)) else "")
            )
    return args, kwargs


def _chunk(value, n: int, name) -> list:
    if isinstance(value, (DataProto, DataProtoFuture)):
        return value.chunk(chunks=n)
    raise TypeError(f"argument {name!r} must be a DataProto or DataProtoFuture to be split across ranks, got {type(value).__name__}")


def dispatch_dp_compute_data_proto(worker_group, *args, **kwargs):
    n = worker_group.world_size
    return (
        tuple(_chunk(a, n, i) for i, a in enumerate(args)),
        {k: _chunk(v, n, k) for k, v in kwargs.items()},
    )


def dispatch_dp_compute_data_proto_with_func(worker_group, func, *args, **kwargs):
    if not callable(func):
        raise TypeError("DP_COMPUTE_PROTO_WITH_FUNC expects a function as the first argument")
    args, kwargs = dispatch_dp_compute_data_proto(worker_group, *args, **kwargs)
    return ([func] * worker_group.world_size, *args), kwargs


def collect_dp_compute_data_proto(worker_group, outputs):
    for rank, out in enumerate(outputs):
        if not isinstance(out, (DataProto, DataProtoFuture)):
            raise TypeError(f"rank {rank} returned {type(out).__name__}; DP_COMPUTE_PROTO methods must return a DataProto")
    return DataProto.concat(list(outputs))


def make_nd_compute_dataproto_dispatch_fn(mesh_name: str) -> dict[str, Callable]:
    """Mesh-aware DataProto dispatch for workers whose ranks form groups (tensor/sequence parallel).

    Each worker declares, via ``Worker._register_dispatch_collect_info(mesh_name, dp_rank, is_collect)``,
    which data-parallel shard it consumes and whether it is the rank of its group whose answer is
    collected. The data is split into dp_size chunks; all ranks of a group receive the same chunk (one
    object, shared) and only the collecting ranks' outputs are concatenated, in dp order.
    """

    def dispatch_fn(worker_group, *args, **kwargs):
        dp_ranks, _ = worker_group._query_dispatch_info(mesh_name)
        dp_size = max(dp_ranks) + 1
        chunked_args = [_chunk(a, dp_size, i) for i, a in enumerate(args)]
        chunked_kwargs = {k: _chunk(v, dp_size, k) for k, v in kwargs.items()}
        per_rank_args = tuple([chunks[r] for r in dp_ranks] for chunks in chunked_args)
        per_rank_kwargs = {k: [chunks[r] for r in dp_ranks] for k, chunks in chunked_kwargs.items()}
        return per_rank_args, per_rank_kwargs

    def collect_fn(worker_group, outputs):
        dp_ranks, is_collect = worker_group._query_dispatch_info(mesh_name)
        picked = sorted((dp, out) for dp, c, out in zip(dp_ranks, is_collect, outputs) if c)
        return DataProto.concat([out for _, out in picked])

    dispatch_fn.hybridflow_dp_size = lambda wg: max(wg._query_dispatch_info(mesh_name)[0]) + 1
    return {"dispatch_fn": dispatch_fn, "collect_fn": collect_fn}


# mode -> (dispatch_fn, collect_fn, splits_data_proto)
_PREDEFINED = {
    Dispatch.RANK_ZERO: (dispatch_rank_zero, collect_rank_zero, False),
    Dispatch.ONE_TO_ALL: (dispatch_one_to_all, collect_all_to_all, False),
    Dispatch.ALL_TO_ALL: (dispatch_all_to_all, collect_all_to_all, False),
    Dispatch.DP_COMPUTE: (dispatch_dp_compute, collect_all_to_all, False),
    Dispatch.DP_COMPUTE_PROTO: (dispatch_dp_compute_data_proto, collect_dp_compute_data_proto, True),
    Dispatch.DP_COMPUTE_PROTO_WITH_FUNC: (dispatch_dp_compute_data_proto_with_func, collect_dp_compute_data_proto, True),
    Dispatch.DP_COMPUTE_METRIC: (dispatch_dp_compute_data_proto, collect_all_to_all, True),
}


def get_dispatch_fns(dispatch_mode) -> tuple[Callable, Callable, bool]:
    """Resolve a Dispatch member or a ``{"dispatch_fn", "collect_fn"}`` dict."""
    if isinstance(dispatch_mode, Dispatch):
        return _PREDEFINED[dispatch_mode]
    if isinstance(dispatch_mode, dict):
        missing = {"dispatch_fn", "collect_fn"} - set(dispatch_mode)
        if missing:
            raise ValueError(f"a custom dispatch mode needs keys dispatch_fn and collect_fn; missing {sorted(missing)}")
        dispatch_fn = dispatch_mode["dispatch_fn"]
        splits = hasattr(dispatch_fn, "hybridflow_dp_size")
        return dispatch_fn, dispatch_mode["collect_fn"], splits
    raise TypeError(f"dispatch_mode must be a Dispatch or a dict with dispatch_fn/collect_fn, got {dispatch_mode!r}")


def _materialize(value):
    return value.get() if isinstance(value, DataProtoFuture) else value


def register(dispatch_mode=Dispatch.ALL_TO_ALL, execute_mode=Execute.ALL, blocking=True, materialize_futures=True):
    """Mark a worker method as callable from the driver through a WorkerGroup."""
    get_dispatch_fns(dispatch_mode)  # fail at class definition, not at the first call
    if not isinstance(execute_mode, Execute):
        raise TypeError(f"execute_mode must be an Execute member, got {execute_mode!r}")

    def decorator(func):
        @functools.wraps(func)
        def inner(*args, **kwargs):
            if materialize_futures:
                args = tuple(_materialize(a) for a in args)
                kwargs = {k: _materialize(v) for k, v in kwargs.items()}
            return func(*args, **kwargs)

        setattr(inner, MAGIC_ATTR, {"dispatch_mode": dispatch_mode, "execute_mode": execute_mode, "blocking": blocking})
        return inner

    return decorator


def registered_methods(cls) -> dict[str, dict[str, Any]]:
    """Name -> register attributes for every @register method of ``cls`` (inherited ones included)."""
    found = {}
    for name in dir(cls):
        if name.startswith("__"):
            continue
        attr = getattr(cls, name, None)
        info = getattr(attr, MAGIC_ATTR, None)
        if callable(attr) and info is not None:
            found[name] = info
    return found
