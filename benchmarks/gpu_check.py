"""The one-GPU check: a Qwen2 of Qwen2.5-0.5B's shapes through hybridflow's own code path on one device.

A random-weight model (no download) is saved with the tiny character tokenizer, and one in-process
``ActorRolloutRefWorker`` (role actor_rollout on a one-rank NCCL group: the actor computes in bf16 over
float32 master weights, ``ComputeWeights``; hf rollout) runs it, as ``trainer.backend=inprocess`` would.
Each row has a baseline measured in the same run:

- matmul peak: bf16 ``torch.mm`` of 8192 x 8192 matrices, the denominator of MFU;
- actor update: ``update_actor`` through the WorkerGroup (one optimizer step per call), tokens/s and
  MFU = 6 x params x tokens/s / matmul peak (attention's own FLOPs are not counted); goal >= 35 %; then
  the same updates with micro-batches packed up to a token budget of 24 rows (``use_dynamic_bsz``), the
  setting veRL's tuning guide advises; and the first row's updates again with the model on a one-rank
  FSDP2 mesh with FSDP2's mixed precision (the engine's arrangement on one GPU until 2026-11-29);
- hf rollout: ``generate_sequences`` through the WorkerGroup vs ``model.generate`` on a bf16 copy, same
  prompts and number of new tokens (ignore_eos), calls interleaved; goal >= 0.9x;
- memory: peak allocated during the updates vs fp32 weights + grads + AdamW's state (read from the
  optimizer), the rollout's bf16 copy shown beside it.

    python benchmarks/gpu_check.py [--device cuda|cpu] [--quick] [--out DIR] [--profile]

``--profile`` skips the rollout and asks where one update's time goes instead (``_gpu_profile.py``): a phase
breakdown (forward with the log-prob over the vocabulary, backward, optimizer step, other), ``torch.profiler``'s
top ops, the vocabulary's share, and the update again at other micro-batch sizes and with gradient
checkpointing; results in ``gpu_profile.md`` / ``gpu_profile.json``.

``--device cpu --quick`` runs a tiny model through the same steps, so the pipeline is checked where there
is no GPU (its numbers mean nothing). Results also go to ``--out`` (default ``$OUT``) as JSON and markdown.
benchmarks/gpu_check.sh runs this and ``pytest -m gpu`` on a machine that has only torch and transformers.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
for _path in (os.path.dirname(HERE), HERE):  # run from a checkout: hybridflow, then _gpu_profile
    if _path not in sys.path:
        sys.path.insert(0, _path)

MFU_GOAL, ROLLOUT_GOAL = 0.35, 0.9
SHAPES = {  # Qwen2.5-0.5B's (494M parameters, tied embeddings); tiny: plumbing only
    "qwen2.5-0.5b": dict(
        hidden_size=896, num_layers=24, num_heads=14, num_kv_heads=2, intermediate_size=4864, vocab_size=151936
    ),
    "tiny": dict(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=128, vocab_size=None),
}
# rows x (prompt + response) tokens per update, micro-batch rows; rollout prompts x new tokens
WORKLOADS = {
    "full": dict(
        rows=64,
        prompt=256,
        response=768,
        micro=8,
        budget_rows=24,
        updates=3,
        gen_prompts=64,
        gen_prompt=128,
        gen_tokens=256,
        repeats=3,
        matmul=8192,
    ),
    "quick": dict(
        rows=4,
        prompt=8,
        response=8,
        micro=2,
        budget_rows=3,
        updates=1,
        gen_prompts=4,
        gen_prompt=8,
        gen_tokens=8,
        repeats=1,
        matmul=256,
    ),
}


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def matmul_peak(device: str, n: int, dtype: torch.dtype, iters: int = 50) -> float:
    """FLOP/s of ``torch.mm`` on random n x n matrices: 10 warm-ups (the clocks rise), then the mean of
    ``iters``. Measured before and after the workload; MFU divides by the higher of the two."""
    a, b = (torch.randn(n, n, device=device, dtype=dtype) for _ in range(2))
    c = torch.empty_like(a)
    for _ in range(10):
        torch.mm(a, b, out=c)
    sync(device)
    start = time.perf_counter()
    for _ in range(iters):
        torch.mm(a, b, out=c)
    sync(device)
    return 2 * n**3 * iters / (time.perf_counter() - start)


def save_model(out_dir: str, shape: str, max_len: int) -> str:
    """A random-init Qwen2 of ``shape`` plus the tiny character tokenizer, as a Hugging Face directory."""
    from hybridflow.models.tiny import build_tiny_config, build_tiny_model, build_tiny_tokenizer

    dims = dict(SHAPES[shape])
    tokenizer = build_tiny_tokenizer(model_max_length=max_len)
    config = build_tiny_config(
        vocab_size=dims.pop("vocab_size") or len(tokenizer),
        max_position_embeddings=max_len,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        **dims,
    )
    build_tiny_model(config, seed=0).save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    return out_dir


def worker_section(model_dir: str, w: dict) -> dict:
    """The ``actor_rollout_ref`` section: one optimizer step per update call, no KL or entropy term,
    padded forwards (rows are full: no padding to remove), sampling at temperature 1 with ignore_eos.
    free_cache_engine off: the rollout's sleep/wake is the hybrid engine's phase switch, not generation."""
    from omegaconf import OmegaConf

    from hybridflow.config.loader import load_config

    cfg = load_config(
        "ppo_trainer",
        [
            f"actor_rollout_ref.model.path={model_dir}",
            "actor_rollout_ref.model.use_remove_padding=False",
            "actor_rollout_ref.model.enable_gradient_checkpointing=False",
            f"data.max_prompt_length={max(w['prompt'], w['gen_prompt'])}",
            f"data.max_response_length={w['gen_tokens']}",
            f"actor_rollout_ref.actor.ppo_mini_batch_size={w['rows']}",
            f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={w['micro']}",
            "actor_rollout_ref.actor.optim.lr=1e-6",
            "actor_rollout_ref.actor.use_kl_loss=False",
            "actor_rollout_ref.actor.entropy_coeff=0",
            "actor_rollout_ref.rollout.name=hf",
            "actor_rollout_ref.rollout.n=1",
            f"actor_rollout_ref.rollout.max_num_seqs={w['gen_prompts']}",
            "actor_rollout_ref.rollout.free_cache_engine=False",
            "actor_rollout_ref.rollout.temperature=1.0",
            "actor_rollout_ref.rollout.top_k=-1",
            "actor_rollout_ref.rollout.top_p=1.0",
            "actor_rollout_ref.rollout.do_sample=True",
            "actor_rollout_ref.rollout.ignore_eos=True",
            f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={w['micro']}",
        ],
    )
    return OmegaConf.to_container(cfg.actor_rollout_ref, resolve=True)


def update_batch(rows: int, prompt: int, response: int, vocab: int):
    """Full rows (no padding) of random tokens with random advantages: every position trains."""
    from hybridflow.protocol import DataProto

    gen = torch.Generator().manual_seed(0)
    input_ids = torch.randint(4, vocab, (rows, prompt + response), generator=gen)
    ones = torch.ones_like(input_ids)
    return DataProto.from_dict(
        tensors={
            "input_ids": input_ids,
            "attention_mask": ones,
            "position_ids": ones.cumsum(-1) - 1,
            "responses": input_ids[:, prompt:],
            "response_mask": ones[:, prompt:],
            "old_log_probs": -torch.rand(rows, response, generator=gen) * 3,
            "advantages": torch.randn(rows, response, generator=gen),
        },
        meta_info={"temperature": 1.0},
    )


def prompt_batch(count: int, length: int, vocab: int, pad_id: int):
    """Left-padded prompts of random characters, lengths between half and all of ``length``."""
    from hybridflow.protocol import DataProto

    gen = torch.Generator().manual_seed(1)
    lens = torch.randint(length // 2, length + 1, (count,), generator=gen)
    mask = (torch.arange(length) >= length - lens[:, None]).long()
    ids = torch.randint(4, vocab, (count, length), generator=gen) * mask + pad_id * (1 - mask)
    return DataProto.from_dict(
        tensors={"input_ids": ids, "attention_mask": mask, "position_ids": (mask.cumsum(-1) - 1).clamp(min=0)}
    )


def worst(metric) -> float:
    """The slowest rank's value of a worker timing (one list per rank after the collect)."""
    from hybridflow.trainer.ppo.metric_utils import flat_metric_values

    return max(float(v) for v in flat_metric_values(metric))


