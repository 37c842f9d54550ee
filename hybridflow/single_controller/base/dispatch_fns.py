"""The built-in dispatch and collect functions.

``dispatch_fn(worker_group, *args, **kwargs) -> (args, kwargs)`` turns the driver's arguments into
what the ranks receive (for most modes one list per argument with one entry per rank);
``collect_fn(worker_group, outputs) -> result`` turns the ranks' answers into one value. Shared by
every backend; ``decorator.DISPATCH_MODE_FN_REGISTRY`` maps the ``Dispatch`` modes to them.

A dispatch function that splits batches across data-parallel ranks carries
``hybridflow_dp_size(worker_group) -> int``: the WorkerGroup pads batch arguments (DataProto or
TensorDict) to a multiple of it before dispatch and unpads the collected answer.
"""

from __future__ import annotations

from collections.abc import Callable

from tensordict import TensorDict

from hybridflow.protocol import DataProto, DataProtoFuture
from hybridflow.utils.tensordicts import chunk_tensordict, concat_tensordict


class DispatchError(ValueError, AssertionError):
    """Arguments a dispatch mode cannot split (veRL asserts here; both handlers catch this)."""


def dispatch_one_to_all(worker_group, *args, **kwargs):
    n = worker_group.world_size
    return tuple([a] * n for a in args), {k: [v] * n for k, v in kwargs.items()}


dispatch_rank_zero = dispatch_one_to_all


def collect_rank_zero(worker_group, outputs):
    return outputs[0]


def dispatch_all_to_all(worker_group, *args, **kwargs):
    """Arguments go as they are: lists of world_size entries are scattered, anything else is
    broadcast (veRL's execute_all); with Execute.RANK_ZERO, rank zero gets them unsplit."""
    return args, kwargs


def collect_all_to_all(worker_group, outputs):
    return outputs


def dispatch_dp_compute(worker_group, *args, **kwargs):
    """Arguments are already lists with one entry per rank."""
    n = worker_group.world_size
    for name, value in list(enumerate(args)) + list(kwargs.items()):
        if not isinstance(value, (list, tuple)) or len(value) != n:
            raise DispatchError(
                f"DP_COMPUTE expects every argument to be a list of length world_size={n}; "
                f"argument {name!r} is {type(value).__name__}"
                + (f" of length {len(value)}" if isinstance(value, (list, tuple)) else "")
            )
    return args, kwargs


def collect_dp_compute(worker_group, outputs):
    return outputs


def chunk_batch(value, n: int, name) -> list:
    """Split a DataProto, DataProtoFuture or TensorDict into ``n`` consecutive chunks."""
    if isinstance(value, (DataProto, DataProtoFuture)):
        return value.chunk(chunks=n)
    if isinstance(value, TensorDict):
        if len(value) % n:
            raise DispatchError(
                f"argument {name!r}: a TensorDict of length {len(value)} does not split into {n} chunks"
            )
        return chunk_tensordict(value, n)  # jagged nested tensors split row by row
    raise DispatchError(
        f"argument {name!r} must be a DataProto, DataProtoFuture or TensorDict to be split across ranks, "
        f"got {type(value).__name__}"
    )


def dispatch_dp_compute_data_proto(worker_group, *args, **kwargs):
    n = worker_group.world_size
    return (
        tuple(chunk_batch(a, n, i) for i, a in enumerate(args)),
        {k: chunk_batch(v, n, k) for k, v in kwargs.items()},
    )


def dispatch_dp_compute_data_proto_with_func(worker_group, func, *args, **kwargs):
    if not callable(func):
        raise DispatchError("DP_COMPUTE_PROTO_WITH_FUNC expects a function as the first argument")
    args, kwargs = dispatch_dp_compute_data_proto(worker_group, *args, **kwargs)
    return ([func] * worker_group.world_size, *args), kwargs


def concat_batches(outputs: list):
    """Join the ranks' answers: DataProtos (or futures of them) with DataProto.concat, TensorDicts
    row by row (jagged nested tensors too); anything else is an error naming the rank."""
    if outputs and all(isinstance(o, TensorDict) for o in outputs):
        return concat_tensordict(list(outputs))
    for rank, out in enumerate(outputs):
        if not isinstance(out, (DataProto, DataProtoFuture)):
            raise TypeError(
                f"rank {rank} returned {type(out).__name__}; DP_COMPUTE_PROTO methods must return a DataProto "
                "(or every rank a TensorDict)"
            )
    return DataProto.concat(list(outputs))


def collect_dp_compute_data_proto(worker_group, outputs):
    return concat_batches(outputs)


def dummy_direct_rollout_call(worker_group, *args, **kwargs):
    raise NotImplementedError("Direct rollout call is forbidden.")


def _world_size(worker_group) -> int:
    return worker_group.world_size


dispatch_dp_compute_data_proto.hybridflow_dp_size = _world_size
dispatch_dp_compute_data_proto_with_func.hybridflow_dp_size = _world_size


def make_nd_compute_dataproto_dispatch_fn(mesh_name: str) -> dict[str, Callable]:
    """Mesh-aware batch dispatch for workers whose ranks form groups (tensor/sequence parallel).

    Each worker declares, via ``Worker._register_dispatch_collect_info(mesh_name, dp_rank, is_collect)``,
    which data-parallel shard it consumes and whether it is the rank of its group whose answer is
    collected. The data is split into dp_size chunks; all ranks of a group receive the same chunk (one
    object, shared) and only the collecting ranks' outputs are concatenated, in dp order.
    """

    def dispatch_fn(worker_group, *args, **kwargs):
        dp_ranks, _ = worker_group._mesh_info(mesh_name)
        dp_size = max(dp_ranks) + 1
        chunked_args = [chunk_batch(a, dp_size, i) for i, a in enumerate(args)]
        chunked_kwargs = {k: chunk_batch(v, dp_size, k) for k, v in kwargs.items()}
        per_rank_args = tuple([chunks[r] for r in dp_ranks] for chunks in chunked_args)
        per_rank_kwargs = {k: [chunks[r] for r in dp_ranks] for k, chunks in chunked_kwargs.items()}
        return per_rank_args, per_rank_kwargs

    def collect_fn(worker_group, outputs):
        dp_ranks, is_collect = worker_group._mesh_info(mesh_name)
        picked = sorted(((dp, i) for i, (dp, c) in enumerate(zip(dp_ranks, is_collect)) if c))
        return concat_batches([outputs[i] for _, i in picked])

    dispatch_fn.hybridflow_dp_size = lambda wg: max(wg._mesh_info(mesh_name)[0]) + 1
    collect_fn.hybridflow_joins_batches = True
    return {"dispatch_fn": dispatch_fn, "collect_fn": collect_fn}


collect_dp_compute_data_proto.hybridflow_joins_batches = True


def joins_batches(collect_fn) -> bool:
    """True when ``collect_fn`` joins batches (its non-blocking result is a DataProtoFuture)."""
    return bool(getattr(collect_fn, "hybridflow_joins_batches", False))
