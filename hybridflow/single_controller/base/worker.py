"""Worker: the base class of everything that runs in a worker process.

It knows its rank, world size and the rendezvous address (from the environment the WorkerGroup
sets: RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT) and can set up torch.distributed.
"""

from __future__ import annotations

import os
import socket
from datetime import timedelta

from hybridflow.single_controller.base.decorator import Dispatch, Execute, register
from hybridflow.single_controller.base.heartbeat import in_ray_worker, report_progress
from hybridflow.single_controller.base.stacks import install_stack_dump_handler


def find_free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def default_device_backend() -> tuple[str, str]:
    """(device, torch.distributed backend): nccl on CUDA, gloo on CPU."""
    import torch

    if torch.cuda.is_available() and os.environ.get("HYBRIDFLOW_DEVICE", "auto") != "cpu":
        return "cuda", "nccl"
    return "cpu", "gloo"


class Worker:
    """Base worker. Subclasses add ``@register`` methods; the driver calls them through a WorkerGroup."""

    def __init__(self, cuda_visible_devices=None):
        if in_ray_worker():
            install_stack_dump_handler()  # first: the watchdog can then see a hang inside __init__ too
        self._rank = int(os.environ.get("RANK", 0))
        self._world_size = int(os.environ.get("WORLD_SIZE", 1))
        self._local_rank = int(os.environ.get("LOCAL_RANK", 0))
        if self._rank == 0 and "MASTER_PORT" not in os.environ:
            # Rank 0 picks the rendezvous address; the WorkerGroup reads it and hands it to the others.
            os.environ["MASTER_ADDR"] = os.environ.get("MASTER_ADDR", "127.0.0.1")
            os.environ["MASTER_PORT"] = str(find_free_port(os.environ["MASTER_ADDR"]))
        self._dispatch_info: dict[str, tuple[int, bool]] = {}

    # --- identity -------------------------------------------------------------------------------
    @property
    def rank(self) -> int:
        return self._rank

    @property
    def world_size(self) -> int:
        return self._world_size

    @property
    def local_rank(self) -> int:
        return self._local_rank

    def get_master_addr_port(self) -> tuple[str, str]:
        return os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"]

    def get_pid(self) -> int:
        return os.getpid()

    def report_progress(self) -> None:
        """Call from a long registered method (per request, per micro-batch): the driver's watchdog
        then extends the call's deadline instead of declaring it stuck."""
        report_progress(rank=self._rank)

    # --- torch.distributed -------------------------------------------------------------------------
    def init_process_group(self, backend: str | None = None, timeout_s: float = 600.0) -> None:
        """Join the default process group (gloo on CPU, nccl on CUDA). Idempotent."""
        import torch
        import torch.distributed as dist

        if dist.is_initialized():
            return
        device, default_backend = default_device_backend()
        backend = backend or default_backend
        if device == "cuda":
            torch.cuda.set_device(self._local_rank % max(torch.cuda.device_count(), 1))
        dist.init_process_group(
            backend=backend,
            init_method=f"tcp://{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}",
            rank=self._rank,
            world_size=self._world_size,
            timeout=timedelta(seconds=timeout_s),
        )

    # --- mesh-aware dispatch -----------------------------------------------------------------------
    def _register_dispatch_collect_info(self, mesh_name: str, dp_rank: int, is_collect: bool) -> None:
        """Declare which data-parallel shard this rank consumes for ``mesh_name`` and whether its
        output is the one collected for its tensor/sequence-parallel group."""
        self._dispatch_info[mesh_name] = (int(dp_rank), bool(is_collect))

    def _query_dispatch_info(self, mesh_name: str) -> tuple[int, bool]:
        if mesh_name not in self._dispatch_info:
            raise KeyError(f"rank {self._rank} did not register dispatch info for mesh {mesh_name!r}")
        return self._dispatch_info[mesh_name]

    # --- generic helpers callable from the driver --------------------------------------------------
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def execute_with_func_generator(self, func, *args, **kwargs):
        return func(self, *args, **kwargs)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, execute_mode=Execute.RANK_ZERO)
    def execute_func_rank_zero(self, func, *args, **kwargs):
        return func(self, *args, **kwargs)
