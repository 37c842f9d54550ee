"""The single controller in one screen: a driver that calls methods on a group of workers.

    python recipes/demo_worker_group.py                       # 2 Ray workers on a local Ray (2 CPUs)
    python recipes/demo_worker_group.py --backend inprocess   # the same, 1 worker inside this process

The driver writes plain method calls; ``@register`` on the worker method says how the arguments
are split across ranks and how the answers are joined:
  * ``all_reduce``  (ONE_TO_ALL): every rank gets the same value and joins a real torch.distributed
    (gloo) all_reduce; the driver gets one answer per rank.
  * ``square``      (DP_COMPUTE_PROTO): the DataProto is chunked across ranks and the answers are
    concatenated. 5 rows do not split evenly over 2 ranks: the WorkerGroup pads to 6, and drops the
    padding row again before the driver sees the result.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from a checkout

from hybridflow.protocol import DataProto  # noqa: E402
from hybridflow.single_controller.base import ClassWithInitArgs, Dispatch, Worker, register  # noqa: E402


class DemoWorker(Worker):
    """A worker with two driver-callable methods (the role a real ActorRolloutRefWorker plays)."""

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def all_reduce(self, value: float) -> float:
        import torch.distributed as dist

        self.init_process_group(backend="gloo")  # CPU collectives, whatever devices exist
        t = torch.tensor([value * (self.rank + 1)])  # rank r contributes value * (r + 1)
        dist.all_reduce(t)  # sum over ranks
        return t.item()

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def square(self, data: DataProto) -> DataProto:
        x = data.batch["x"]  # (b,) this rank's share of the rows
        return DataProto.from_dict(
            tensors={"x_squared": x * x, "rank": torch.full_like(x, self.rank, dtype=torch.int64)},
            non_tensors={"name": data.non_tensor_batch["name"]},
        )


def build_group(backend: str):
    if backend == "inprocess":
        from hybridflow.single_controller.inprocess import InProcessWorkerGroup

        return InProcessWorkerGroup(ClassWithInitArgs(DemoWorker)), lambda: None

    import ray

    from hybridflow.single_controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup
    from hybridflow.single_controller.ray.init import init_ray

    init_ray(num_cpus=2)
    pool = RayResourcePool(process_on_nodes=[2], use_gpu=False)  # one node, 2 worker processes
    wg = RayWorkerGroup(pool, RayClassWithInitArgs(cls=ray.remote(DemoWorker)))

    def close():
        wg.shutdown()
        pool.release()
        ray.shutdown()

    return wg, close


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", choices=["ray", "inprocess"], default="ray")
    args = parser.parse_args(argv)
    t0 = time.perf_counter()
    wg, close = build_group(args.backend)
    n = wg.world_size
    print(f"backend={args.backend}: {n} worker(s) ready in {time.perf_counter() - t0:.1f}s")

    # gloo all_reduce of value * (rank + 1): every rank ends with 1.5 * (1 + 2 + ... + n)
    sums = wg.all_reduce(1.5)
    print(f"all_reduce(1.5) -> {sums}   (expected {1.5 * n * (n + 1) / 2} on every rank)")

    # 5 rows over n ranks: padded to a multiple of n for dispatch, unpadded after collect
    data = DataProto.from_dict(
        tensors={"x": torch.arange(5, dtype=torch.float32)}, non_tensors={"name": np.array(list("abcde"), dtype=object)}
    )
    out = wg.square(data)
    print(f"square(5 rows) -> {len(out)} rows")
    for name, x, y, rank in zip(
        out.non_tensor_batch["name"],
        data.batch["x"].tolist(),
        out.batch["x_squared"].tolist(),
        out.batch["rank"].tolist(),
    ):
        print(f"  {name}: {x:.0f}^2 = {y:.0f}   (computed on rank {rank})")
    assert out.batch["x_squared"].tolist() == [0.0, 1.0, 4.0, 9.0, 16.0]
    assert sums == [1.5 * n * (n + 1) / 2] * n

    close()
    print(f"done in {time.perf_counter() - t0:.1f}s")


if __name__ == "__main__":
    main()
