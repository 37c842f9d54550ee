"""Build the worker groups of a PPO job: roles mapped onto resource pools.

Colocated (the default, the hybrid engine): every role in one process per device, trainer pool of
``trainer.nnodes × trainer.n_gpus_per_node``; the actor trains and generates in the same process.

Separated (``actor_rollout_ref.rollout.nnodes > 0``, veRL's standalone rollout, needed by the
asynchronous modes): the trainer pool holds the actor (+ ref, critic, reward model), a rollout pool of
``rollout.nnodes × rollout.n_gpus_per_node`` holds the rollout engines, so generation and training
run at the same time; weights travel from the actor group to the rollout group after updates.

Backends: ``ray`` (RayWorkerGroups over resource pools) or ``inprocess`` (the workers live in the
driver; one worker per group, for breakpoint() and Ray-less machines).

Returned groups: ``actor_rollout`` (the actor; also the rollout when colocated), ``rollout`` (the
group hosting the engines), optionally ``critic`` and ``rm``, and with Ray ``_fused`` (the trainer
pool's fused group) and ``_fused_rollout``; ``rollout_role_name`` names the rollout worker inside its
fused class.
"""

from __future__ import annotations

from hybridflow.agent_loop.server_manager import ROLLOUT_CONCURRENCY_GROUP
from hybridflow.single_controller.base import ClassWithInitArgs
from hybridflow.workers.fsdp_workers import ActorRolloutRefWorker, CriticWorker, RewardModelWorker

# requests one rollout worker serves at once (each waits on its own Ray thread while the engine batches)
ROLLOUT_MAX_IN_FLIGHT = 1024


def separated_rollout(config) -> bool:
    return int(config.actor_rollout_ref.rollout.nnodes or 0) > 0


def pool_sizes(config) -> dict[str, list[int]]:
    """Pool name -> processes per node."""
    t = config.trainer
    pools = {"trainer": [int(t.n_gpus_per_node)] * int(t.nnodes)}
    if separated_rollout(config):
        r = config.actor_rollout_ref.rollout
        pools["rollout"] = [int(r.n_gpus_per_node)] * int(r.nnodes)
    return pools


def role_classes(config, use_critic: bool, use_ref: bool, use_rm: bool) -> dict[str, dict[str, tuple[type, tuple, dict]]]:
    """pool name -> {role name -> (worker class, args, kwargs)}."""
    aref = config.actor_rollout_ref
    if separated_rollout(config):
        trainer = {"actor_rollout": (ActorRolloutRefWorker, (), {"config": aref, "role": "actor_ref" if use_ref else "actor"})}
        pools = {"trainer": trainer, "rollout": {"rollout": (ActorRolloutRefWorker, (), {"config": aref, "role": "rollout"})}}
    else:
        role = "actor_rollout_ref" if use_ref else "actor_rollout"
        trainer = {"actor_rollout": (ActorRolloutRefWorker, (), {"config": aref, "role": role})}
        pools = {"trainer": trainer}
    if use_critic:
        trainer["critic"] = (CriticWorker, (), {"config": config.critic})
    if use_rm:
        trainer["rm"] = (RewardModelWorker, (), {"config": config.reward_model})
    return pools


def build_worker_groups(config, use_critic: bool, use_ref: bool, use_rm: bool) -> dict:
    pools = role_classes(config, use_critic, use_ref, use_rm)
    sizes = pool_sizes(config)
    backend = config.trainer.backend
    if backend == "inprocess":
        groups = _inprocess_groups(pools, sizes)
    elif backend == "ray":
        groups = _ray_groups(config, pools, sizes)
    else:
        raise ValueError(f"trainer.backend must be 'ray' or 'inprocess', got {backend!r}")
    if "rollout" not in groups:
        groups["rollout"] = groups["actor_rollout"]
    return groups


def rollout_role_name(config) -> str:
    """The name of the rollout worker inside its fused (colocated) worker class."""
    return "rollout" if separated_rollout(config) else "actor_rollout"


def _inprocess_groups(pools: dict, sizes: dict) -> dict:
    from hybridflow.single_controller.inprocess import InProcessWorkerGroup, create_colocated_worker_cls

    groups: dict = {}
    for pool, roles in pools.items():
        world = sum(sizes[pool])
        if world != 1:
            key = "trainer.nnodes × trainer.n_gpus_per_node" if pool == "trainer" else \
                "actor_rollout_ref.rollout.nnodes × n_gpus_per_node"
            raise ValueError(f"trainer.backend=inprocess runs one worker per pool; {key} = {world}")
        fused = create_colocated_worker_cls({name: ClassWithInitArgs(cls, *a, **kw) for name, (cls, a, kw) in roles.items()})
        group = InProcessWorkerGroup(fused, name_prefix=f"hybridflow_{pool}")
        groups.update(group.spawn(prefix_set=list(roles)))
    return groups


def _check_cluster_fits(sizes: dict, use_gpu: bool) -> None:
    """All pools together must fit the cluster: fail at start with the numbers, never wait forever."""
    import ray

    need = sum(sum(s) for s in sizes.values())
    kind = "GPU" if use_gpu else "CPU"
    have = ray.cluster_resources().get(kind, 0)
    if need > have:
        detail = ", ".join(f"{pool}: {sum(s)} ({'+'.join(map(str, s))} per node)" for pool, s in sizes.items())
        raise RuntimeError(f"the resource pools need {need} {kind}s in total ({detail}) but the Ray cluster has "
                           f"{have:g}: lower trainer.nnodes / n_gpus_per_node (or rollout.nnodes / n_gpus_per_node) "
                           "or start Ray with more resources")


def _ray_groups(config, pools: dict, sizes: dict) -> dict:
    import ray

    from hybridflow.single_controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup, create_colocated_worker_cls
    from hybridflow.trainer.config_checks import resolve_device

    use_gpu = resolve_device(config.trainer.device) == "cuda"
    _check_cluster_fits(sizes, use_gpu)
    groups: dict = {}
    for pool, roles in pools.items():
        resource_pool = RayResourcePool(process_on_nodes=sizes[pool], use_gpu=use_gpu, max_colocate_count=1,
                                        name_prefix=f"hf_{pool}_pool")
        # the rollout server's per-request endpoint runs in its own concurrency group: many requests in
        # flight on one worker, while the driver's calls still run one at a time
        fused = create_colocated_worker_cls(
            {name: RayClassWithInitArgs(ray.remote(cls), *a, **kw) for name, (cls, a, kw) in roles.items()},
            remote_options={"concurrency_groups": {ROLLOUT_CONCURRENCY_GROUP: ROLLOUT_MAX_IN_FLIGHT}})
        group = RayWorkerGroup(resource_pool, fused)
        groups.update(group.spawn(prefix_set=list(roles)))
        groups["_fused" if pool == "trainer" else f"_fused_{pool}"] = group
    return groups
