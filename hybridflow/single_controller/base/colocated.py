"""Colocation: several roles (actor+rollout+ref, critic, reward model) in one process per device.

Two ways, both veRL's:

- ``create_colocated_worker_cls({"actor_rollout": ClassWithInitArgs(...), "critic": ...})`` builds one
  class whose instance holds one instance of each role and exposes each registered method as
  ``<role>_<method>`` with the same dispatch attributes; ``WorkerGroup.spawn(prefix_set)`` then gives
  one view per role with the plain method names, all sharing the same processes.
- ``create_colocated_worker_raw_cls(class_dict)`` builds a *fused* worker: the roles live in
  ``fused_worker_dict`` (and as attributes), every role sees the others, and the driver reaches a
  role's method through ``_fuw_execute("<role>_fwmn_<method>", ...)``; a group built from it (its
  ClassWithInitArgs has ``fused_worker_used``) hands out role groups with ``spawn`` / ``fuse``.
"""

from __future__ import annotations

import inspect

from hybridflow.single_controller.base.decorator import MAGIC_ATTR, registered_methods
from hybridflow.single_controller.base.worker import Worker
from hybridflow.single_controller.base.worker_group import FUSED_SEPARATOR, ClassWithInitArgs

ROLE_SEPARATOR = "_"
FUSED_WORKER_CLS_NAME = "FusedWorker"


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

        def call_role(self, role: str, method: str, *args, **kwargs):
            """Call any method of one role directly (not through a WorkerGroup): e.g. a rollout server's
            per-request endpoint, called by agent loop workers."""
            return getattr(self._roles[role], method)(*args, **kwargs)

    for role, spec in specs.items():
        for method, info in registered_methods(spec.user_cls).items():
            is_async = inspect.iscoroutinefunction(getattr(spec.user_cls, method))
            setattr(ColocatedWorker, f"{role}{ROLE_SEPARATOR}{method}", _forwarder(role, method, info, is_async))
    ColocatedWorker.__name__ = ColocatedWorker.__qualname__ = "Colocated_" + "_".join(specs)
    return ClassWithInitArgs(ColocatedWorker)


def create_colocated_worker_raw_cls(class_dict: dict[str, ClassWithInitArgs]) -> type:
    """The fused worker class (veRL's ``FusedWorker_<role>_<role>``).

    ``raw_cls_dict`` maps each role to its plain class; an instance holds one instance of each role in
    ``fused_worker_dict`` (also set as attributes) and gives every role that same dict, so roles can
    reach each other; ``_fuw_execute("<role>_fwmn_<method>", *args)`` calls a role's method.
    """
    specs = _specs(class_dict)
    raw_cls_dict = {role: spec.user_cls for role, spec in specs.items()}
    any_async = any(
        inspect.iscoroutinefunction(getattr(cls, name))
        for cls in raw_cls_dict.values()
        for name in registered_methods(cls)
    )

    class FusedWorker(Worker):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.cls_names = list(specs)
            self.raw_cls_dict = raw_cls_dict
            for role, spec in specs.items():
                self.fused_worker_dict[role] = spec()
                setattr(self, role, self.fused_worker_dict[role])
            for worker in self.fused_worker_dict.values():  # every role sees its siblings
                setattr(worker, Worker.fused_worker_attr_name, self.fused_worker_dict)

        def _fused_target(self, method_name: str):
            role, sep, method = method_name.partition(FUSED_SEPARATOR)
            if not sep or role not in self.fused_worker_dict:
                raise KeyError(
                    f"calling {method_name!r}: no role {role!r} in this fused worker ({list(self.fused_worker_dict)})"
                )
            return getattr(self.fused_worker_dict[role], method)

    if any_async:

        async def _fuw_execute(self, method_name: str, *args, **kwargs):
            result = self._fused_target(method_name)(*args, **kwargs)
            return await result if inspect.isawaitable(result) else result

    else:

        def _fuw_execute(self, method_name: str, *args, **kwargs):
            return self._fused_target(method_name)(*args, **kwargs)

    FusedWorker._fuw_execute = _fuw_execute
    renamed = type("_".join([FUSED_WORKER_CLS_NAME, *specs]), (FusedWorker,), {})
    renamed.is_fused_worker = True
    renamed.raw_cls_dict = raw_cls_dict
    return renamed


def fused_class_with_init_args(class_dict, wrap=lambda cls: cls, cls_with_init=ClassWithInitArgs) -> ClassWithInitArgs:
    """``create_colocated_worker_raw_cls`` wrapped for a backend, marked ``fused_worker_used``."""
    out = cls_with_init(wrap(create_colocated_worker_raw_cls(class_dict)))
    out.fused_worker_used = True
    return out


__all__ = ["build_colocated_class", "create_colocated_worker_raw_cls", "fused_class_with_init_args"]
