"""Training engines: how a model is wrapped for data-parallel training and how its weights leave it."""

from hybridflow.workers.engine.fsdp import EngineSpec, TrainEngine, engine_spec, weights_dtype
from hybridflow.workers.engine.optim import build_lr_scheduler, build_optimizer
from hybridflow.workers.engine.precision import ComputeWeights

__all__ = [
    "ComputeWeights",
    "EngineSpec",
    "TrainEngine",
    "engine_spec",
    "weights_dtype",
    "build_lr_scheduler",
    "build_optimizer",
]
