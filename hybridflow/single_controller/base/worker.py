"""Worker: the base class of everything that runs in a worker process.

It knows its rank, world size and the rendezvous address (from the environment the WorkerGroup
sets: RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT) and can set up torch.distributed.
"""

from __future__ import annotations

import os
import random
import socket
from datetime import timedelta

from hybridflow.single_controller.base import rendezvous
from hybridflow.single_controller.base.decorator import Dispatch, Execute, register
from hybridflow.single_controller.base.heartbeat import in_ray_worker, report_progress
from hybridflow.single_controller.base.stacks import install_stack_dump_handler


def find_free_port(host: str = "127.0.0.1") -> int:
    """A port that is free now, for a rendezvous store to bind a moment later.

    Picked outside the kernel's ephemeral range where there is room: a port from ``bind(0)`` is one the
    kernel also hands out as the source port of outgoing connections (Ray's, vLLM's, other test
    processes'), which can take it before the store binds it (CI failed so once, EADDRINUSE)."""
    rng = random.SystemRandom()
    candidates = [range(lo, hi) for lo, hi in _ports_outside_ephemeral_range() if hi - lo >= 1000]
    for _ in range(64 if candidates else 0):
        port = rng.choice(rng.choice(candidates))
        if _bindable(host, port):
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _ports_outside_ephemeral_range() -> list[tuple[int, int]]:
    """[lo, hi) ranges of ports above 20000 the kernel does not pick from by itself."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low, high = (int(v) for v in f.read().split())
    except (OSError, ValueError):
        return []  # not Linux: fall back to bind(0)
    return [(20000, low), (high + 1, 65536)]  # below 20000: Ray's worker ports (10002-19999)


def _bindable(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


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
        if self._world_size > 1 and rendezvous.publishing():
            # a Ray group: rank 0 binds its store now and publishes the port (rendezvous.py); others read it
            if self._rank == 0:
                os.environ["MASTER_PORT"] = str(
                    rendezvous.open_rank0_store(os.environ["MASTER_ADDR"], self._world_size)
                )
        elif self._rank == 0 and "MASTER_PORT" not in os.environ:
            # Rank 0 picks the rendezvous address; the WorkerGroup reads it and hands it to the others.
            os.environ["MASTER_ADDR"] = os.environ.get("MASTER_ADDR", "127.0.0.1")
            os.environ["MASTER_PORT"] = str(find_free_port(os.environ["MASTER_ADDR"]))
        self._dispatch_dp_rank: dict[str, int] = {}
        self._collect_dp_rank: dict[str, bool] = {}

    def release_engines(self) -> None:
        """Stop what this worker runs beside itself (a rollout engine's thread, model and processes). A Ray
        group's shutdown ends them with the worker's process; an in-process group calls this instead."""

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
        return os.environ.get("MASTER_ADDR", ""), os.environ.get("MASTER_PORT", "")

    def get_pid(self) -> int:
        return os.getpid()

    def report_progress(self) -> None:
        """Call from a long registered method (per request, per micro-batch): the driver's watchdog
        then extends the call's deadline instead of declaring it stuck."""
        report_progress(rank=self._rank)

    # --- torch.distributed -------------------------------------------------------------------------
    def init_process_group(self, backend: str | None = None, timeout_s: float = 600.0) -> None:
        """Join the default process group (gloo on CPU, nccl on CUDA). Idempotent.

        A world of one rendezvouses with itself through an in-memory store: no port is bound, so
        another process that took MASTER_PORT between its pick and this call cannot fail it. The ranks of a
        Ray group meet at the store rank 0 bound when it started (``rendezvous``), for the same reason."""
        import torch
        import torch.distributed as dist

        if dist.is_initialized():
            return
        device, default_backend = default_device_backend()
        backend = backend or default_backend
        if device == "cuda":
            torch.cuda.set_device(self._local_rank % max(torch.cuda.device_count(), 1))
        published = self._world_size > 1 and rendezvous.publishing()
        if self._world_size == 1:
            meet = {"store": dist.HashStore()}
        elif published:
            meet = {"store": rendezvous.join_store(self._rank, self._world_size, os.environ["MASTER_ADDR"], timeout_s)}
        else:
            meet = {"init_method": f"tcp://{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}"}
        dist.init_process_group(
            backend=backend, rank=self._rank, world_size=self._world_size, timeout=timedelta(seconds=timeout_s), **meet
        )
        if published and self._rank == 0:
            rendezvous.forget()  # every rank has connected: the group holds the store now

    # --- mesh-aware dispatch -----------------------------------------------------------------------
    def _register_dispatch_collect_info(self, mesh_name: str, dp_rank: int, is_collect: bool) -> None:
        """Declare which data-parallel shard this rank consumes for ``mesh_name`` and whether its
        output is the one collected for its tensor/sequence-parallel group (once per mesh)."""
        if mesh_name in self._dispatch_dp_rank or mesh_name in self._collect_dp_rank:
            raise ValueError(f"rank {self._rank}: mesh {mesh_name!r} is already registered")
        self._dispatch_dp_rank[mesh_name] = int(dp_rank)
        self._collect_dp_rank[mesh_name] = bool(is_collect)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def _query_dispatch_info(self, mesh_name: str) -> int:
        """This rank's data-parallel shard for ``mesh_name``."""
        if mesh_name not in self._dispatch_dp_rank:
            raise KeyError(
                f"rank {self._rank} ({type(self).__name__}) did not register dispatch info for mesh {mesh_name!r}"
            )
        return self._dispatch_dp_rank[mesh_name]

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def _query_collect_info(self, mesh_name: str) -> bool:
        return self.query_collect_info(mesh_name)

    def query_collect_info(self, mesh_name: str) -> bool:
        """Whether this rank's output is collected for ``mesh_name``."""
        if mesh_name not in self._collect_dp_rank:
            raise KeyError(
                f"rank {self._rank} ({type(self).__name__}) did not register collect info for mesh {mesh_name!r}"
            )
        return self._collect_dp_rank[mesh_name]

    def get_dispatch_collect(self) -> dict[str, dict]:
        """All registered meshes: ``{"dispatch_dp_rank": {mesh: dp_rank}, "collect_dp_rank": {mesh: bool}}``."""
        return {"dispatch_dp_rank": dict(self._dispatch_dp_rank), "collect_dp_rank": dict(self._collect_dp_rank)}

    def set_dispatch_collect(self, mesh_name: str, dispatch_dp_rank: dict, collect_dp_rank: dict) -> None:
        """Register ``mesh_name`` from another worker's ``get_dispatch_collect()`` (e.g. a role inside
        this worker), as veRL does: the mesh of those dicts (the last one, where they hold several) gives
        this mesh's values."""
        if mesh_name in self._dispatch_dp_rank or mesh_name in self._collect_dp_rank:
            raise ValueError(f"mesh {mesh_name!r} is already registered; have {sorted(self._dispatch_dp_rank)}")
        for dp_rank in dispatch_dp_rank.values():
            self._dispatch_dp_rank[mesh_name] = int(dp_rank)
        for is_collect in collect_dp_rank.values():
            self._collect_dp_rank[mesh_name] = bool(is_collect)

    # --- generic helpers callable from the driver (veRL's dispatch modes and signatures) -----------
    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO_WITH_FUNC)
    def execute_with_func_generator(self, func, *args, **kwargs):
        """``func(worker, *chunk_args)`` on every rank, each with its chunk of the batch arguments."""
        return func(self, *args, **kwargs)

    @register(dispatch_mode=Dispatch.ALL_TO_ALL, execute_mode=Execute.RANK_ZERO)
    def execute_func_rank_zero(self, func, *args, **kwargs):
        """``func(*args, **kwargs)`` on rank zero only, arguments as given."""
        return func(*args, **kwargs)
