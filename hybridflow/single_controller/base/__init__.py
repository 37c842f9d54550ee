from hybridflow.single_controller.base.cleanup import cleanup_after_failure, is_shut_down
from hybridflow.single_controller.base.decorator import Dispatch, Execute, register
from hybridflow.single_controller.base.errors import (
    WorkerDiedError,
    WorkerError,
    WorkerGroupShutDownError,
    WorkerHangError,
)
from hybridflow.single_controller.base.heartbeat import report_progress
from hybridflow.single_controller.base.watchdog import (
    CallThread,
    Deadline,
    Watchdog,
    await_with_deadline,
    call_with_deadline,
    wait_with_deadline,
)
from hybridflow.single_controller.base.worker import Worker
from hybridflow.single_controller.base.worker_group import ClassWithInitArgs, ResourcePool, WorkerGroup

__all__ = [
    "CallThread",
    "ClassWithInitArgs",
    "Deadline",
    "Dispatch",
    "Execute",
    "ResourcePool",
    "Watchdog",
    "Worker",
    "WorkerDiedError",
    "WorkerError",
    "WorkerGroupShutDownError",
    "WorkerHangError",
    "WorkerGroup",
    "await_with_deadline",
    "call_with_deadline",
    "cleanup_after_failure",
    "is_shut_down",
    "register",
    "report_progress",
    "wait_with_deadline",
]