def median(values: list[float]) -> float:
    return sorted(values)[len(values) // 2]


def tensor_bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def run(args, r: dict) -> dict:
    """Fills ``r`` as it goes (what was measured survives a failure further on)."""
    import transformers
    from transformers import AutoModelForCausalLM

    from hybridflow.single_controller.base import ClassWithInitArgs
    from hybridflow.single_controller.inprocess import InProcessWorkerGroup
    from hybridflow.workers.fsdp_workers import ActorRolloutRefWorker

    device, w = args.device, WORKLOADS["quick" if args.quick else "full"]
    shape = "tiny" if args.quick else "qwen2.5-0.5b"
    cuda = device == "cuda"
    dtype = torch.bfloat16 if cuda else torch.float32
    r.update(
        device=torch.cuda.get_device_name() if cuda else f"cpu ({os.cpu_count()} cores)",
        device_kind=device,
        shape=shape,
        torch=torch.__version__,
        transformers=transformers.__version__,
        workload=w,
    )
    r["matmul_flops_before"] = matmul_peak(device, w["matmul"], dtype)
    print(f"{r['device']}: {dtype} torch.mm {w['matmul']}^3: {r['matmul_flops_before'] / 1e12:.1f} TFLOP/s", flush=True)

    os.environ["HYBRIDFLOW_DEVICE"] = device
    with tempfile.TemporaryDirectory(prefix="gpu_check_") as root:
        start = time.perf_counter()
        model_dir = save_model(os.path.join(root, "model"), shape, max_len=2 * (w["prompt"] + w["response"]))
        section = worker_section(model_dir, w)
        wg = InProcessWorkerGroup(ClassWithInitArgs(ActorRolloutRefWorker, config=section, role="actor_rollout"))
        try:
            wg.init_model()
            worker = wg.workers[0]
            engine = worker.actor_engine
            params = list(engine.module.parameters())
            r["params"] = sum(p.numel() for p in params)
            r["sharded"] = bool(engine.sharded)
            r["compute_weights"] = engine.precision.casts
            r["compute_dtype"] = str(engine.spec.param_dtype or params[0].dtype)
            r["setup_s"] = time.perf_counter() - start
            print(
                f"model {shape}: {r['params'] / 1e6:.1f}M parameters; actor FSDP2={r['sharded']}, "
                f"compute {r['compute_dtype']}, master {params[0].dtype}; set up in {r['setup_s']:.1f} s",
                flush=True,
            )
            vocab = worker.hf_config.vocab_size
            data = update_batch(w["rows"], w["prompt"], w["response"], vocab)
            if args.profile:
                from _gpu_profile import profile_update_actor
                from _gpu_profile_report import print_section

                compile_levers = args.compile_levers == "on" or (args.compile_levers == "auto" and cuda)
                profile_update_actor(
                    wg, worker, data, w, device, r, report=print_section, compile_levers=compile_levers
                )
                return finish(r, device, w, dtype)
            r.update(time_updates(wg, data, w, device))
            r["budget_tokens"] = w["budget_rows"] * (w["prompt"] + w["response"])
            r["budget_update"] = time_budget_updates(wg, worker, data, w, device, r["budget_tokens"])
            r["fsdp2_update"] = time_fsdp2_updates(worker, model_dir, data, w, device)
            r["state_bytes"] = 2 * tensor_bytes(params) + tensor_bytes(
                t for s in engine.optimizer.state.values() for t in s.values() if torch.is_tensor(t)
            )
            r["rollout_copy_bytes"] = tensor_bytes(worker.rollout_host.server.module.parameters())
            print(
                f"memory: peak {r.get('peak_allocated_bytes', 0) / 2**30:.2f} GiB allocated during the updates; "
                f"weights + grads + AdamW {r['state_bytes'] / 2**30:.2f} GiB, "
                f"rollout copy {r['rollout_copy_bytes'] / 2**30:.2f} GiB",
                flush=True,
            )

            prompts = prompt_batch(
                w["gen_prompts"], w["gen_prompt"], len(worker.tokenizer), worker.tokenizer.pad_token_id
            )
            baseline = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).to(device).eval()
            r.update(time_rollout(wg, baseline, prompts, w, device, worker.tokenizer.pad_token_id))
        finally:
            wg.shutdown()
    finish(r, device, w, dtype)
    r["rollout_ratio"] = r["rollout_tokens_per_s"] / r["generate_tokens_per_s"]
    return r


