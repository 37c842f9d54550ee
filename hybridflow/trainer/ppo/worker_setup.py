"""Build the worker groups of a PPO job: roles mapped onto resource pools.

Colocated (the default, the hybrid engine): every role in one process per device, trainer pool of
``trainer.nnodes × trainer.n_gpus_per_node``; the actor trains and generates in the same process.

Separated (``actor_rollout_ref.rollout.nnodes > 0``, veRL's standalone rollout, needed by the
asynchronous modes): the trainer pool holds the actor (+ ref, critic, reward model), a rollout pool of
``rollout.nnodes × rollout.n_gpus_per_node`` holds the rollout engines, so generation and training
run at the same time; weights travel from the actor group to the rollout group after updates.

The groups come from the single controller's factory for ``trainer.backend`` (``ray``: worker
processes over resource pools; ``inprocess``: the workers live in the driver, one per pool, for
breakpoint() and Ray-less machines); nothing here depends on which.

Returned groups: ``actor_rollout`` (the actor; also the rollout when colocated), ``rollout`` (the
group hosting the engines), optionally ``critic``, ``rm`` (a sequence-classification reward model) and
``judge`` (a generative reward model's engines, judge_setup.py), ``teacher_<name>`` (each distillation
teacher's engines, on a pool of its own: teacher_setup.py), and ``_fused`` (the trainer pool's fused
group) and ``_fused_rollout``; ``rollout_role_name`` names the rollout worker inside its fused class.
"""

from __future__ import annotations

from hybridflow.agent_loop.server_manager import ROLLOUT_CONCURRENCY_GROUP
from hybridflow.single_controller.base import ClassWithInitArgs
from hybridflow.single_controller.factory import build_worker_group, check_pools_fit
from hybridflow.trainer.config_checks import resolve_device
from hybridflow.trainer.ppo.judge_setup import JUDGE_ROLE, judge_worker_config
from hybridflow.trainer.ppo.teacher_setup import teacher_pools
from hybridflow.workers.actor_rollout_ref_worker import ActorRolloutRefWorker
from hybridflow.workers.critic_worker import CriticWorker
from hybridflow.workers.judge_worker import JudgeWorker
from hybridflow.workers.reward_model_worker import RewardModelWorker

# requests one rollout worker serves at once (coroutines on its "rollout" group's event loop: no thread each)
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
    pools.update({name: [replicas] for name, (replicas, _) in teacher_pools(config).items()})
    return pools


def role_classes(
    config, use_critic: bool, use_ref: bool, use_rm: bool, use_judge: bool = False
) -> dict[str, dict[str, tuple[type, tuple, dict]]]:
    """pool name -> {role name -> (worker class, args, kwargs)}."""
    aref = config.actor_rollout_ref
    if separated_rollout(config):
        trainer = {
            "actor_rollout": (ActorRolloutRefWorker, (), {"config": aref, "role": "actor_ref" if use_ref else "actor"})
        }
        pools = {
            "trainer": trainer,
            "rollout": {"rollout": (ActorRolloutRefWorker, (), {"config": aref, "role": "rollout"})},
        }
    else:
        role = "actor_rollout_ref" if use_ref else "actor_rollout"
        trainer = {"actor_rollout": (ActorRolloutRefWorker, (), {"config": aref, "role": role})}
        pools = {"trainer": trainer}
    if use_critic:
        trainer["critic"] = (CriticWorker, (), {"config": config.critic})
    if use_rm:
        trainer["rm"] = (RewardModelWorker, (), {"config": config.reward_model, **rm_input_tokenizer(config)})
    if use_judge:
        trainer[JUDGE_ROLE] = (JudgeWorker, (), judge_worker_config(config))
    pools.update({name: {name: (JudgeWorker, (), kwargs)} for name, (_, kwargs) in teacher_pools(config).items()})
    return pools


def rm_input_tokenizer(config) -> dict:
    """The tokenizer that decodes responses for the reward model (its keyword arguments): the key
    ``reward_model.model.input_tokenizer``, else the policy's (``model.tokenizer_path`` or ``model.path``)."""
    model = config.actor_rollout_ref.model
    for key, value in (
        ("reward_model.model.input_tokenizer", config.reward_model.model.input_tokenizer),
        ("actor_rollout_ref.model.tokenizer_path", model.tokenizer_path),
        ("actor_rollout_ref.model.path", model.path),
    ):
        if value:
            return {"input_tokenizer": str(value), "input_tokenizer_key": key}
    return {}


def build_worker_groups(config, use_critic: bool, use_ref: bool, use_rm: bool, use_judge: bool = False) -> dict:
    """One group per pool (its roles fused into one worker per process), spawned into one view per role."""
    pools = role_classes(config, use_critic, use_ref, use_rm, use_judge)
    sizes = pool_sizes(config)
    backend = config.trainer.backend
    use_gpu = resolve_device(config.trainer.device) == "cuda"
    check_pools_fit(backend, sizes, use_gpu)
    groups: dict = {}
    for pool, roles in pools.items():
        # the rollout server's per-request endpoint runs in its own concurrency group: many requests in
        # flight on one worker, while the driver's calls still run one at a time
        classes = {name: ClassWithInitArgs(cls, *a, **kw) for name, (cls, a, kw) in roles.items()}
        group = build_worker_group(
            backend,
            classes,
            sizes[pool],
            name=pool,
            use_gpu=use_gpu,
            max_colocate_count=1,
            concurrency_groups={ROLLOUT_CONCURRENCY_GROUP: ROLLOUT_MAX_IN_FLIGHT},
        )
        groups.update(group.spawn(prefix_set=list(roles)))
        groups["_fused" if pool == "trainer" else f"_fused_{pool}"] = group
    if "rollout" not in groups:
        groups["rollout"] = groups["actor_rollout"]
    return groups


def rollout_role_name(config) -> str:
    """The name of the rollout worker inside its fused (colocated) worker class."""
    return "rollout" if separated_rollout(config) else "actor_rollout"
