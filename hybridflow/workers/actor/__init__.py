"""Policy computations on one data-parallel rank (veRL's ``verl.workers.actor``)."""

from hybridflow.workers.actor.dp_actor import DataParallelPPOActor

__all__ = ["DataParallelPPOActor"]
