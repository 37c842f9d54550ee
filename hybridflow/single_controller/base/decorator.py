"""`@register`, the dispatch modes and their open registry (veRL 0.9.1's API).

A dispatch mode is a pair of functions (see ``dispatch_fns``). ``Dispatch`` is an open enumeration:
``register_dispatch_mode("MY_MODE", dispatch_fn, collect_fn)`` adds ``Dispatch.MY_MODE``;
``update_dispatch_mode(Dispatch.X, ...)`` replaces a mode's functions for WorkerGroups built
afterwards; ``DISPATCH_MODE_FN_REGISTRY`` maps every mode to ``{"dispatch_fn", "collect_fn"}``.
A method may also name its pair directly: ``@register(dispatch_mode={"dispatch_fn": f, "collect_fn": g})``.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from enum import Enum
from typing import Any

from hybridflow.protocol import DataProtoFuture
from hybridflow.single_controller.base import dispatch_fns as F
from hybridflow.single_controller.base.dispatch_fns import (  # noqa: F401  (veRL's import path)
    DispatchError,
    collect_all_to_all,
    collect_dp_compute,
    collect_dp_compute_data_proto,
    collect_rank_zero,
    dispatch_all_to_all,
    dispatch_dp_compute,
    dispatch_dp_compute_data_proto,
    dispatch_dp_compute_data_proto_with_func,
    dispatch_one_to_all,
    dispatch_rank_zero,
    make_nd_compute_dataproto_dispatch_fn,
)

MAGIC_ATTR = "__hybridflow_register__"


def _lookup_member(cls_name: str, name: str):
    """Unpickle a Dispatch member: the existing one, or the same name registered afresh (a mode a
    user registered on the driver and a worker process never imported)."""
    enum_cls = {"Dispatch": Dispatch}[cls_name]
    return enum_cls.from_name(name) or enum_cls.register(name)


class _DynamicEnumMeta(type):
    def __iter__(cls):
        return iter(list(cls._members.values()))

    def __contains__(cls, item) -> bool:
        return item in cls._members if isinstance(item, str) else item in cls._members.values()

    def __getitem__(cls, name: str):
        return cls._members[name]

    def __len__(cls) -> int:
        return len(cls._members)

    def names(cls) -> list[str]:
        return list(cls._members)


class Dispatch(metaclass=_DynamicEnumMeta):
    """The dispatch modes: an enumeration users can extend (``register_dispatch_mode``)."""

    _members: dict[str, Dispatch] = {}

    def __init__(self, name: str, value: int):
        self.name, self.value = name, value

    def __repr__(self) -> str:
        return f"<Dispatch.{self.name}: {self.value}>"

    def __reduce__(self):
        return _lookup_member, ("Dispatch", self.name)

    @classmethod
    def register(cls, name: str) -> Dispatch:
        key = name.upper()
        if key in cls._members:
            raise DispatchError(f"dispatch mode {key} is already registered")
        member = cls(key, len(cls._members))
        cls._members[key] = member
        setattr(cls, key, member)
        return member

    @classmethod
    def remove(cls, name: str) -> Dispatch:
        key = name.upper()
        member = cls._members.pop(key)
        delattr(cls, key)
        return member

    @classmethod
    def from_name(cls, name: str):
        return cls._members.get(name.upper())


for _name in (
    "RANK_ZERO",
    "ONE_TO_ALL",
    "ALL_TO_ALL",
    "DP_COMPUTE",
    "DP_COMPUTE_PROTO",
    "DP_COMPUTE_PROTO_WITH_FUNC",
    "DP_COMPUTE_METRIC",
    "DIRECT_ROLLOUT_METHOD",
):
    Dispatch.register(_name)


class Execute(Enum):
    ALL = "all"
    RANK_ZERO = "rank_zero"


DISPATCH_MODE_FN_REGISTRY: dict[Dispatch, dict[str, Callable]] = {
    Dispatch.RANK_ZERO: {"dispatch_fn": F.dispatch_rank_zero, "collect_fn": F.collect_rank_zero},
    Dispatch.ONE_TO_ALL: {"dispatch_fn": F.dispatch_one_to_all, "collect_fn": F.collect_all_to_all},
    Dispatch.ALL_TO_ALL: {"dispatch_fn": F.dispatch_all_to_all, "collect_fn": F.collect_all_to_all},
    Dispatch.DP_COMPUTE: {"dispatch_fn": F.dispatch_dp_compute, "collect_fn": F.collect_dp_compute},
    Dispatch.DP_COMPUTE_PROTO: {
        "dispatch_fn": F.dispatch_dp_compute_data_proto,
        "collect_fn": F.collect_dp_compute_data_proto,
    },
    Dispatch.DP_COMPUTE_PROTO_WITH_FUNC: {
        "dispatch_fn": F.dispatch_dp_compute_data_proto_with_func,
        "collect_fn": F.collect_dp_compute_data_proto,
    },
    Dispatch.DP_COMPUTE_METRIC: {"dispatch_fn": F.dispatch_dp_compute_data_proto, "collect_fn": F.collect_dp_compute},
    Dispatch.DIRECT_ROLLOUT_METHOD: {
        "dispatch_fn": F.dummy_direct_rollout_call,
        "collect_fn": F.dummy_direct_rollout_call,
    },
}


def _check_dispatch_mode(dispatch_mode) -> None:
    if isinstance(dispatch_mode, Dispatch):
        return
    if isinstance(dispatch_mode, dict):
        missing = sorted({"dispatch_fn", "collect_fn"} - set(dispatch_mode))
        if missing:
            raise DispatchError(f"a custom dispatch mode needs keys dispatch_fn and collect_fn; missing {missing}")
        return
    raise DispatchError(
        f"dispatch_mode must be a Dispatch or a dict with dispatch_fn/collect_fn, got {dispatch_mode!r}"
    )


def get_predefined_dispatch_fn(dispatch_mode: Dispatch) -> dict[str, Callable]:
    """``{"dispatch_fn", "collect_fn"}`` of a registered mode."""
    try:
        return DISPATCH_MODE_FN_REGISTRY[dispatch_mode]
    except KeyError:
        known = ", ".join(m.name for m in DISPATCH_MODE_FN_REGISTRY)
        raise DispatchError(f"dispatch mode {dispatch_mode!r} has no functions registered; known: {known}") from None


def register_dispatch_mode(dispatch_mode_name: str, dispatch_fn: Callable, collect_fn: Callable) -> Dispatch:
    """Add ``Dispatch.<NAME>`` with its pair of functions; a taken name is an error."""
    mode = Dispatch.register(dispatch_mode_name)
    DISPATCH_MODE_FN_REGISTRY[mode] = {"dispatch_fn": dispatch_fn, "collect_fn": collect_fn}
    return mode


def update_dispatch_mode(dispatch_mode: Dispatch, dispatch_fn: Callable, collect_fn: Callable) -> None:
    """Replace the functions of an existing mode (WorkerGroups built afterwards use them)."""
    _check_dispatch_mode(dispatch_mode)
    if dispatch_mode not in DISPATCH_MODE_FN_REGISTRY:
        raise DispatchError(f"dispatch mode {dispatch_mode!r} is not registered; use register_dispatch_mode")
    DISPATCH_MODE_FN_REGISTRY[dispatch_mode] = {"dispatch_fn": dispatch_fn, "collect_fn": collect_fn}


def get_predefined_execute_fn(execute_mode: Execute) -> dict[str, str]:
    return {
        Execute.ALL: {"execute_fn_name": "execute_all"},
        Execute.RANK_ZERO: {"execute_fn_name": "execute_rank_zero"},
    }[execute_mode]


def get_dispatch_fns(dispatch_mode) -> tuple[Callable, Callable, bool]:
    """(dispatch_fn, collect_fn, splits batches) for a Dispatch member or a custom dict, read now
    (so ``update_dispatch_mode`` reaches WorkerGroups built after it)."""
    _check_dispatch_mode(dispatch_mode)
    fns = get_predefined_dispatch_fn(dispatch_mode) if isinstance(dispatch_mode, Dispatch) else dispatch_mode
    dispatch_fn = fns["dispatch_fn"]
    return dispatch_fn, fns["collect_fn"], hasattr(dispatch_fn, "hybridflow_dp_size")


def _materialize(value):
    return value.get() if isinstance(value, DataProtoFuture) else value


def register(dispatch_mode=Dispatch.ALL_TO_ALL, execute_mode=Execute.ALL, blocking=True, materialize_futures=True):
    """Mark a worker method as callable from the driver through a WorkerGroup.

    ``async def`` methods stay coroutine functions (Ray runs their actor as an async actor; the
    in-process backend runs them on its event loop), so worker code can still ``await`` them.
    """
    _check_dispatch_mode(dispatch_mode)
    if not isinstance(execute_mode, Execute):
        raise DispatchError(f"execute_mode must be an Execute member, got {execute_mode!r}")

    def decorator(func):
        def prepare(args, kwargs):
            if materialize_futures:
                args = tuple(_materialize(a) for a in args)
                kwargs = {k: _materialize(v) for k, v in kwargs.items()}
            return args, kwargs

        if inspect.iscoroutinefunction(func):

            @functools.wraps(func)
            async def inner(*args, **kwargs):
                args, kwargs = prepare(args, kwargs)
                return await func(*args, **kwargs)

        else:

            @functools.wraps(func)
            def inner(*args, **kwargs):
                args, kwargs = prepare(args, kwargs)
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
