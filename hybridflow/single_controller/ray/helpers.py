"""Helpers (base/helpers.py) as Ray actors: one async actor per helper, taking no CPU of its own
(they mostly wait on the workers), so they never compete with the resource pools for a share."""

from __future__ import annotations

import ray

from hybridflow.single_controller.base.helpers import HelperPool


class RayHelpers(HelperPool):
    def __init__(self, cls, count: int, args: tuple = (), kwargs: dict | None = None):
        remote = ray.remote(num_cpus=0)(cls)
        self.actors = [remote.remote(*args, **(kwargs or {})) for _ in range(count)]

    def __len__(self) -> int:
        return len(self.actors)

    def call(self, index, method, *args):
        return getattr(self.actors[index], method).remote(*args)

    def future(self, index, method, *args):
        return self.call(index, method, *args).future()

    def ask_all(self, method, timeout_s):
        return ray.get(self.call_all(method), timeout=timeout_s)  # GetTimeoutError is a TimeoutError

    def close(self) -> None:
        for actor in self.actors:
            ray.kill(actor)
        self.actors = []


__all__ = ["RayHelpers"]
