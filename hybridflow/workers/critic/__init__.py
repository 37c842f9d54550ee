"""Value-function computations on one data-parallel rank (veRL's ``verl.workers.critic``)."""

from hybridflow.workers.critic.dp_critic import DataParallelPPOCritic

__all__ = ["DataParallelPPOCritic"]
