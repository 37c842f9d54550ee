"""Which accelerator this process computes on, and the names that follow from it (veRL's
``verl.utils.device`` helpers): CUDA when torch sees a GPU and ``HYBRIDFLOW_DEVICE`` is not ``cpu``,
else the CPU. hybridflow runs on NVIDIA GPUs or CPUs only, so the NPU queries answer False.

On a machine without a GPU these name the CPU (``get_device_name() == "cpu"``, backend ``gloo``,
Ray resource ``CPU``), where veRL 0.9.1 falls back to naming CUDA."""

from __future__ import annotations

import logging
import os
from types import ModuleType
from typing import Any

import torch

__all__ = [
    "is_torch_npu_available",
    "is_cuda_available",
    "is_npu_available",
    "uses_cuda",
    "get_resource_name",
    "get_vendor",
    "get_visible_devices_keyword",
    "get_device_name",
    "get_torch_device",
    "get_device_id",
    "get_nccl_backend",
    "set_expandable_segments",
    "auto_set_device",
    "get_device_capability",
    "is_support_ipc",
    "is_device_available",
    "manual_seed",
    "manual_seed_all",
]

logger = logging.getLogger(__name__)


def is_torch_npu_available(check_device: bool = True) -> bool:
    """Ascend NPUs are not a hybridflow device."""
    return False


is_cuda_available = torch.cuda.is_available()
is_npu_available = False


def uses_cuda() -> bool:
    """True when this process computes on CUDA (a GPU is visible and HYBRIDFLOW_DEVICE is not cpu)."""
    return torch.cuda.is_available() and os.environ.get("HYBRIDFLOW_DEVICE", "auto") != "cpu"


def get_resource_name() -> str:
    """The Ray resource a worker asks for: ``GPU`` or ``CPU``."""
    return "GPU" if uses_cuda() else "CPU"


def get_vendor() -> str:
    return "nvidia" if uses_cuda() else "cpu"


def get_visible_devices_keyword() -> str:
    """The environment variable that selects the visible devices."""
    return "CUDA_VISIBLE_DEVICES"


def get_device_name() -> str:
    """``cuda`` or ``cpu``: the device type string of ``torch.device``."""
    return "cuda" if uses_cuda() else "cpu"


def get_torch_device() -> ModuleType:
    """The torch module of the device (``torch.cuda`` or ``torch.cpu``)."""
    return torch.cuda if uses_cuda() else torch.cpu


def get_device_id() -> int:
    """The index of the current device (0 on the CPU)."""
    return torch.cuda.current_device() if uses_cuda() else 0


def get_nccl_backend() -> str:
    """The torch.distributed backend for the device: ``nccl`` on CUDA, ``gloo`` on the CPU."""
    return "nccl" if uses_cuda() else "gloo"


def set_expandable_segments(enable: bool) -> None:
    """CUDA's allocator setting ``expandable_segments`` (nothing to set on the CPU)."""
    if uses_cuda():
        torch.cuda.memory._set_allocator_settings(f"expandable_segments:{enable}")


def auto_set_device(config: Any) -> None:
    """Set ``config.trainer.device`` to the detected accelerator when one is present and the config
    names another (a CPU config on a GPU machine is left as it is)."""
    trainer = getattr(config, "trainer", None) if config else None
    if trainer is None or not hasattr(trainer, "device"):
        return
    detected = get_device_name()
    if detected != "cpu" and trainer.device not in (detected, "cpu", "auto"):
        logger.warning(f"config.trainer.device={trainer.device} on a {detected} machine: set to {detected}")
        trainer.device = detected


def get_device_capability(device_id: int = 0) -> tuple[int | None, int | None]:
    """(major, minor) compute capability of a CUDA device; (None, None) on the CPU."""
    if uses_cuda():
        return torch.cuda.get_device_capability(device_id)
    return None, None


def is_support_ipc() -> bool:
    """Whether tensors can be shared between processes through device IPC handles (CUDA)."""
    return uses_cuda()


def is_device_available() -> bool:
    """Whether an accelerator is available to this process."""
    return uses_cuda()


def manual_seed(seed: int) -> None:
    """Seed the current device's generator (the CPU's on the CPU)."""
    (torch.cuda.manual_seed if uses_cuda() else torch.manual_seed)(seed)


def manual_seed_all(seed: int) -> None:
    """Seed every device's generator."""
    (torch.cuda.manual_seed_all if uses_cuda() else torch.manual_seed)(seed)
