"""veRL's ``fsdp_config.full_determinism``: the switches that make training kernels deterministic on
accelerators, applied in a worker process before it creates its process group and CUDA handles.

On CPU, runs are bit-identical without them (see the README's "Reproducibility"); on GPUs they
remove the non-determinism of cuBLAS workspaces, cuDNN autotuning, flash-attn's backward and NCCL's
choice of reduction algorithm, at a cost in speed. They are process-wide (torch has no per-module
switch): in a worker that holds the actor and the reference model, either section turns them on.
Environment variables already set by the user are kept.
"""

from __future__ import annotations

import os
import random
from collections.abc import Iterable
from typing import Any

import numpy as np
import torch

__all__ = ["DETERMINISM_ENV", "enable_full_determinism", "apply_full_determinism"]

# read when the library creates its handle / communicator, hence set before the first CUDA or NCCL call
DETERMINISM_ENV = {
    "CUBLAS_WORKSPACE_CONFIG": ":4096:8",  # deterministic cuBLAS (CUDA >= 10.2)
    "FLASH_ATTENTION_DETERMINISTIC": "1",  # transformers passes deterministic=True to flash-attn's backward
    "NCCL_ALGO": "Ring",  # one algorithm and protocol, not one picked per message size
    "NCCL_PROTO": "Simple",
}


def enable_full_determinism(seed: int) -> None:
    """Deterministic kernels (warning, not failing, on an op without a deterministic version) and
    seeded python/numpy/torch generators."""
    for key, value in DETERMINISM_ENV.items():
        os.environ.setdefault(key, value)
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)  # every device's generator too
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False


def apply_full_determinism(fsdp_configs: Iterable[Any]) -> int | None:
    """Enable full determinism if one of this worker's typed engine sections (``FSDPEngineConfig`` or
    None) asks for it, with that section's ``seed``; returns the seed used, or None when none asks."""
    for section in fsdp_configs:
        if section is not None and section.full_determinism:
            seed = int(section.seed)
            enable_full_determinism(seed)
            return seed
    return None
