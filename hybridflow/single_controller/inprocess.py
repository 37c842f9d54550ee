"""In-process backend: the WorkerGroup API over worker objects living in the driver's process.

World size 1, no Ray: a user can put ``breakpoint()`` inside a worker method, and the library runs
where Ray is not installed. Dispatch and collect are the shared ones; only execution differs (a
direct call). ``async def`` worker methods run on one background event loop shared by the
in-process workers (as a Ray async actor runs them on its loop), so their state (tasks, queues)
lives on across calls and the driver may itself be inside a running event loop.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import threading
import traceback
from concurrent.futures import Future

from hybridflow.single_controller.base.colocated import build_colocated_class, fused_class_with_init_args
from hybridflow.single_controller.base.colocated import create_colocated_worker_raw_cls  # noqa: F401
from hybridflow.single_controller.base.errors import WorkerError, WorkerHangError
from hybridflow.single_controller.base.stacks import format_own_stacks
from hybridflow.single_controller.base.watchdog import watch
from hybridflow.single_controller.base.worker import find_free_port
from hybridflow.single_controller.base.worker_group import ClassWithInitArgs, WorkerGroup, rows_per_rank

_loop: asyncio.AbstractEventLoop | None = None
_loop_lock = threading.Lock()


def _event_loop() -> asyncio.AbstractEventLoop:
    """The in-process workers' event loop, running in a daemon thread (started on first use)."""
    global _loop
    with _loop_lock:
        if _loop is None or _loop.is_closed():
            _loop = asyncio.new_event_loop()
            threading.Thread(target=_loop.run_forever, name="hybridflow-inprocess-loop", daemon=True).start()
        return _loop


class InProcessWorkerGroup(WorkerGroup):
    def __init__(self, cls_with_init: ClassWithInitArgs, name_prefix: str | None = None, resource_pool=None):
        if resource_pool is not None and resource_pool.world_size != 1:
            raise ValueError(f"the in-process backend runs exactly one worker; the resource pool asks for {resource_pool.world_size}")
        super().__init__(name=name_prefix or "inprocess", world_size=1)
        if not isinstance(cls_with_init, ClassWithInitArgs):
            cls_with_init = ClassWithInitArgs(cls_with_init)
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(find_free_port()))
        env = {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"}
        os.environ.update(env)
        self._user_cls = cls_with_init.user_cls
        self.fused_worker_used = bool(getattr(cls_with_init, "fused_worker_used", False))
        self.workers = [cls_with_init()]
        self._bound_names = self._bind_worker_methods(self._user_cls)

    def _execute(self, method, ranks, per_rank_args, per_rank_kwargs):
        """Runs the call here and now, under the watchdog (a monitor thread; time in breakpoint() is free)."""
        handles = []
        deadline = self._deadline(rows_per_rank(per_rank_args, per_rank_kwargs))
        for rank, args, kwargs in zip(ranks, per_rank_args, per_rank_kwargs):
            fut: Future = Future()
            try:
                self._calling_thread = threading.get_ident()  # the thread the method runs in (stack reports)
                with watch(method, deadline, group=self):
                    result = getattr(self.workers[rank], method)(*args, **kwargs)
                if inspect.iscoroutine(result):
                    handles.append(self._on_loop(result, method, rank))
                    continue
                fut.set_result(result)
            except WorkerHangError:
                raise  # the watchdog's verdict, report written: not a failure of the method
            except Exception as exc:  # surfaced, with context, when the result is read
                fut.set_exception(self._error(exc, method, rank))
            handles.append(fut)
        return handles

    def _on_loop(self, coroutine, method: str, rank: int) -> Future:
        """Run a coroutine method on the workers' loop; its failure is reported like a sync one's."""
        out: Future = Future()
        inner = asyncio.run_coroutine_threadsafe(coroutine, _event_loop())

        def done(f):
            exc = f.exception()
            if exc is None:
                out.set_result(f.result())
            else:
                out.set_exception(self._error(exc, method, rank))

        inner.add_done_callback(done)
        return out

    def _error(self, exc: BaseException, method: str, rank: int) -> WorkerError:
        detail = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        err = WorkerError(self.name, method, rank, detail)
        err.__cause__ = exc
        return err

    def _resolve(self, method, ranks, handles):
        return [h.result() for h in handles]

    def _collect_stacks(self, ranks):
        """The worker is this process: its threads' stacks (the watchdog's own thread left out)."""
        text = format_own_stacks(first=getattr(self, "_calling_thread", None))
        return {r: {"pid": os.getpid(), "state": "running", "tool": "traceback", "text": text,
                    "location": "the driver's process"} for r in ranks}

    def shutdown(self):
        """Nothing to kill: the worker objects live in the driver and go with it."""


def create_colocated_worker_cls(class_dict) -> ClassWithInitArgs:
    return build_colocated_class(class_dict)


def create_colocated_worker_cls_fused(class_dict) -> ClassWithInitArgs:
    """A fused worker class for the in-process backend (groups built from it: spawn / fuse)."""
    return fused_class_with_init_args(class_dict)
