from hybridflow.single_controller.base.decorator import Dispatch, Execute, register
from hybridflow.single_controller.base.errors import WorkerDiedError, WorkerError
from hybridflow.single_controller.base.worker import Worker
from hybridflow.single_controller.base.worker_group import ClassWithInitArgs, ResourcePool, WorkerGroup

__all__ = [
    "ClassWithInitArgs",
    "Dispatch",
    "Execute",
    "ResourcePool",
    "Worker",
    "WorkerDiedError",
    "WorkerError",
    "WorkerGroup",
    "register",
]
