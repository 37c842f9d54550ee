"""What one-rank mixed precision launches per micro-batch: FSDP2 on a one-rank mesh vs ``ComputeWeights``.

On one GPU the actor update was bound by the host launching kernels (docs/measurements.md, the H100 profile
of 2026-11-27: the GPU busy 15 % of a micro-batch's wall time). This counts the kernels one training
micro-batch (forward, log-prob of every token, backward) dispatches in each arrangement of bf16 compute
over float32 master weights, and times them here on the CPU with a model of Qwen2.5-0.5B's 24 layers but
thin ones, so that the time is mostly the host's dispatching, not arithmetic:

- FSDP2 (before): each layer and the root ``fully_shard``-ed on a one-rank gloo mesh with
  ``MixedPrecisionPolicy(bf16, fp32)``, as the engine ran one GPU until 2026-11-29;
- ComputeWeights (now): the plain model; bf16 copies of the masters cast once per mini-batch, each
  micro-batch's bf16 gradients added into float32 sums (``hybridflow/workers/engine/precision.py``);
- bf16 model alone (floor): the model stored in bf16, no masters: what the model itself launches.

Kernels are the aten operations that reach a backend (views and allocations not counted), via a dispatch
mode; the per-mini-batch casts of ComputeWeights are spread over ``--micro`` micro-batches. Times are the
median over rounds that alternate the arrangements.

    python benchmarks/one_rank_precision.py [--quick] [--rounds N] [--micro M] [--layers L]
"""

from __future__ import annotations

import argparse
import collections
import copy
import os
import statistics
import sys
import tempfile
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from a checkout

from hybridflow.models.tiny import build_tiny_config, build_tiny_model  # noqa: E402
from hybridflow.workers.engine.precision import ComputeWeights  # noqa: E402

NOT_KERNELS = {
    "view", "t", "detach", "_unsafe_view", "expand", "transpose", "reshape", "alias", "as_strided", "split",
    "slice", "select", "unsqueeze", "squeeze", "permute", "split_with_sizes", "empty", "_reshape_alias", "unbind",
    "chunk", "narrow", "new_empty", "empty_strided", "empty_like", "_record_function_enter_new",
    "_record_function_exit",
}  # fmt: skip


class KernelCount(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops: collections.Counter = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name not in NOT_KERNELS:
            self.ops[name] += 1
        return func(*args, **(kwargs or {}))


def token_log_prob_loss(model, ids: torch.Tensor) -> torch.Tensor:
    logits = model(input_ids=ids, use_cache=False).logits
    return -torch.log_softmax(logits.float(), -1).gather(-1, ids[..., None]).mean()


def arrangements(base, micro: int):
    """name -> (model, block) where ``block()`` runs ``micro`` micro-batches' forward and backward."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    from hybridflow.workers.engine.fsdp import fully_shard_layers

    def run_micro(model, ids):
        token_log_prob_loss(model, ids).backward()

    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    sharded = fully_shard_layers(copy.deepcopy(base), mp_policy=policy)

    plain = copy.deepcopy(base)
    weights = ComputeWeights(plain, torch.bfloat16)

    floor = copy.deepcopy(base).to(torch.bfloat16)
    floor.model.rotary_emb.inv_freq = base.model.rotary_emb.inv_freq.clone()  # buffers stay float32

    def fsdp2(ids_list):
        for ids in ids_list:
            run_micro(sharded, ids)
        sharded.zero_grad(set_to_none=True)

    def compute_weights(ids_list):
        with weights.active():
            for ids in ids_list:
                run_micro(plain, ids)
        plain.zero_grad(set_to_none=True)

    def bf16_alone(ids_list):
        for ids in ids_list:
            run_micro(floor, ids)
        floor.zero_grad(set_to_none=True)

    return {
        "FSDP2 one-rank mesh (before)": fsdp2,
        "ComputeWeights (now)": compute_weights,
        "bf16 model alone (floor)": bf16_alone,
    }


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--rounds", type=int, default=None)
    p.add_argument("--micro", type=int, default=4, help="micro-batches per mini-batch (one block)")
    p.add_argument("--layers", type=int, default=None, help="decoder layers (default 24, Qwen2.5-0.5B's)")
    args = p.parse_args(argv)
    layers = args.layers or (2 if args.quick else 24)
    rounds = args.rounds or (2 if args.quick else 7)
    torch.set_num_threads(1)
    config = build_tiny_config(
        vocab_size=512, hidden_size=64, num_layers=layers, num_heads=4, num_kv_heads=2, intermediate_size=128
    )
    base = build_tiny_model(config, seed=0)
    gen = torch.Generator().manual_seed(0)
    ids_list = [torch.randint(0, 512, (2, 64), generator=gen) for _ in range(args.micro)]

    with tempfile.TemporaryDirectory(prefix="one_rank_precision_") as root:
        dist.init_process_group("gloo", init_method=f"file://{root}/pg", rank=0, world_size=1)
        try:
            blocks = arrangements(base, args.micro)
            kernels = {}
            for name, block in blocks.items():
                block(ids_list)  # warm-up (FSDP2's lazy init, first allocations)
                with KernelCount() as count:
                    block(ids_list)
                kernels[name] = count.ops
            seconds = {name: [] for name in blocks}
            for i in range(rounds):
                for name in list(blocks) if i % 2 == 0 else list(blocks)[::-1]:
                    start = time.perf_counter()
                    blocks[name](ids_list)
                    seconds[name].append(time.perf_counter() - start)
        finally:
            dist.destroy_process_group()

    before = "FSDP2 one-rank mesh (before)"
    rows = {}
    for name in blocks:
        per_micro = sum(kernels[name].values()) / args.micro
        ms = 1000 * statistics.median(seconds[name]) / args.micro
        rows[name] = dict(kernels=per_micro, ms=ms, top=kernels[name].most_common(5))
    print(
        f"\nQwen2 {layers} layers (hidden 64, vocab 512), micro-batch 2 x 64 tokens, {args.micro} micro-batches "
        f"per block, {rounds} rounds, torch {torch.__version__}, load {os.getloadavg()[0]:.1f}\n"
    )
    print(
        "| arrangement | kernels per micro-batch | vs before | ms per micro-batch (cpu) | vs before | most launched |"
    )
    print("|---|---|---|---|---|---|")
    for name, r in rows.items():
        top = ", ".join(f"{op} {n / args.micro:.0f}" for op, n in r["top"])
        print(
            f"| {name} | {r['kernels']:.0f} | {r['kernels'] / rows[before]['kernels']:.2f}x | {r['ms']:.1f} | "
            f"{r['ms'] / rows[before]['ms']:.2f}x | {top} |"
        )
    return rows


if __name__ == "__main__":
    main()
