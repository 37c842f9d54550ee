"""DataProto operations: hybridflow's ``hybridflow.protocol.DataProto`` against veRL 0.9.1's ``verl.DataProto``.

    python benchmarks/dataproto_ops.py --verl-python /work/verl-venv/bin/python [--quick] [--repeats N] [--rounds R]

A GRPO batch of ``--rows`` (512) rows x ``--seq`` (1024) tokens: input_ids / attention_mask /
position_ids int64 [rows, seq], prompts / responses / response_mask int64 and old_log_probs /
advantages float32 [rows, seq / 2], non_tensor_batch uid / data_source (str) and reward_model
(dict) object arrays, a small meta_info. Each op does the whole work a caller needs:

  concat          DataProto.concat of 8 chunks (what the driver does with the ranks' answers)
  chunk           data.chunk(8)                (what it does before dispatching)
  split           data.split(64)
  select          data.select(4 batch keys, ["uid"])
  union           a.union(b), b unpickled as a worker's answer arrives: disjoint batch keys, a shared
                  uid column and meta_info key (equal values, compared)
  index (tensor)  data[perm], a torch permutation of the rows (balance_batch's reorder)
  index (slice)   data[100:400]
  repeat          a 64-row prompt batch .repeat(8, interleave=True)
  pickle          loads(dumps(data)) at protocol 5 with out-of-band buffers, as Ray ships it: the
                  buffers are copied into read-only bytes (the object store) before loading
  pickle in-band  loads(dumps(data)) at protocol 5 (save_to_disk, plain pickling)

Each side runs in its own interpreter (this script re-invoked with ``--side``; veRL's through
``--verl-python``, where veRL is installed), with torch at 1 thread, ``--rounds`` times alternately
so that the machine's load drifts over both alike. A side's time for an op is the best thread CPU
time of all its calls (time.thread_time: the op's own work, page faults included, not the time it
waited for a core on a shared machine); the median wall time is printed beside. Before timing,
both sides run every op on a small batch and their results (tensors, object columns, meta_info)
must be equal: the two sides do the same work.

Goal (issue 33): geometric mean of hybridflow / veRL over the ops <= 0.7 (CPU time).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import pickle
import subprocess
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SELECT_KEYS = ["input_ids", "attention_mask", "position_ids", "responses"]


def make_batch(DataProto, rows: int, seq: int, seed: int = 0):
    """The same GRPO-shaped batch on either side (same torch version, same seed)."""
    g = torch.Generator().manual_seed(seed)
    half = seq // 2
    ids = torch.randint(0, 32000, (rows, seq), generator=g)
    mask = (torch.rand(rows, seq, generator=g) > 0.1).long()
    tensors = {
        "input_ids": ids,
        "attention_mask": mask,
        "position_ids": torch.clamp(mask.cumsum(-1) - 1, min=0),
        "prompts": ids[:, :half].clone(),
        "responses": ids[:, half:].clone(),
        "response_mask": mask[:, half:].clone(),
        "old_log_probs": torch.randn(rows, half, generator=g),
        "advantages": torch.randn(rows, half, generator=g),
    }
    non_tensors = {
        "uid": np.array([f"uid-{i // 8}" for i in range(rows)], dtype=object),
        "data_source": np.array(["openai/gsm8k"] * rows, dtype=object),
        "reward_model": np.array([{"style": "rule", "ground_truth": str(i)} for i in range(rows)], dtype=object),
    }
    meta = {"temperature": 1.0, "global_steps": 3, "eos_token_id": 2}
    return DataProto.from_dict(tensors=tensors, non_tensors=non_tensors, meta_info=meta)


def ray_like_round_trip(data):
    buffers = []
    payload = pickle.dumps(data, protocol=5, buffer_callback=buffers.append)
    stored = [memoryview(bytes(b.raw())) for b in buffers]  # the object store's read-only copy
    return pickle.loads(payload, buffers=stored)


def operations(DataProto, data):
    """{name: (setup() -> args, op(*args) -> result)}; setup runs outside the timer."""
    chunks = data.chunk(8)
    perm = torch.randperm(len(data), generator=torch.Generator().manual_seed(1))
    prompts = data.select(batch_keys=["input_ids", "attention_mask", "position_ids"])[: max(1, len(data) // 8)]
    a_keys, b_keys = ["input_ids", "attention_mask", "position_ids", "prompts"], ["responses", "old_log_probs"]

    def union_setup():
        a = data.select(batch_keys=a_keys, non_tensor_batch_keys=["uid", "data_source"])
        b = data.select(batch_keys=b_keys, non_tensor_batch_keys=["uid"], meta_info_keys=["temperature"])
        return a, pickle.loads(pickle.dumps(b))  # b as a worker's answer arrives: equal values, new objects

    return {
        "concat": (lambda: (chunks,), DataProto.concat),
        "chunk": (lambda: (), lambda: data.chunk(8)),
        "split": (lambda: (), lambda: data.split(max(1, len(data) // 8))),
        "select": (lambda: (), lambda: data.select(batch_keys=SELECT_KEYS, non_tensor_batch_keys=["uid"])),
        "union": (union_setup, lambda a, b: a.union(b)),
        "index (tensor)": (lambda: (), lambda: data[perm]),
        "index (slice)": (lambda: (), lambda: data[len(data) // 5 : len(data) * 4 // 5]),
        "repeat": (lambda: (), lambda: prompts.repeat(8, interleave=True)),
        "pickle": (lambda: (), lambda: ray_like_round_trip(data)),
        "pickle in-band": (lambda: (), lambda: pickle.loads(pickle.dumps(data, protocol=5))),
    }


def fingerprint(result) -> str:
    """A digest of what a result holds (tensors' dtype, shape and bytes; object columns; meta_info)."""
    h = hashlib.sha256()
    for part in result if isinstance(result, list) else [result]:
        h.update(f"len={len(part)}".encode())
        for key in sorted(part.batch.keys()) if part.batch is not None else []:
            t = part.batch[key].contiguous()
            h.update(f"{key}:{t.dtype}:{tuple(t.shape)}".encode() + t.numpy().tobytes())
        for key in sorted(part.non_tensor_batch):
            h.update(f"{key}:{part.non_tensor_batch[key].tolist()!r}".encode())
        h.update(repr(sorted(part.meta_info.items())).encode())
    return h.hexdigest()


def run_side(side: str, rows: int, seq: int, repeats: int) -> dict:
    """Time every op on one side; also fingerprint every op's result on a small batch."""
    torch.set_num_threads(1)
    if side == "verl":
        from verl import DataProto
    else:
        sys.path.insert(0, REPO_ROOT)
        from hybridflow.protocol import DataProto
    small = make_batch(DataProto, 16, 8)
    prints = {}
    for name, (setup, op) in operations(DataProto, small).items():
        prints[name] = fingerprint(op(*setup()))
    data = make_batch(DataProto, rows, seq)
    times = {}
    for name, (setup, op) in operations(DataProto, data).items():
        calls = []
        for i in range(repeats + 2):  # two warm-up calls
            args = setup()
            t0, c0 = time.perf_counter(), time.thread_time()
            result = op(*args)
            elapsed = (time.thread_time() - c0, time.perf_counter() - t0)
            del result, args
            if i >= 2:
                calls.append(elapsed)
        times[name] = calls
    return {"times": times, "prints": prints}


def call_side(python: str, side: str, args) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    cmd = [python, os.path.abspath(__file__), "--side", side, "--rows", str(args.rows), "--seq", str(args.seq)]
    proc = subprocess.run(
        [*cmd, "--repeats", str(args.repeats)], capture_output=True, text=True, env=env, cwd=REPO_ROOT, check=False
    )
    if proc.returncode != 0:
        raise RuntimeError(f"{side} side failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--verl-python", default="/work/verl-venv/bin/python", help="an interpreter with verl 0.9.1")
    parser.add_argument("--rows", type=int, default=512)
    parser.add_argument("--seq", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=10, help="timed calls per op and round")
    parser.add_argument("--rounds", type=int, default=2, help="alternating runs of each side")
    parser.add_argument("--quick", action="store_true", help="64 rows x 128 tokens, 3 calls, 1 round")
    parser.add_argument("--side", choices=["hybridflow", "verl"], help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.quick:
        args.rows, args.seq, args.repeats, args.rounds = 64, 128, 3, 1
    if args.side:
        print(json.dumps(run_side(args.side, args.rows, args.seq, args.repeats)))
        return

    pythons = {"hybridflow": sys.executable, "verl": args.verl_python}
    runs = {side: [] for side in pythons}
    for _ in range(args.rounds):
        for side, python in pythons.items():
            runs[side].append(call_side(python, side, args))
    prints = {side: r[0]["prints"] for side, r in runs.items()}
    differ = [op for op in prints["hybridflow"] if prints["hybridflow"][op] != prints["verl"].get(op)]
    if differ:
        raise SystemExit(f"hybridflow and veRL results differ on the small batch for: {differ}")
    times = {side: {op: sum((r["times"][op] for r in rs), []) for op in rs[0]["times"]} for side, rs in runs.items()}
    print_table(times, args)


def print_table(times: dict, args):
    print(
        f"\nDataProto ops, {args.rows} rows x {args.seq} tokens, torch 1 thread, {args.repeats} calls x {args.rounds} "
        f"rounds per side ({os.cpu_count()} CPU cores); results equal on a 16-row batch; ms\n"
    )
    head = f"{'op':<16}{'hf CPU':>10}{'veRL CPU':>10}{'ratio':>8}{'hf wall':>10}{'veRL wall':>10}{'ratio':>8}"
    print(f"{'':<16}{'best thread CPU time':^28}{'median wall time':^28}\n{head}")
    print("-" * len(head))
    cpu, wall = [], []
    for op in times["hybridflow"]:
        hf, vl = np.asarray(times["hybridflow"][op]) * 1e3, np.asarray(times["verl"][op]) * 1e3
        hf_c, vl_c, hf_w, vl_w = hf[:, 0].min(), vl[:, 0].min(), np.median(hf[:, 1]), np.median(vl[:, 1])
        cpu.append(hf_c / vl_c)
        wall.append(hf_w / vl_w)
        print(f"{op:<16}{hf_c:>10.3f}{vl_c:>10.3f}{cpu[-1]:>7.2f}x{hf_w:>10.3f}{vl_w:>10.3f}{wall[-1]:>7.2f}x")
    gm_cpu, gm_wall = (math.exp(np.mean(np.log(r))) for r in (cpu, wall))
    print(f"\ngeometric mean hybridflow / veRL: {gm_cpu:.2f}x (CPU time), {gm_wall:.2f}x (wall time)")
    print(f"goal <= 0.70x (CPU time) -> {'meets' if gm_cpu <= 0.7 else 'MISSES'} the goal")


if __name__ == "__main__":
    main()