def finish(r: dict, device: str, w: dict, dtype: torch.dtype) -> dict:
    """The matmul peak again after the workload, and the MFU against the higher of the two."""
    r["matmul_flops_after"] = matmul_peak(device, w["matmul"], dtype)
    r["matmul_flops"] = max(r["matmul_flops_before"], r["matmul_flops_after"])
    r["mfu"] = 6 * r["params"] * r["update_tokens_per_s"] / r["matmul_flops"]
    if "update_tokens_per_s" in r.get("budget_update", {}):
        r["budget_mfu"] = 6 * r["params"] * r["budget_update"]["update_tokens_per_s"] / r["matmul_flops"]
    return r


def time_updates(wg, data, w: dict, device: str) -> dict:
    """One warm-up update, then ``updates`` timed ones (the driver's wall time, dispatch included);
    the peak memory is taken over the timed ones."""
    tokens = int(data.batch["attention_mask"].sum())
    wg.update_actor(data)
    sync(device)
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    seconds, worker_s = [], []
    for _ in range(w["updates"]):
        start = time.perf_counter()
        out = wg.update_actor(data)
        sync(device)
        seconds.append(time.perf_counter() - start)
        worker_s.append(worst(out.meta_info["metrics"]["timing_s/worker_update_actor"]))
    out = {
        "update_tokens": tokens,
        "update_s": median(seconds),
        "update_worker_s": median(worker_s),
        "update_tokens_per_s": tokens / median(seconds),
        "update_calls_s": seconds,
    }
    if device == "cuda":
        out["peak_allocated_bytes"] = torch.cuda.max_memory_allocated()
        out["peak_reserved_bytes"] = torch.cuda.max_memory_reserved()
    print(
        f"actor update: {tokens} tokens in {out['update_s']:.3f} s (median of {w['updates']}), "
        f"{out['update_tokens_per_s']:.0f} tokens/s",
        flush=True,
    )
    return out


