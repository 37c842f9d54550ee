"""WorkerGroup: the driver-side handle of a set of workers.

At construction it scans the worker class for ``@register`` methods and binds a method of the same
name that dispatches the arguments, executes on all ranks (or rank zero) and collects the answers.
Backends (Ray, in-process) implement ``_execute`` and ``_resolve``, and answer the questions callers
above the single controller would otherwise ask by backend: ``handles`` (reach one rank directly),
``spawn_helpers`` (driver-side helper objects) and ``shutdown``.

A group that was shut down (``shutdown(reason)``, or by the watchdog after a hang) says so:
``is_shut_down`` is True for it and every role view sharing its workers, and a call on it raises
``WorkerGroupShutDownError`` naming the group, the reason and the method.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from tensordict import TensorDict

from hybridflow.protocol import DataProto, DataProtoFuture, pad_dataproto_to_divisor, unpad_dataproto
from hybridflow.single_controller.base.decorator import Execute, get_dispatch_fns, registered_methods
from hybridflow.single_controller.base.dispatch_fns import joins_batches
from hybridflow.single_controller.base.errors import WorkerGroupShutDownError
from hybridflow.single_controller.base.heartbeat import read_progress
from hybridflow.single_controller.base.watchdog import Deadline, Watchdog, default_watchdog


class ClassWithInitArgs:
    """A worker class and the arguments to build it with, instantiated later in the worker process."""

    def __init__(self, cls, *args, **kwargs):
        self.cls = cls
        self.args = args
        self.kwargs = kwargs

    @property
    def user_cls(self):
        """The plain Python class (unwrapping ``ray.remote``)."""
        return getattr(self.cls, "__ray_actor_class__", self.cls)

    def __call__(self):
        return self.user_cls(*self.args, **self.kwargs)


class ResourcePool:
    """Processes per node; the backend decides how they are placed."""

    def __init__(self, process_on_nodes=None, max_colocate_count: int = 10, n_gpus_per_node: int = 8):
        self._store = list(process_on_nodes or [])
        if int(max_colocate_count) < 1:
            raise ValueError(f"max_colocate_count must be >= 1, got {max_colocate_count}")
        self.max_colocate_count = int(max_colocate_count)  # worker groups that may share each device (veRL: 10)
        self.n_gpus_per_node = n_gpus_per_node

    def add_node(self, process_count: int) -> None:
        self._store.append(process_count)

    def __call__(self) -> list[int]:
        return self._store

    @property
    def world_size(self) -> int:
        return sum(self._store)

    @property
    def store(self) -> list[int]:
        return list(self._store)

    def local_world_size_list(self) -> list[int]:
        return [n for n in self._store for _ in range(n)]

    def local_rank_list(self) -> list[int]:
        return [i for n in self._store for i in range(n)]


def _batch_len(v):
    return len(v) if isinstance(v, (DataProto, TensorDict)) else None


def _pad_proto_args(args, kwargs, divisor: int):
    """Pad every DataProto / TensorDict argument to a multiple of ``divisor`` (rows repeated from the
    start); return the pad size (the same for all)."""
    lengths = {_batch_len(v) for v in list(args) + list(kwargs.values())} - {None}
    if len(lengths) > 1:
        raise ValueError(
            f"all batch arguments must have the same length to be split across ranks, got {sorted(lengths)}"
        )
    if not lengths or next(iter(lengths)) % divisor == 0 or next(iter(lengths)) == 0:
        return args, kwargs, 0
    n = next(iter(lengths))
    pad = -n % divisor

    def pad_one(v):
        if isinstance(v, DataProto):
            return pad_dataproto_to_divisor(v, divisor)[0]
        if isinstance(v, TensorDict):
            return _with_rows(v, np.arange(pad) % n)
        return v

    return tuple(pad_one(a) for a in args), {k: pad_one(v) for k, v in kwargs.items()}, pad


def _with_rows(td: TensorDict, extra_rows) -> TensorDict:
    import torch

    return torch.cat([td, td[torch.as_tensor(extra_rows, dtype=torch.long)]], dim=0)


class WatchedFuture(DataProtoFuture):
    """The answer of a ``blocking=False`` call: ``get()`` on the driver waits through the group's
    ``_resolve`` (watchdog deadline, errors naming the rank). Sent to a worker, or chunked for one,
    it is a plain DataProtoFuture again."""

    _wait: Callable | None = None

    def _resolve(self) -> list:
        if self._wait is not None:
            self.futures, self._wait = self._wait(), None
        return super()._resolve()

    def __getstate__(self):
        return {k: v for k, v in self.__dict__.items() if k != "_wait"}


class PendingResults(list):
    """The answer of a non-blocking ONE_TO_ALL / ALL_TO_ALL call: the per-rank handles (Ray ObjectRefs),
    as veRL returns them, and ``get()``, which waits for them under the group's watchdog."""

    def __init__(self, handles, wait: Callable):
        super().__init__(handles)
        self._wait = wait

    def get(self):
        return self._wait()


