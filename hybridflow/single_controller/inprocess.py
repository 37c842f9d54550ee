"""In-process backend: the WorkerGroup API over worker objects living in the driver's process.

World size 1, no Ray: a user can put ``breakpoint()`` inside a worker method, and the library runs
where Ray is not installed. Dispatch and collect are the shared ones; only execution differs: the
group's own thread runs the worker's methods while the caller waits for them under the watchdog.
``async def`` worker methods run on one background event loop shared by the in-process workers (as
a Ray async actor runs them on its loop), so their state (tasks, queues) lives on across calls and
the driver may itself be inside a running event loop.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import inspect
import logging
import os
import threading
import traceback
from concurrent.futures import Future
from functools import partial

from hybridflow.single_controller.base.colocated import build_colocated_class
from hybridflow.single_controller.base.direct import HandleKind
from hybridflow.single_controller.base.errors import WorkerError, WorkerGroupShutDownError
from hybridflow.single_controller.base.helpers import HelperPool
from hybridflow.single_controller.base.stacks import format_own_stacks
from hybridflow.single_controller.base.watchdog import CallThread, wait_with_deadline
from hybridflow.single_controller.base.worker import find_free_port
from hybridflow.single_controller.base.worker_group import ClassWithInitArgs, WorkerGroup, rows_per_rank
from hybridflow.utils.environ import restore_environ, snapshot_environ

logger = logging.getLogger(__name__)
RELEASE_ENGINES_TIMEOUT_S = 120.0  # a vLLM engine stops in ~5 s on 2 cores

_loop: asyncio.AbstractEventLoop | None = None
_loop_lock = threading.Lock()

# what a group sets in the process while in-process groups live (see ``_ProcessLease``)
_DIST_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def _event_loop() -> asyncio.AbstractEventLoop:
    """The in-process workers' event loop, running in a daemon thread (started on first use)."""
    global _loop
    with _loop_lock:
        if _loop is None or _loop.is_closed():
            _loop = asyncio.new_event_loop()
            threading.Thread(target=_loop.run_forever, name="hybridflow-inprocess-loop", daemon=True).start()
        return _loop


class _ProcessLease:
    """The process-wide state the in-process workers need while any in-process group lives: the
    rendezvous variables of a world of one (the workers read them as Ray workers do) and the default
    torch.distributed group they open. Taken by the first group, given back by the last one to shut
    down: the variables return to what they were and a process group opened meanwhile is destroyed."""

    _lock = threading.Lock()
    _holders = 0
    _saved_env: dict = {}
    _group_was_open = False

    @classmethod
    def acquire(cls) -> None:
        with cls._lock:
            if cls._holders == 0:
                cls._saved_env = snapshot_environ(_DIST_ENV)
                cls._group_was_open = _process_group_open()
                os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
                os.environ.setdefault("MASTER_PORT", str(find_free_port()))
                os.environ.update({"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"})
            cls._holders += 1

    @classmethod
    def release(cls) -> None:
        with cls._lock:
            if cls._holders == 0:
                return
            cls._holders -= 1
            if cls._holders:
                return
            if not cls._group_was_open and _process_group_open():
                import torch.distributed as dist

                dist.destroy_process_group()
            restore_environ(cls._saved_env)


def _process_group_open() -> bool:
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()


class _Host:
    """What the role views of one in-process group share: the worker objects and the one thread
    that runs their methods (in call order, as one Ray actor would)."""

    def __init__(self, name: str):
        self.thread = CallThread(name=f"hybridflow-inprocess:{name}"[:60])
        self.closed: str | None = None  # why calls are refused now
        _ProcessLease.acquire()

    def close(self, why: str) -> None:
        if self.closed is None:
            self.closed = why
            self.thread.close()
            _ProcessLease.release()


