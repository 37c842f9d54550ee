"""In-process backend: the WorkerGroup API over worker objects living in the driver's process.

World size 1, no Ray: a user can put ``breakpoint()`` inside a worker method, and the library runs
where Ray is not installed. Dispatch and collect are the shared ones; only execution differs (a
direct call).
"""

from __future__ import annotations

import os
import traceback
from concurrent.futures import Future

from hybridflow.single_controller.base.colocated import build_colocated_class
from hybridflow.single_controller.base.errors import WorkerError, WorkerHangError
from hybridflow.single_controller.base.stacks import format_own_stacks
from hybridflow.single_controller.base.watchdog import watch
from hybridflow.single_controller.base.worker import find_free_port
from hybridflow.single_controller.base.worker_group import ClassWithInitArgs, WorkerGroup, rows_per_rank


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
        self.workers = [cls_with_init()]
        self._bound_names = self._bind_worker_methods(self._user_cls)

    def _execute(self, method, ranks, per_rank_args, per_rank_kwargs):
        """Runs the call here and now, under the watchdog (a monitor thread; time in breakpoint() is free)."""
        handles = []
        deadline = self._deadline(rows_per_rank(per_rank_args, per_rank_kwargs))
        for rank, args, kwargs in zip(ranks, per_rank_args, per_rank_kwargs):
            fut: Future = Future()
            try:
                with watch(method, deadline, group=self):
                    fut.set_result(getattr(self.workers[rank], method)(*args, **kwargs))
            except WorkerHangError:
                raise  # the watchdog's verdict, report written: not a failure of the method
            except Exception as exc:  # surfaced, with context, when the result is read
                err = WorkerError(self.name, method, rank, traceback.format_exc())
                err.__cause__ = exc
                fut.set_exception(err)
            handles.append(fut)
        return handles

    def _resolve(self, method, ranks, handles):
        return [h.result() for h in handles]

    def _collect_stacks(self, ranks):
        """The worker is this process: its threads' stacks (the watchdog's own thread left out)."""
        return {r: {"pid": os.getpid(), "state": "running", "tool": "traceback", "text": format_own_stacks(),
                    "location": "the driver's process"} for r in ranks}

    def shutdown(self):
        """Nothing to kill: the worker objects live in the driver and go with it."""


def create_colocated_worker_cls(class_dict) -> ClassWithInitArgs:
    return build_colocated_class(class_dict)
