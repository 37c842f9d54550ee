"""Colocation: several roles (actor+rollout+ref, critic, reward model) in one process per device.

``create_colocated_worker_cls({"actor_rollout": ClassWithInitArgs(...), "critic": ...})`` builds one class
whose instance holds one instance of each role and exposes each registered method as ``<role>_<method>``
with the same dispatch attributes; ``WorkerGroup.spawn(prefix_set)`` then gives one view per role with the
plain method names, all sharing the same processes. (veRL's second scheme, the fused worker of
``create_colocated_worker_raw_cls`` / ``_fuw_execute``, is not offered: nothing of the trainer used it.)
"""

from __future__ import annotations

import inspect

from hybridflow.single_controller.base.decorator import MAGIC_ATTR, registered_methods
from hybridflow.single_controller.base.worker import Worker
from hybridflow.single_controller.base.worker_group import ClassWithInitArgs

ROLE_SEPARATOR = "_"


def _forwarder(role: str, method: str, info: dict, is_async: bool):
    if is_async:  # keep the role's coroutine method a coroutine method (async actor on Ray)

        async def forward(self, *args, **kwargs):
            return await getattr(self._roles[role], method)(*args, **kwargs)

    else:

        def forward(self, *args, **kwargs):
            return getattr(self._roles[role], method)(*args, **kwargs)

    forward.__name__ = f"{role}{ROLE_SEPARATOR}{method}"
    setattr(forward, MAGIC_ATTR, info)
    return forward


def _specs(class_dict) -> dict[str, ClassWithInitArgs]:
    if not class_dict:
        raise ValueError("a colocated worker class needs at least one role")
    return {role: (c if isinstance(c, ClassWithInitArgs) else ClassWithInitArgs(c)) for role, c in class_dict.items()}


def build_colocated_class(class_dict: dict[str, ClassWithInitArgs]) -> ClassWithInitArgs:
    """Plain-Python ``<role>_<method>`` class; backends wrap it (e.g. with ray.remote)."""
    specs = _specs(class_dict)

    class ColocatedWorker(Worker):
        def __init__(self):
            super().__init__()
            # Roles are built in the order given, inside this one process.
            self._roles = {role: spec() for role, spec in specs.items()}

        def release_engines(self):
            for role in self._roles.values():
                getattr(role, "release_engines", lambda: None)()

        def call_role(self, role: str, method: str, *args, **kwargs):
            """Call any method of one role directly (not through a WorkerGroup): e.g. a rollout server's
            per-request endpoint, called by agent loop workers."""
            return getattr(self._roles[role], method)(*args, **kwargs)

    if any(inspect.getmembers(spec.user_cls, inspect.iscoroutinefunction) for spec in specs.values()):

        async def call_role_async(self, role: str, method: str, *args, **kwargs):
            """``call_role`` for a role's coroutine method (a rollout server's ``server_generate``): awaited
            on the actor's event loop, so a thousand calls in flight do not take a thousand threads."""
            return await getattr(self._roles[role], method)(*args, **kwargs)

        ColocatedWorker.call_role_async = call_role_async  # a role with coroutines makes this an async actor

    for role, spec in specs.items():
        for method, info in registered_methods(spec.user_cls).items():
            is_async = inspect.iscoroutinefunction(getattr(spec.user_cls, method))
            setattr(ColocatedWorker, f"{role}{ROLE_SEPARATOR}{method}", _forwarder(role, method, info, is_async))
    ColocatedWorker.__name__ = ColocatedWorker.__qualname__ = "Colocated_" + "_".join(specs)
    return ClassWithInitArgs(ColocatedWorker)


__all__ = ["build_colocated_class"]
