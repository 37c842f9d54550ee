"""Dispatch overhead: a DP_COMPUTE_PROTO round trip through a 2-worker RayWorkerGroup vs bare Ray.

    python benchmarks/dispatch_overhead.py [--quick]

Rows:
  * no-op: a small DataProto (8 rows) through ``wg.echo`` (chunk -> 2 actors -> concat), p50/p99
    latency over many calls;
  * 1 / 10 / 100 MB: a DataProto of that many tensor bytes, dispatched, echoed back by each worker
    (the worker returns its chunk, so the same number of bytes comes back) and collected.
    GB/s = payload bytes / round-trip time, counting the payload ONCE (bytes leaving the driver);
    the bytes moved in both directions are twice that.

Baselines, measured in the same run, interleaved call by call with the hybridflow calls:
  * bare-proto: two plain Ray actors each handed one of the same DataProto chunks, returning it
    (same payload, same serialisation; no WorkerGroup, no concat): the WorkerGroup's own cost;
  * bare-numpy: the same chunks as plain numpy arrays (Ray's zero-copy fast path): the floor.
The ratio columns are hybridflow time / baseline time (1.00 = no overhead).

Goals (issue): no-op p50 <= 2 ms, 10 MB >= 1 GB/s, within 1.2x of bare Ray.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np
import ray
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from a checkout

from hybridflow.protocol import DataProto  # noqa: E402
from hybridflow.single_controller.base import Dispatch, Worker, register  # noqa: E402
from hybridflow.single_controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup  # noqa: E402
from hybridflow.single_controller.ray.init import init_ray  # noqa: E402

MB = 1 << 20


class EchoWorker(Worker):
    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def echo(self, data: DataProto) -> DataProto:
        return data


@ray.remote(num_cpus=0)
class BareActor:
    def echo(self, x):
        return x


def make_batch(nbytes: int, rows: int = 64) -> DataProto:
    cols = max(1, nbytes // (rows * 4))
    return DataProto.from_dict(tensors={"x": torch.randn(rows, cols)}, meta_info={"step": 0})


def payload_bytes(data: DataProto) -> int:
    return sum(t.numel() * t.element_size() for t in data.batch.values())


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def measure(calls: dict, repeats: int, warmup: int = 3) -> dict[str, np.ndarray]:
    """Seconds per call for each named callable, interleaved so drift hits all alike."""
    for _ in range(warmup):
        for fn in calls.values():
            fn()
    out = {name: [] for name in calls}
    for _ in range(repeats):
        for name, fn in calls.items():
            out[name].append(timed(fn))
    return {k: np.asarray(v) for k, v in out.items()}


def make_calls(wg, bare, data: DataProto) -> dict:
    chunks = data.chunk(2)
    arrays = [c.batch["x"].numpy() for c in chunks]

    def hybridflow_call():
        out = wg.echo(data)
        assert len(out) == len(data)

    def bare_proto():
        ray.get([a.echo.remote(c) for a, c in zip(bare, chunks)])

    def bare_numpy():
        ray.get([a.echo.remote(x) for a, x in zip(bare, arrays)])

    return {"hybridflow": hybridflow_call, "bare-proto": bare_proto, "bare-numpy": bare_numpy}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer calls and no 100 MB row (a smoke run)")
    parser.add_argument(
        "--profile",
        metavar="MB",
        type=float,
        default=None,
        help="cProfile the driver side of hybridflow calls of this size instead of the table",
    )
    parser.add_argument(
        "--torch-threads",
        type=int,
        default=1,
        help="torch intra-op threads in the driver (Ray workers run with 1); default 1, since "
        "on a small shared machine a multi-threaded torch.cat of the collect step mostly "
        "measures thread contention",
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(args.torch_threads)
    noop_calls = 50 if args.quick else 200
    sizes = [1, 10] if args.quick else [1, 10, 100]
    big_repeats = {1: 10 if args.quick else 40, 10: 5 if args.quick else 20, 100: 5}

    init_ray(num_cpus=4)
    pool = RayResourcePool(process_on_nodes=[2], use_gpu=False)
    wg = RayWorkerGroup(pool, RayClassWithInitArgs(cls=ray.remote(EchoWorker)))
    bare = [BareActor.remote() for _ in range(2)]
    ray.get([a.echo.remote(None) for a in bare])

    if args.profile is not None:
        profile(wg, make_batch(int(args.profile * MB)))
        return

    rows = []  # (label, p50s {name: s}, p99s, nbytes)
    small = DataProto.from_dict(
        tensors={"x": torch.randn(8, 16)}, non_tensors={"uid": np.array([str(i) for i in range(8)], dtype=object)}
    )
    t = measure(make_calls(wg, bare, small), noop_calls, warmup=10)
    rows.append(("no-op (8 rows)", t, None))
    for size in sizes:
        data = make_batch(size * MB)
        t = measure(make_calls(wg, bare, data), big_repeats[size])
        rows.append((f"{size} MB", t, payload_bytes(data)))

    print_table(rows, cpus=os.cpu_count(), threads=args.torch_threads)
    wg.shutdown()
    pool.release()
    ray.shutdown()


def print_table(rows, cpus, threads):
    names = ["hybridflow", "bare-proto", "bare-numpy"]
    print(
        f"\nDP_COMPUTE_PROTO round trip, 2 workers, local Ray ({cpus} CPU cores, driver torch threads {threads}); "
        "times in ms"
    )
    print("GB/s counts the payload once (driver -> workers); the same bytes also come back.\n")
    head = f"{'row':<15}" + "".join(f"{n + ' p50':>16}" for n in names) + f"{'hf p99':>9}{'hf GB/s':>9}{'np GB/s':>9}"
    head += f"{'hf/proto':>10}{'hf/numpy':>10}"
    print(head)
    print("-" * len(head))
    for label, t, nbytes in rows:
        p50 = {n: float(np.median(t[n])) for n in names}
        p99 = float(np.percentile(t["hybridflow"], 99))
        line = f"{label:<15}" + "".join(f"{p50[n] * 1e3:>16.2f}" for n in names) + f"{p99 * 1e3:>9.2f}"
        if nbytes:
            line += f"{nbytes / p50['hybridflow'] / 1e9:>9.2f}{nbytes / p50['bare-numpy'] / 1e9:>9.2f}"
        else:
            line += f"{'-':>9}{'-':>9}"
        line += f"{p50['hybridflow'] / p50['bare-proto']:>9.2f}x{p50['hybridflow'] / p50['bare-numpy']:>9.2f}x"
        print(line)
    print("\nGoals: no-op p50 <= 2 ms, 10 MB >= 1 GB/s, hybridflow within 1.2x of bare Ray.")


def profile(wg, data: DataProto, calls: int = 20):
    import cProfile
    import pstats

    for _ in range(3):
        wg.echo(data)
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        wg.echo(data)
    prof.disable()
    pstats.Stats(prof).sort_stats("cumulative").print_stats(30)


if __name__ == "__main__":
    main()