def rows_per_rank(per_rank_args, per_rank_kwargs) -> int:
    """The most DataProto rows any rank was given (scales the call's deadline)."""
    rows = 0
    for args, kwargs in zip(per_rank_args, per_rank_kwargs):
        for v in (*args, *kwargs.values()):
            if isinstance(v, DataProto):
                rows = max(rows, len(v))
    return rows


def _unpad(result, pad: int):
    if pad and isinstance(result, DataProto) and len(result) > 0:
        return unpad_dataproto(result, pad_size=pad)
    if pad and isinstance(result, TensorDict) and len(result) > 0:
        return result[: len(result) - pad]
    return result


class _Lifecycle:
    """Whether the workers behind a group were shut down, and why: one object shared by the group and
    its role views (``_view`` copies the reference), so a view the watchdog shut down downs them all."""

    __slots__ = ("reason",)

    def __init__(self):
        self.reason: str | None = None


class WorkerGroup:
    """Backend-independent part: method binding, dispatch, collect, padding."""

    def __init__(self, name: str, world_size: int):
        self.name = name
        self._world_size = world_size
        self._dispatch_info: dict[str, list[int]] = {}  # mesh -> dp rank of every rank (veRL's names)
        self._collect_info: dict[str, list[bool]] = {}  # mesh -> whether each rank's output is collected
        self._bound_names: list[str] = []
        self._user_cls = None
        self._watchdog: Watchdog | None = None
        self._progress_key = name  # the workers' WG_PREFIX: views of a fused group keep the fused name
        self._lifecycle = _Lifecycle()

    @property
    def world_size(self) -> int:
        return self._world_size

    # --- watchdog (see single_controller/watchdog.py) -----------------------------------------------
    @property
    def watchdog(self) -> Watchdog:
        """This group's deadlines; the process default unless ``set_watchdog`` gave one."""
        return self._watchdog or default_watchdog()

    def set_watchdog(self, watchdog: Watchdog | None) -> None:
        self._watchdog = watchdog

    def _deadline(self, rows_per_rank: int = 0) -> Deadline | None:
        return self.watchdog.deadline(rows_per_rank, progress=self._progress_reading)

    def _progress_reading(self):
        """Changes whenever a worker called ``report_progress()``."""
        return read_progress(self._progress_key, self.world_size, use_ray=False)

    def _collect_stacks(self, ranks: list[int]) -> dict[int, dict]:
        """rank -> {"pid", "state", "tool", "text", "location"}: the backend takes them from outside."""
        raise NotImplementedError

    # --- backend interface -----------------------------------------------------------------------
    def _execute(self, method: str, ranks: list[int], per_rank_args: list[tuple], per_rank_kwargs: list[dict]) -> list:
        """Start ``method`` on ``ranks``; return one handle per rank (a future or a value)."""
        raise NotImplementedError

    def _resolve(self, method: str, ranks: list[int], handles: list) -> list:
        """Wait for the handles; raise WorkerError/WorkerDiedError naming the failing rank."""
        raise NotImplementedError

    def settle_unfinished(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for ranks still running the last call that failed on another rank;
        whether they all ended. A backend whose failed calls leave nothing running has nothing to wait for."""
        return True

    def shutdown(self, reason: str = "shutdown() was called") -> None:
        """Stop the workers and give back what the group holds; ``reason`` is what a later call is told.
        Backends call ``_mark_shut_down(reason)`` first; calling ``shutdown`` again is harmless."""
        raise NotImplementedError

    # --- shut down -----------------------------------------------------------------------------------
    @property
    def is_shut_down(self) -> bool:
        """True once the group's workers were shut down (cleanup after a failure skips such a group)."""
        return self.shutdown_reason is not None

    @property
    def shutdown_reason(self) -> str | None:
        lifecycle = getattr(self, "_lifecycle", None)
        return lifecycle.reason if lifecycle is not None else None

    def _mark_shut_down(self, reason: str) -> None:
        """Record why the workers went down (the first reason stays)."""
        if getattr(self, "_lifecycle", None) is None:
            self._lifecycle = _Lifecycle()
        if self._lifecycle.reason is None:
            self._lifecycle.reason = reason

    # --- direct access: the same question, answered by each backend ----------------------------------
    def handles(self, kind, role: str | None = None) -> list:
        """One handle per rank built by ``kind`` (a ``HandleKind``, base/direct.py) for where the workers
        live; ``role`` names the role inside a colocated worker class."""
        raise NotImplementedError

    def spawn_helpers(self, cls, count: int, *args, **kwargs):
        """``count`` driver-side helpers of ``cls`` on this group's backend (a ``HelperPool``, base/helpers.py)."""
        raise NotImplementedError

    def _make_future(self, method: str, ranks: list[int], handles: list, collect: Callable) -> DataProtoFuture:
        future = WatchedFuture(collect_fn=collect, futures=handles)
        future._wait = lambda: self._resolve(method, ranks, handles)
        return future

    # --- generic execution -----------------------------------------------------------------------
    def _call(self, method: str, ranks, per_args, per_kwargs) -> list:
        """``_execute``; a shut-down group refuses by name instead (its workers are gone)."""
        if self.is_shut_down:
            raise WorkerGroupShutDownError(self.name, method, self.shutdown_reason)
        return self._execute(method, ranks, per_args, per_kwargs)

    def _split_per_rank(self, ranks, args, kwargs):
        """Lists of length world_size are scattered; everything else is broadcast (veRL semantics)."""
        n = self.world_size

        def is_scatter(v):
            return isinstance(v, list) and len(v) == n

        scatter = all(is_scatter(a) for a in args) and all(is_scatter(v) for v in kwargs.values()) and (args or kwargs)
        per_args, per_kwargs = [], []
        for r in ranks:
            if scatter:
                per_args.append(tuple(a[r] for a in args))
                per_kwargs.append({k: v[r] for k, v in kwargs.items()})
            else:
                per_args.append(tuple(args))
                per_kwargs.append(dict(kwargs))
        return per_args, per_kwargs

    def execute_all_async(self, method_name: str, *args, **kwargs) -> list:
        ranks = list(range(self.world_size))
        per_args, per_kwargs = self._split_per_rank(ranks, args, kwargs)
        return self._call(method_name, ranks, per_args, per_kwargs)

    def execute_all_sync(self, method_name: str, *args, **kwargs) -> list:
        handles = self.execute_all_async(method_name, *args, **kwargs)
        return self._resolve(method_name, list(range(self.world_size)), handles)

    execute_all = execute_all_async

    def execute_rank_zero_async(self, method_name: str, *args, **kwargs):
        per_args, per_kwargs = self._split_per_rank([0], args, kwargs)
        return self._call(method_name, [0], per_args, per_kwargs)[0]

    def execute_rank_zero_sync(self, method_name: str, *args, **kwargs):
        handle = self.execute_rank_zero_async(method_name, *args, **kwargs)
        return self._resolve(method_name, [0], [handle])[0]

    execute_rank_zero = execute_rank_zero_async

    # --- mesh-aware dispatch support ----------------------------------------------------------------
    def _mesh_info(self, mesh_name: str) -> tuple[list[int], list[bool]]:
        """(dp rank, collected?) of every rank for ``mesh_name``, asked once through the workers'
        ``_query_dispatch_info`` / ``_query_collect_info`` and cached."""
        if mesh_name not in self._dispatch_info:
            self._dispatch_info[mesh_name] = list(self._query_dispatch_info(mesh_name))
        if mesh_name not in self._collect_info:
            self._collect_info[mesh_name] = list(self._query_collect_info(mesh_name))
        return self._dispatch_info[mesh_name], self._collect_info[mesh_name]

    def _dp_size_for(self, dispatch_fn) -> int:
        size_fn = getattr(dispatch_fn, "hybridflow_dp_size", None)
        return size_fn(self) if size_fn else self.world_size

    # --- binding ----------------------------------------------------------------------------------
    def _bind_worker_methods(self, user_cls, prefix: str = "") -> list[str]:
        """Bind every @register method of ``user_cls`` (remote name ``prefix + name``) by its plain name."""
        bound = []
        for name, info in registered_methods(user_cls).items():
            if prefix and not name.startswith(prefix):
                continue
            plain = name[len(prefix) :]
            if hasattr(type(self), plain):
                continue  # never shadow the WorkerGroup's own API (execute_all_sync, world_size, ...)
            setattr(self, plain, self._make_method(name, info))
            bound.append(plain)
        return bound

    def _make_method(self, remote_name: str, info: dict[str, Any]) -> Callable:
        dispatch_fn, collect_fn, splits_proto = get_dispatch_fns(info["dispatch_mode"])
        execute_mode, blocking = info["execute_mode"], info["blocking"]
        group = self

        def method(*args, **kwargs):
            pad = 0
            if splits_proto:
                args, kwargs, pad = _pad_proto_args(args, kwargs, group._dp_size_for(dispatch_fn))
            args, kwargs = dispatch_fn(group, *args, **kwargs)
            if execute_mode is Execute.ALL:
                ranks = list(range(group.world_size))
                per_args, per_kwargs = group._split_per_rank(ranks, args, kwargs)
            else:  # rank zero: its own share of per-rank lists, other arguments unsplit (veRL)
                ranks = [0]
                per_args, per_kwargs = group._split_per_rank(ranks, args, kwargs)
            handles = group._call(remote_name, ranks, per_args, per_kwargs)

            def collect(outputs):
                if execute_mode is Execute.RANK_ZERO:
                    return outputs[0]  # only rank zero ran: its answer is the answer
                return _unpad(collect_fn(group, outputs), pad)

            if blocking:
                return collect(group._resolve(remote_name, ranks, handles))
            if execute_mode is Execute.RANK_ZERO:
                return handles[0]  # veRL: the one ObjectRef
            if joins_batches(collect_fn):
                return group._make_future(remote_name, ranks, handles, collect)
            pending = collect_fn(group, handles)  # veRL: e.g. ONE_TO_ALL/ALL_TO_ALL -> the list of ObjectRefs
            if isinstance(pending, list):  # ... which get() also waits for, under the watchdog
                return PendingResults(pending, lambda: collect(group._resolve(remote_name, ranks, handles)))
            return pending

        method.__name__ = remote_name
        method.__qualname__ = f"{type(self).__name__}.{remote_name}"
        return method

    # --- colocated roles ---------------------------------------------------------------------------
    def _view(self, name: str):
        view = object.__new__(type(self))
        view.__dict__.update({k: v for k, v in self.__dict__.items() if k not in self._bound_names})
        view.name = name
        view._dispatch_info, view._collect_info = {}, {}
        return view

    def spawn(self, prefix_set) -> dict[str, WorkerGroup]:
        """One view per role of a colocated worker class, with the role's plain method names.

        The views share this group's worker processes. For a ``create_colocated_worker_cls`` class the
        roles' methods are ``<role>_<method>`` on the worker (``view.execute_all_sync`` etc. take those
        names).
        """
        views = {}
        for role in prefix_set:
            view = self._view(f"{self.name}:{role}")
            view._bound_names = view._bind_worker_methods(self._user_cls, prefix=f"{role}_")
            views[role] = view
        return views