class InProcessWorkerGroup(WorkerGroup):
    """The WorkerGroup API over worker objects in this process.

    A method runs in the group's own thread while the calling thread waits for it in bounded steps
    under the watchdog: a call past its deadline raises ``WorkerHangError`` in the caller (the stuck
    thread is left behind; the group is then shut down). ``breakpoint()`` in worker code works
    there, and its time does not count against the deadline. Call ``shutdown()`` when done: it
    gives back the rendezvous variables and the process group the workers opened."""

    def __init__(self, cls_with_init: ClassWithInitArgs, name_prefix: str | None = None, resource_pool=None):
        if resource_pool is not None and resource_pool.world_size != 1:
            raise ValueError(
                f"the in-process backend runs exactly one worker; the resource pool asks for {resource_pool.world_size}"
            )
        super().__init__(name=name_prefix or "inprocess", world_size=1)
        if not isinstance(cls_with_init, ClassWithInitArgs):
            cls_with_init = ClassWithInitArgs(cls_with_init)
        self._user_cls = cls_with_init.user_cls
        self._host = _Host(self.name)
        try:
            # built in the group's thread, like every call after it (thread-local state stays put)
            built = self._host.thread.submit(cls_with_init)
            self.workers = wait_with_deadline(
                [built], self._deadline(), group=self, what="__init__", threads=[self._host.thread.ident]
            )
        except BaseException:
            self._host.close("its worker could not be built")
            raise
        self._bound_names = self._bind_worker_methods(self._user_cls)

    def _execute(self, method, ranks, per_rank_args, per_rank_kwargs):
        """Hands the calls to the group's thread; ``_resolve`` waits for them under the deadline."""
        if self._host.closed is not None:  # (a view made before the shutdown of the group it shares the host with)
            raise WorkerGroupShutDownError(self.name, method, self._host.closed)
        handles = _Handles()
        handles.rows = rows_per_rank(per_rank_args, per_rank_kwargs)
        for rank, args, kwargs in zip(ranks, per_rank_args, per_rank_kwargs):
            call = partial(self._run, method, rank, args, kwargs)
            if self._host.thread.is_current():  # a worker method calling its own group: run it here
                inner: Future = Future()
                try:
                    inner.set_result(call())
                except Exception as exc:
                    inner.set_exception(exc)
            else:
                inner = self._host.thread.submit(call)
            handles.append(_answer_of(inner))
        return handles

    def _run(self, method: str, rank: int, args, kwargs):
        """In the group's thread: the method; a coroutine method goes on to the workers' event loop."""
        try:
            result = getattr(self.workers[rank], method)(*args, **kwargs)
        except Exception as exc:
            raise self._error(exc, method, rank) from exc
        if inspect.iscoroutine(result):
            return _Awaiting(self._on_loop(result, method, rank))
        return result

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
        if isinstance(exc, WorkerError):
            return exc
        detail = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        err = WorkerError(self.name, method, rank, detail, cause=exc)
        err.__cause__ = exc
        return err

    def _resolve(self, method, ranks, handles):
        deadline = self._deadline(getattr(handles, "rows", 0))
        return wait_with_deadline(
            list(handles), deadline, group=self, what=method, ranks=ranks, threads=[self._host.thread.ident]
        )

    def _collect_stacks(self, ranks):
        """The worker is this process: its threads' stacks, the group's own thread first."""
        text = format_own_stacks(first=self._host.thread.ident)
        return {
            r: {
                "pid": os.getpid(),
                "state": "running",
                "tool": "traceback",
                "text": text,
                "location": "the driver's process",
            }
            for r in ranks
        }

    def shutdown(self, reason: str = "shutdown() was called"):
        """No process to kill: the workers release their engines (what a Ray group's end takes with its
        processes), and the group stops taking calls and gives back what it set in the process (the last group
        to go restores the rendezvous variables and closes the process group)."""
        if self._host.closed is None:
            self._release_engines()
        self._mark_shut_down(reason)
        self._host.close(reason)

    def _release_engines(self) -> None:
        """Each worker's ``release_engines``, on the group's thread, bounded; skipped when that thread is busy
        (a call stuck in a hang: the engine stays, as the stuck call does, until the process ends)."""
        if self._host.thread.busy or not hasattr(self, "workers"):
            return
        future = self._host.thread.submit(lambda: [getattr(w, "release_engines", lambda: None)() for w in self.workers])
        try:
            future.result(timeout=RELEASE_ENGINES_TIMEOUT_S)
        except concurrent.futures.TimeoutError:
            future.cancel()
            logger.warning("group %r: its engines did not stop within %ss", self.name, RELEASE_ENGINES_TIMEOUT_S)
        except Exception as e:  # noqa: BLE001 - shutting down goes on; the engines end with the process
            logger.warning("group %r: releasing its engines failed: %s: %s", self.name, type(e).__name__, e)

    # --- direct access (see base/direct.py, base/helpers.py) ------------------------------------------
    def handles(self, kind: HandleKind, role: str | None = None) -> list:
        """One ``kind.in_process`` handle per rank, on the worker object (``role``'s inside a colocated one)."""
        return [kind.in_process(_role_object(w, role), rank) for rank, w in enumerate(self.workers)]

    def spawn_helpers(self, cls, count: int, *args, **kwargs) -> HelperPool:
        """``count`` objects of ``cls`` in this process, their coroutine methods on one event loop thread."""
        return LocalHelpers(cls, count, args, kwargs)


