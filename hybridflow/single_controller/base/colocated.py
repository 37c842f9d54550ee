"""Colocation: several roles (actor+rollout+ref, critic, reward model) in one process per device.

``create_colocated_worker_cls({"actor_rollout": ClassWithInitArgs(...), "critic": ...})`` builds one
class whose instance holds one instance of each role and exposes each registered method as
``<role>_<method>`` with the same dispatch attributes. ``WorkerGroup.spawn(prefix_set)`` then gives
one WorkerGroup view per role with the plain method names, all sharing the same processes.
"""

from __future__ import annotations

import functools

from hybridflow.single_controller.base.decorator import MAGIC_ATTR, registered_methods
from hybridflow.single_controller.base.worker import Worker
from hybridflow.single_controller.base.worker_group import ClassWithInitArgs

ROLE_SEPARATOR = "_"


def _forwarder(role: str, method: str, info: dict):
    def forward(self, *args, **kwargs):
        return getattr(self._roles[role], method)(*args, **kwargs)

    forward.__name__ = f"{role}{ROLE_SEPARATOR}{method}"
    setattr(forward, MAGIC_ATTR, info)
    return forward


def build_colocated_class(class_dict: dict[str, ClassWithInitArgs]) -> ClassWithInitArgs:
    """Plain-Python fused class; backends wrap it (e.g. with ray.remote)."""
    if not class_dict:
        raise ValueError("create_colocated_worker_cls needs at least one role")
    specs = {role: (c if isinstance(c, ClassWithInitArgs) else ClassWithInitArgs(c)) for role, c in class_dict.items()}

    class ColocatedWorker(Worker):
        def __init__(self):
            super().__init__()
            # Roles are built in the order given, inside this one process.
            self._roles = {role: spec() for role, spec in specs.items()}

        def get_role_names(self):
            return list(self._roles)

        def call_role(self, role: str, method: str, *args, **kwargs):
            """Call any method of one role directly (not through a WorkerGroup): e.g. a rollout server's
            per-request endpoint, called by agent loop workers."""
            return getattr(self._roles[role], method)(*args, **kwargs)

    for role, spec in specs.items():
        for method, info in registered_methods(spec.user_cls).items():
            setattr(ColocatedWorker, f"{role}{ROLE_SEPARATOR}{method}", _forwarder(role, method, info))
    ColocatedWorker.__name__ = ColocatedWorker.__qualname__ = "Colocated_" + "_".join(specs)
    ColocatedWorker._colocated_roles = tuple(specs)
    return ClassWithInitArgs(ColocatedWorker)
