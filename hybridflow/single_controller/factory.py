"""The one place a backend name (``trainer.backend``: ray | inprocess) becomes worker groups.

- ``start_backend``: ready the backend for this process (start or join Ray; in process, set the
  workers' environment variables here, where those workers live); returns how to undo it.
- ``pool_size_problem`` / ``check_pools_fit``: fail early, with the numbers, when the resource pools
  cannot all be placed (from the config alone; then against the Ray cluster).
- ``build_worker_group``: a resource pool and a group on it, of one worker class or of several roles
  fused into one worker per process (``group.spawn(roles)`` then gives one view per role).

Above the single controller nothing else asks which backend it has: every group answers the same
questions the same way (``handles``, ``spawn_helpers``, ``shutdown``; base/worker_group.py).
"""

from __future__ import annotations

import os
from collections.abc import Callable

from hybridflow.config.errors import ConfigError
from hybridflow.single_controller.base.worker_group import ClassWithInitArgs, WorkerGroup
from hybridflow.utils.environ import restore_environ, snapshot_environ

BACKENDS = ("ray", "inprocess")


def check_backend(backend: str) -> str:
    if backend not in BACKENDS:
        raise ValueError(f"trainer.backend must be 'ray' or 'inprocess', got {backend!r}")
    return backend


def start_backend(backend: str, ray_init=None, worker_env: dict | None = None) -> Callable[[], None]:
    """Start (or join) the backend; ``worker_env`` reaches every worker. Returns ``stop``, which undoes
    what this call did: shuts Ray down if this call started it, or restores the variables it set."""
    env = {str(k): str(v) for k, v in (worker_env or {}).items()}
    if check_backend(backend) == "inprocess":
        previous = snapshot_environ(list(env))
        os.environ.update(env)  # the in-process workers are this process
        return lambda: restore_environ(previous)
    import ray

    from hybridflow.single_controller.ray.init import init_ray

    started = init_ray(ray_init, runtime_env={"env_vars": env})
    return ray.shutdown if started else (lambda: None)


def write_timeline(backend: str, path: str) -> str:
    """Write Ray's timeline of this session (every task and actor call, per worker: a Chrome trace) to
    ``path``; returns the absolute path. The config check refuses the key on the in-process backend."""
    if check_backend(backend) != "ray":
        raise ValueError(f"ray_kwargs.timeline_json_file={path}: trainer.backend={backend} runs no Ray workers")
    import ray

    path = os.path.abspath(os.path.expanduser(path))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    ray.timeline(filename=path)
    return path


def pool_size_problem(backend: str, processes: int) -> str | None:
    """Why a pool of ``processes`` workers cannot run on ``backend``, known before anything starts
    (None: it can, as far as the numbers tell; a Ray cluster's size is checked when pools are built)."""
    if check_backend(backend) == "inprocess" and processes != 1:
        return "trainer.backend=inprocess runs one worker per resource pool, in the driver; use trainer.backend=ray"
    return None


def check_pool_size(backend: str, processes: int, key: str) -> None:
    """Start-up check of a pool sized by ``key`` (the keys, as the user reads them): ConfigError unless
    ``backend`` can run ``processes`` workers in one pool (ValueError naming trainer.backend: unknown)."""
    if problem := pool_size_problem(backend, processes):
        raise ConfigError(f"{key} = {processes}: {problem} (or set both to 1)")


def check_pools_fit(backend: str, pools: dict[str, list[int]], use_gpu: bool = False) -> None:
    """``pools``: name -> processes per node, for every pool the job will build."""
    for name, sizes in pools.items():
        problem = pool_size_problem(backend, sum(sizes))
        if problem:
            raise ValueError(
                f"resource pool {name!r} asks for {sum(sizes)} workers ({'+'.join(map(str, sizes))} "
                f"per node): {problem}"
            )
    if backend == "inprocess":
        return
    from hybridflow.single_controller.ray.placement import check_cluster_fits

    check_cluster_fits(pools, use_gpu)


def build_worker_group(
    backend: str,
    workers: ClassWithInitArgs | dict[str, ClassWithInitArgs],
    process_on_nodes: list[int],
    *,
    name: str = "workers",
    use_gpu: bool = False,
    max_colocate_count: int = 10,
    concurrency_groups: dict[str, int] | None = None,
) -> WorkerGroup:
    """A group of ``workers`` over a new resource pool of ``process_on_nodes`` processes per node.

    ``workers``: one class with its arguments, or {role: class with arguments} fused into one worker
    per process. ``name`` names the pool (and the in-process group). ``max_colocate_count``: groups that
    may share the pool's devices (each worker takes that fraction of its bundle). ``concurrency_groups``
    ({name: max calls}): methods called directly (``handles``) that run beside the group's one-at-a-time
    calls (Ray actor concurrency groups; in process direct calls never queue behind the group's thread).
    The group owns its pool: ``shutdown`` frees both.
    """
    if check_backend(backend) == "inprocess":
        check_pools_fit(backend, {name: list(process_on_nodes)})  # (a Ray pool checks the cluster itself)
        from hybridflow.single_controller.inprocess import InProcessWorkerGroup, create_colocated_worker_cls

        cls = create_colocated_worker_cls(workers) if isinstance(workers, dict) else workers
        return InProcessWorkerGroup(cls, name_prefix=f"hybridflow_{name}")
    import ray

    from hybridflow.single_controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup
    from hybridflow.single_controller.ray import create_colocated_worker_cls as ray_colocated

    options = {"concurrency_groups": dict(concurrency_groups)} if concurrency_groups else None
    if isinstance(workers, dict):
        cls = ray_colocated(workers, remote_options=options)
    else:
        remote = ray.remote(**options)(workers.user_cls) if options else ray.remote(workers.user_cls)
        cls = RayClassWithInitArgs(remote, *workers.args, **workers.kwargs)
    pool = RayResourcePool(
        process_on_nodes=list(process_on_nodes),
        use_gpu=use_gpu,
        max_colocate_count=max_colocate_count,
        name_prefix=f"hf_{name}_pool",
    )
    group = RayWorkerGroup(pool, cls)
    group.owns_resource_pool = True
    return group


__all__ = [
    "BACKENDS",
    "build_worker_group",
    "check_backend",
    "check_pool_size",
    "check_pools_fit",
    "pool_size_problem",
    "start_backend",
    "write_timeline",
]