def _role_object(worker, role: str | None):
    """The object of ``role`` inside a colocated worker; the worker itself for a plain one."""
    return worker._roles[role] if role is not None and hasattr(worker, "_roles") else worker


class LocalHelpers(HelperPool):
    """Helpers as objects in this process; their coroutine methods run on an event loop thread of the
    pool's own (each Ray helper actor would run them on its own loop), so the driver never blocks."""

    def __init__(self, cls, count: int, args: tuple = (), kwargs: dict | None = None, name: str = "hybridflow-helpers"):
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._thread.start()
        atexit.register(self.close)  # cancel the helpers' tasks quietly when the process ends
        self.helpers = [cls(*args, **(kwargs or {})) for _ in range(count)]

    def _serve(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def __len__(self) -> int:
        return len(self.helpers)

    def future(self, index, method, *args):
        return asyncio.run_coroutine_threadsafe(getattr(self.helpers[index], method)(*args), self.loop)

    call = future  # a concurrent Future is what wait_with_deadline takes

    def ask_all(self, method, timeout_s):
        futures = self.call_all(method)
        _, pending = concurrent.futures.wait(futures, timeout=timeout_s)
        if pending:
            raise TimeoutError(f"helpers did not answer {method!r} within {timeout_s} s")
        return [f.result() for f in futures]

    def close(self) -> None:
        """Cancel whatever still runs on the loop, then stop it."""
        self.helpers = []
        if not self.loop.is_running():
            return

        async def cancel_all():
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        try:
            asyncio.run_coroutine_threadsafe(cancel_all(), self.loop).result(timeout=10)
        except Exception:  # a task that refuses to die must not block shutdown
            pass
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)
        atexit.unregister(self.close)


class _Handles(list):
    """One Future per rank, and the rows the call carries (it scales the deadline)."""

    rows = 0


class _Awaiting:
    """A coroutine method's pending answer, handed from the group's thread to the caller."""

    def __init__(self, future: Future):
        self.future = future


def _answer_of(inner: Future) -> Future:
    """The call's answer: what the group's thread returned, or, for a coroutine method, what the
    event loop later gives."""
    outer: Future = Future()

    def copy(f: Future) -> None:
        exc = f.exception()
        if exc is not None:
            outer.set_exception(exc)
        elif isinstance(f.result(), _Awaiting):
            f.result().future.add_done_callback(copy)
        else:
            outer.set_result(f.result())

    inner.add_done_callback(copy)
    return outer


def create_colocated_worker_cls(class_dict) -> ClassWithInitArgs:
    return build_colocated_class(class_dict)
