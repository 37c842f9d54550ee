"""Worker classes used by the single-controller tests (importable by Ray workers by value)."""

import os

import torch

from hybridflow.protocol import DataProto
from hybridflow.single_controller.base import Dispatch, Execute, Worker, register
from hybridflow.single_controller.base.decorator import make_nd_compute_dataproto_dispatch_fn


def _two_way_dispatch(worker_group, x):
    # custom dispatch: rank r gets x * (r + 1)
    return ([x * (r + 1) for r in range(worker_group.world_size)],), {}


def _sum_collect(worker_group, outputs):
    return sum(outputs)


class EchoWorker(Worker):
    def __init__(self, scale: float = 1.0):
        super().__init__()
        self.scale = scale
        self.value = None

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def set_value(self, v):
        self.value = v
        return self.rank

    @register(dispatch_mode=Dispatch.ALL_TO_ALL)
    def add(self, a, b):
        return a + b + self.rank

    @register(dispatch_mode=Dispatch.RANK_ZERO)
    def whoami(self):
        return self.rank, self.world_size

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, execute_mode=Execute.RANK_ZERO)
    def only_rank_zero(self):
        return f"ran on {self.rank}"

    @register(dispatch_mode=Dispatch.DP_COMPUTE)
    def dp_compute(self, x):
        return x * 10 + self.rank

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def double(self, data: DataProto) -> DataProto:
        out = DataProto.from_dict(
            tensors={"y": data.batch["x"] * 2 * self.scale, "rank": torch.full((len(data),), self.rank)},
            non_tensors={"tag": data.non_tensor_batch["tag"]},
        )
        return out

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def noop(self, data: DataProto) -> DataProto:
        return data

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO, blocking=False)
    def double_async(self, data: DataProto) -> DataProto:
        return DataProto.from_dict(tensors={"x": data.batch["x"] * 2})

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO_WITH_FUNC)
    def apply(self, func, data: DataProto) -> DataProto:
        return DataProto.from_dict(tensors={"x": func(data.batch["x"])})

    @register(dispatch_mode=Dispatch.DP_COMPUTE_METRIC)
    def count(self, data: DataProto):
        return {"rank": self.rank, "n": len(data)}

    @register(dispatch_mode={"dispatch_fn": _two_way_dispatch, "collect_fn": _sum_collect})
    def custom(self, x):
        return x

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def pid(self):
        return os.getpid()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def fail_on(self, rank):
        if self.rank == rank:
            raise ValueError(f"boom from rank {self.rank}")
        return self.rank

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def exit_on(self, rank):
        if self.rank == rank:
            os._exit(1)
        import time

        time.sleep(90)  # the survivor: a call that waited for it would take 90 s
        return self.rank

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def exit_on_and_finish(self, rank, seconds, marker_dir):
        """``rank`` exits; the others work ``seconds`` and then leave a ``finished.<rank>`` file (a cleanup
        step, such as stopping an engine, that must not be killed halfway)."""
        if self.rank == rank:
            os._exit(1)
        import time

        time.sleep(seconds)
        open(os.path.join(marker_dir, f"finished.{self.rank}"), "w").close()
        return self.rank

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def sleep(self, seconds, marker_dir=None, rank_seconds=None):
        import os
        import time

        seconds = (rank_seconds or {}).get(self.rank, seconds)  # a rank the test freezes sleeps long enough
        if marker_dir:  # tells the test the sleep has begun (a loaded machine may start it late)
            open(os.path.join(marker_dir, f"sleeping.{self.rank}"), "w").close()
        # in 10 ms steps: a process stopped (SIGSTOP) and continued later still has its remaining sleep ahead, so a
        # stack dump taken after SIGCONT finds it here (one time.sleep would return at once, its deadline passed)
        for _ in range(max(1, round(seconds / 0.01))):
            time.sleep(0.01)
        return self.rank

    # mesh-aware: ranks form tensor-parallel pairs; only the first rank of each pair is collected
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def setup_mesh(self, tp_size):
        self._register_dispatch_collect_info("tp", dp_rank=self.rank // tp_size, is_collect=self.rank % tp_size == 0)

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn("tp"))
    def mesh_double(self, data: DataProto) -> DataProto:
        return DataProto.from_dict(tensors={"x": data.batch["x"] * 2, "rank": torch.full((len(data),), self.rank)})

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def all_reduce(self, value):
        import torch.distributed as dist

        self.init_process_group()
        t = torch.tensor([float(value) * (self.rank + 1)])
        dist.all_reduce(t)
        return t.item()


class CriticLikeWorker(Worker):
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def pid(self):
        return os.getpid()

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def values(self, data: DataProto) -> DataProto:
        return DataProto.from_dict(tensors={"v": data.batch["x"] + 100})


class HangWorker(EchoWorker):
    """Ways to get stuck, for the watchdog tests."""

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def join_process_group(self):
        self.init_process_group()
        return self.rank

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def all_reduce_only_on(self, rank):
        """``rank`` enters an all_reduce that no other rank joins: a deadlocked collective."""
        import torch.distributed as dist

        if self.rank != rank:
            return self.rank
        t = torch.ones(1)
        dist.all_reduce(t)
        return t.item()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def work(self, steps, step_s, report):
        import time

        for _ in range(steps):
            time.sleep(step_s)
            if report:
                self.report_progress()
        return self.rank

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, blocking=False)
    def sleep_later(self, seconds):
        import time

        time.sleep(seconds)
        return self.rank


class SlowInitWorker(Worker):
    """Rank 1 never finishes starting (like a rank waiting for a peer in init_process_group)."""

    def __init__(self):
        super().__init__()
        if self.rank == 1:
            import time

            time.sleep(120)


class RendezvousWorker(Worker):
    """Reports where it met its peers: the store's port, whether its process listens there."""

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def meet(self):
        import os

        import psutil
        import torch.distributed as dist

        self.init_process_group()
        t = torch.ones(1)
        dist.all_reduce(t)
        port = int(os.environ["MASTER_PORT"])
        listening = any(
            c.laddr and c.laddr.port == port and c.status == psutil.CONN_LISTEN
            for c in psutil.Process().net_connections(kind="tcp")
        )
        return {"sum": t.item(), "port": port, "listens": listening, "id": os.environ.get("HYBRIDFLOW_RENDEZVOUS_ID")}
