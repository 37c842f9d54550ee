"""veRL's import path for the workers (``verl.workers.fsdp_workers``)."""

from hybridflow.workers.actor_rollout_ref_worker import ActorRolloutRefWorker
from hybridflow.workers.critic_worker import CriticWorker
from hybridflow.workers.reward_model_worker import RewardModelWorker

__all__ = ["ActorRolloutRefWorker", "CriticWorker", "RewardModelWorker"]