def time_budget_updates(wg, worker, data, w: dict, device: str, budget: int) -> dict:
    """The same updates with micro-batches packed up to ``budget`` tokens (``use_dynamic_bsz`` with
    ``ppo_max_token_len_per_gpu``, as veRL's tuning guide advises) instead of a fixed row count."""
    from _gpu_profile import short_error, variant_applied

    try:
        with variant_applied(worker, dict(tokens=budget)):
            out = time_updates(wg, data, w, device)
    except Exception as exc:  # noqa: BLE001 - out of memory on a smaller card: the rest of the check goes on
        out = {"error": short_error(exc)}
        if device == "cuda":
            torch.cuda.empty_cache()
    print(f"  (the updates above: micro-batches of up to {budget} tokens, dynamic batch)", flush=True)
    return out


def time_fsdp2_updates(worker, model_dir: str, data, w: dict, device: str) -> dict:
    """The baseline of the actor update's arrangement: the same updates (same actor code, config and data)
    with the model on a one-rank FSDP2 mesh with FSDP2's mixed precision, as the engine ran it on one GPU
    before ``ComputeWeights`` (bf16 compute over float32 masters without a mesh). Measured after the worker's
    updates, in the same process, from a fresh copy of the same weights; freed after."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    from hybridflow.workers.actor.dp_actor import DataParallelPPOActor
    from hybridflow.workers.engine.fsdp import fully_shard_layers
    from hybridflow.workers.engine.optim import build_optimizer
    from hybridflow.workers.model_loading import load_model
    from hybridflow.workers.utils.device import on_device

    spec = worker.actor_engine.spec
    module = load_model(model_dir, "causal_lm").to(device)
    fully_shard_layers(
        module, mp_policy=MixedPrecisionPolicy(param_dtype=spec.param_dtype, reduce_dtype=spec.reduce_dtype)
    )
    actor = DataParallelPPOActor(worker.actor.config, module, build_optimizer(module.parameters(), lr=1e-6))
    batch = on_device(data, device)
    tokens = int(data.batch["attention_mask"].sum())
    actor.update_policy(batch)
    sync(device)
    seconds = []
    for _ in range(w["updates"]):
        start = time.perf_counter()
        actor.update_policy(batch)
        sync(device)
        seconds.append(time.perf_counter() - start)
    del actor, module, batch
    if device == "cuda":
        torch.cuda.empty_cache()
    out = {"update_s": median(seconds), "update_tokens_per_s": tokens / median(seconds), "update_calls_s": seconds}
    print(
        f"actor update on a one-rank FSDP2 mesh (the arrangement before): {out['update_s']:.3f} s, "
        f"{out['update_tokens_per_s']:.0f} tokens/s",
        flush=True,
    )
    return out


def time_rollout(wg, model, prompts, w: dict, device: str, pad_id: int) -> dict:
    """``generate_sequences`` through the WorkerGroup vs ``model.generate``, interleaved (alternating which
    goes first) after one warm-up each; the first WorkerGroup call also pushes the trained weights."""
    ids = prompts.batch["input_ids"].to(device)
    mask = prompts.batch["attention_mask"].to(device)
    n = w["gen_tokens"]

    worker_s = []

    def through_worker() -> int:
        out = wg.generate_sequences(prompts)
        worker_s.append(worst(out.meta_info["metrics"]["timing_s/generate_sequences"]))
        return int(out.batch["attention_mask"][:, -n:].sum())

    def raw_generate() -> int:
        with torch.no_grad():
            out = model.generate(
                input_ids=ids,
                attention_mask=mask,
                max_new_tokens=n,
                min_new_tokens=n,
                do_sample=True,
                temperature=1.0,
                top_k=0,
                top_p=1.0,
                pad_token_id=pad_id,
                num_beams=1,
                use_cache=True,
            )
        sync(device)
        return int(out[:, ids.size(1) :].numel())

    calls = {"hf rollout": through_worker, "generate": raw_generate}
    warm = wg.generate_sequences(prompts)
    sync_s = worst(warm.meta_info["metrics"]["timing_s/update_weights"])
    raw_generate()
    seconds, produced = {k: [] for k in calls}, {}
    for i in range(w["repeats"]):
        for name in list(calls) if i % 2 == 0 else list(calls)[::-1]:
            start = time.perf_counter()
            produced[name] = calls[name]()
            seconds[name].append(time.perf_counter() - start)
    out = {
        "weight_sync_s": sync_s,
        "rollout_tokens": produced["hf rollout"],
        "generate_tokens": produced["generate"],
        "rollout_s": median(seconds["hf rollout"]),
        "generate_s": median(seconds["generate"]),
        "rollout_worker_s": median(worker_s),
        "rollout_calls_s": seconds["hf rollout"],
        "generate_calls_s": seconds["generate"],
    }
    out["rollout_tokens_per_s"] = out["rollout_tokens"] / out["rollout_s"]
    out["generate_tokens_per_s"] = out["generate_tokens"] / out["generate_s"]
    return out


def markdown(r: dict) -> str:
    gib = 2**30
    w, b = r["workload"], r["budget_update"]
    lines = [
        f"**{r['device']}**, torch {r['torch']}, transformers {r['transformers']}; Qwen2 {r['shape']} shapes, "
        f"{r['params'] / 1e6:.1f}M parameters (random weights); actor FSDP2 {r['sharded']}, "
        f"compute {r['compute_dtype']}",
        "",
        "| what | measured | baseline (same run) | ratio | goal |",
        "|---|---|---|---|---|",
        f"| matmul peak | {r['matmul_flops'] / 1e12:.1f} TFLOP/s | torch.mm {w['matmul']}^3, before / after: "
        f"{r['matmul_flops_before'] / 1e12:.1f} / {r['matmul_flops_after'] / 1e12:.1f} | - | - |",
        f"| actor update ({w['rows']} x {w['prompt'] + w['response']} tokens, micro-batch {w['micro']}) | "
        f"{r['update_tokens_per_s']:.0f} tokens/s, {6 * r['params'] * r['update_tokens_per_s'] / 1e12:.1f} TFLOP/s "
        f"({r['update_s']:.2f} s/update) | matmul peak | MFU {100 * r['mfu']:.1f} % | >= {100 * MFU_GOAL:.0f} % |",
        f"| actor update, dynamic batch (token budget {r['budget_tokens']}) | "
        + (
            f"{b['error']} | | | |"
            if "error" in b
            else f"{b['update_tokens_per_s']:.0f} tokens/s, "
            f"{6 * r['params'] * b['update_tokens_per_s'] / 1e12:.1f} TFLOP/s ({b['update_s']:.2f} s/update) | "
            f"matmul peak | MFU {100 * r['budget_mfu']:.1f} % | >= {100 * MFU_GOAL:.0f} % |"
        ),
        f"| actor update, micro-batch {w['micro']}, on a one-rank FSDP2 mesh (before) | "
        f"{r['fsdp2_update']['update_tokens_per_s']:.0f} tokens/s ({r['fsdp2_update']['update_s']:.2f} s/update) | "
        f"the first row (one rank: {'bf16 ComputeWeights' if r['compute_weights'] else 'no cast'}) | "
        f"first row {r['update_tokens_per_s'] / r['fsdp2_update']['update_tokens_per_s']:.2f}x | reported |",
        f"| hf rollout ({w['gen_prompts']} prompts x {w['gen_tokens']} new tokens) | "
        f"{r['rollout_tokens_per_s']:.0f} tokens/s | generate {r['generate_tokens_per_s']:.0f} tokens/s | "
        f"{r['rollout_ratio']:.2f}x | >= {ROLLOUT_GOAL}x |",
    ]
    if "peak_allocated_bytes" in r:  # CUDA only
        lines += [
            f"| peak memory, update | {r['peak_allocated_bytes'] / gib:.2f} GiB allocated "
            f"({r['peak_reserved_bytes'] / gib:.2f} reserved) | "
            f"weights + grads + AdamW {r['state_bytes'] / gib:.2f} GiB "
            f"(+ rollout copy {r['rollout_copy_bytes'] / gib:.2f} GiB) | "
            f"{r['peak_allocated_bytes'] / r['state_bytes']:.2f}x | reported |"
        ]
    if "peak_allocated_bytes" in b:
        lines.append(
            f"| peak memory, dynamic batch | {b['peak_allocated_bytes'] / gib:.2f} GiB allocated "
            f"({b['peak_reserved_bytes'] / gib:.2f} reserved) | weights + grads + AdamW | "
            f"{b['peak_allocated_bytes'] / r['state_bytes']:.2f}x | reported |"
        )
    lines += [
        "",
        f"weight push into the rollout after an update: {r['weight_sync_s']:.3f} s; set-up {r['setup_s']:.1f} s",
    ]
    return "\n".join(lines)


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=["cuda", "cpu"])
    p.add_argument("--quick", action="store_true", help="tiny model and workload (pipeline check)")
    p.add_argument("--out", default=os.environ.get("OUT"), help="folder for gpu_check.json and gpu_check.md")
    p.add_argument(
        "--profile", action="store_true", help="no rollout: where one update's time goes (gpu_profile.md/.json)"
    )
    p.add_argument(
        "--compile-levers",
        default="auto",
        choices=["auto", "on", "off"],
        help="--profile: try the torch.compile levers (auto: on a GPU only; compiling takes minutes on a CPU)",
    )
    args = p.parse_args(argv)
    name = "gpu_profile" if args.profile else "gpu_check"
    r: dict = {}
    try:
        run(args, r)
    except BaseException:
        if args.out:  # what was measured before the failure
            os.makedirs(args.out, exist_ok=True)
            with open(os.path.join(args.out, f"{name}.json"), "w") as f:
                json.dump(dict(r, failed=True), f, indent=1, default=str)
        raise
    if args.profile:
        from _gpu_profile_report import markdown as profile_markdown

        table = profile_markdown(r)
        print("\n" + table + "\n")
        save(args.out, name, r, table)
        return r
    table = markdown(r)
    print("\n" + table + "\n")
    print(
        f"  actor update: MFU {100 * r['mfu']:.1f} % -> {'meets' if r['mfu'] >= MFU_GOAL else 'MISSES'} the goal "
        f"(>= {100 * MFU_GOAL:.0f} %)"
    )
    if "budget_mfu" in r:
        print(
            f"  actor update, dynamic batch: MFU {100 * r['budget_mfu']:.1f} % -> "
            f"{'meets' if r['budget_mfu'] >= MFU_GOAL else 'MISSES'} the goal (>= {100 * MFU_GOAL:.0f} %)"
        )
    else:
        print(f"  actor update, dynamic batch: failed ({r['budget_update']['error']})")
    print(
        f"  hf rollout: {r['rollout_ratio']:.2f}x generate -> "
        f"{'meets' if r['rollout_ratio'] >= ROLLOUT_GOAL else 'MISSES'} the goal (>= {ROLLOUT_GOAL})"
    )
    save(args.out, name, r, table)
    return r


def save(out: str | None, name: str, r: dict, table: str) -> None:
    if out:
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, f"{name}.json"), "w") as f:
            json.dump(r, f, indent=1, default=str)
        with open(os.path.join(out, f"{name}.md"), "w") as f:
            f.write(table + "\n")


if __name__ == "__main__":
    main()
