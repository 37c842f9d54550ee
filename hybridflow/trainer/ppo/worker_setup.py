"""Build the worker groups of a PPO job: every role colocated in one process per device.

Backends: ``ray`` (a RayWorkerGroup over a resource pool of nnodes × n_gpus_per_node processes) or
``inprocess`` (the workers live in the driver; world size 1, for breakpoint() and Ray-less machines).
"""

from __future__ import annotations

from hybridflow.single_controller.base import ClassWithInitArgs
from hybridflow.workers.fsdp_workers import ActorRolloutRefWorker, CriticWorker, RewardModelWorker


def role_classes(config, use_critic: bool, use_ref: bool, use_rm: bool) -> dict[str, tuple[type, tuple, dict]]:
    """role name → (worker class, args, kwargs)."""
    role = "actor_rollout_ref" if use_ref else "actor_rollout"
    roles = {"actor_rollout": (ActorRolloutRefWorker, (), {"config": config.actor_rollout_ref, "role": role})}
    if use_critic:
        roles["critic"] = (CriticWorker, (), {"config": config.critic})
    if use_rm:
        roles["rm"] = (RewardModelWorker, (), {"config": config.reward_model})
    return roles


def build_worker_groups(config, use_critic: bool, use_ref: bool, use_rm: bool) -> dict:
    roles = role_classes(config, use_critic, use_ref, use_rm)
    backend = config.trainer.backend
    world = int(config.trainer.nnodes) * int(config.trainer.n_gpus_per_node)
    if backend == "inprocess":
        from hybridflow.single_controller.inprocess import InProcessWorkerGroup, create_colocated_worker_cls

        if world != 1:
            raise ValueError(f"trainer.backend=inprocess runs one worker; nnodes × n_gpus_per_node = {world}")
        fused = create_colocated_worker_cls({name: ClassWithInitArgs(cls, *a, **kw) for name, (cls, a, kw) in roles.items()})
        group = InProcessWorkerGroup(fused, name_prefix="hybridflow")
        return group.spawn(prefix_set=list(roles))
    if backend != "ray":
        raise ValueError(f"trainer.backend must be 'ray' or 'inprocess', got {backend!r}")

    import ray

    from hybridflow.single_controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup, create_colocated_worker_cls
    from hybridflow.trainer.config_checks import resolve_device

    use_gpu = resolve_device(config.trainer.device) == "cuda"
    pool = RayResourcePool(process_on_nodes=[int(config.trainer.n_gpus_per_node)] * int(config.trainer.nnodes),
                           use_gpu=use_gpu, max_colocate_count=1)
    fused = create_colocated_worker_cls(
        {name: RayClassWithInitArgs(ray.remote(cls), *a, **kw) for name, (cls, a, kw) in roles.items()})
    group = RayWorkerGroup(pool, fused)
    views = group.spawn(prefix_set=list(roles))
    views["_fused"] = group
    return views
