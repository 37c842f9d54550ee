"""A GRPO step's phases on the real model with each rollout, in one run.

    python benchmarks/real_model_rollouts.py [--steps 3] [--rollouts hf,vllm] [--workdir real_model_rollouts_out]
    python benchmarks/real_model_rollouts.py --rollouts vllm:fp32,vllm:bf16   # the recipe's --precision, compared

For each rollout, ``python -m hybridflow.main_ppo`` runs the real-model recipe's own command line
(recipes/real_model.py: SmolLM2-135M-Instruct, its word problems, 8 prompts × 8 samples, bypass mode) for
``--steps`` steps; the table gives the median of each ``timing_s/*`` phase over the steps after the first
(the first allocates Adam's states and, with vLLM, warms the engine), plus the trainer's wall time, which
includes vLLM's engine start. The 1-minute load average before and after each run says how shared the machine was.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

RECIPES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "recipes")
sys.path.insert(0, RECIPES)

import real_model  # noqa: E402
from quickstart import child_env, read_metrics, run_module  # noqa: E402
from word_problems import write_word_problems  # noqa: E402

PHASES = ("gen", "update_weights", "reward", "old_log_prob", "ref", "adv", "update_actor", "step")


def phase_medians(rows: list[dict]) -> dict[str, float]:
    later = [r for r in rows if r.get("step", 0) > 1 and "timing_s/step" in r] or rows
    named = {p: f"timing_s/{p}" for p in PHASES} | {"response_length": "response_length/mean"}
    return {n: round(statistics.median(r[k] for r in later), 2) for n, k in named.items() if k in later[0]}


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--rollouts", default="hf,vllm")
    p.add_argument("--workdir", default="real_model_rollouts_out")
    args = p.parse_args(argv)
    work = os.path.abspath(args.workdir)
    recipe = real_model.parse(["--steps", str(args.steps), "--test_freq", str(args.steps + 1)])
    from hybridflow.workers.model_loading import local_model_path

    model = local_model_path(real_model.find_gguf(None), "--gguf")
    paths = write_word_problems(os.path.join(work, "data"), 0, 2000, 50, real_model.KINDS, real_model.HI)
    results = {}
    for variant in args.rollouts.split(","):
        rollout, _, recipe.precision = variant.partition(":")  # "vllm:bf16": rollout and the recipe's --precision
        recipe.precision = recipe.precision or "auto"
        name = variant.replace(":", "_")
        run_dir, metrics = os.path.join(work, name), os.path.join(work, f"{name}_metrics.jsonl")
        if os.path.exists(metrics):
            os.remove(metrics)
        load, t0 = os.getloadavg()[0], time.perf_counter()
        run_module(
            "hybridflow.main_ppo",
            real_model.rl_args(model, paths, run_dir, rollout, recipe) + [f"trainer.save_freq={args.steps + 1}"],
            child_env(recipe.threads, HYBRIDFLOW_FILE_LOGGER_PATH=metrics),
            os.path.join(work, f"{name}.log"),
        )
        results[variant] = {
            "phases_s": phase_medians(read_metrics(metrics)),
            "trainer_wall_s": round(time.perf_counter() - t0, 1),
            "load_1min": [round(load, 2), round(os.getloadavg()[0], 2)],
        }
        print(variant, json.dumps(results[variant]), flush=True)
    print("| phase (median s, steps 2..) | " + " | ".join(results) + " |")
    print("|---" * (len(results) + 1) + "|")
    for phase in (*PHASES, "response_length"):  # the median over steps of the mean response length
        if any(phase in r["phases_s"] for r in results.values()):
            print(f"| {phase} | " + " | ".join(str(r["phases_s"].get(phase, "-")) for r in results.values()) + " |")
    with open(os.path.join(work, "result.json"), "w") as f:
        json.dump({"steps": args.steps, **results}, f, indent=1)
    return results


if __name__ == "__main__":
    main()
