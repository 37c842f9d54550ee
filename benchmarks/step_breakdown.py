"""Where a GRPO step's time goes, and how much of it is the controller's own overhead.

    python benchmarks/step_breakdown.py [--quick] [--steps N] [--backends ray1,ray2,inprocess] [--override K=V ...]

A GRPO step (tiny Qwen2, tiny arithmetic task in GSM8K format, 16 prompts × 8 samples × ≤32 tokens,
one optimizer step) runs through ``RayPPOTrainer.train_step`` on each backend. For every phase the
table shows the driver's wall time (``timing_s/<phase>``) next to the time the workers report they
spent computing (``timing_s/worker_*``, ``timing_s/update_weights`` from ``meta_info['metrics']``,
max over ranks; for gen the agent loop manager's ``timing_s/generate_sequences``, i.e. the whole
server-side rollout including its requests) or, for phases the driver computes itself (the rule
reward, the advantages), the time of that computation. The CPU column is this process's CPU seconds
(user + system, all threads) per phase: the whole step's for the in-process backend, the driver's
alone with Ray. On a shared machine compare CPU seconds, not wall times.

    controller overhead = step time - worker compute - driver compute

i.e. dispatch, serialisation, collect, DataProto bookkeeping and metrics. Goal: <= 2% of the step.
The baseline measured in the same run is the step's own compute time (ratio = step / compute).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common as C  # noqa: E402

# driver phase -> worker-reported timings that make up its compute
PHASE_WORKER_KEYS = {
    "gen": ["timing_s/update_weights", "timing_s/generate_sequences"],
    "reward": ["timing_s/worker_rm"],
    "old_log_prob": ["timing_s/worker_old_log_prob"],
    "ref": ["timing_s/worker_ref"],
    "values": ["timing_s/worker_values"],
    "adv": [],
    "update_critic": ["timing_s/worker_update_critic"],
    "update_actor": ["timing_s/worker_update_actor"],
}
DRIVER_COMPUTE = {"reward": "driver/reward_fn", "adv": "driver/adv"}
GOAL_PCT = 2.0


def run_backend(
    label: str,
    backend: str,
    n_workers: int,
    setup: C.GRPOSetup,
    steps: int,
    warmup: int,
    data_dir: str,
    model_dir: str,
    out_dir: str,
    overrides_extra=(),
) -> list[dict]:
    """Per measured step: {phase: (wall, compute)} plus 'step' and totals, and 'cpu': {phase: CPU
    seconds of this process} (the whole step's CPU for the in-process backend; gen = step - the rest)."""
    from hybridflow.protocol import DataProto

    overrides = C.grpo_overrides(data_dir, model_dir, out_dir, setup, backend, n_workers, steps + warmup)
    trainer, loader = C.build_trainer([*overrides, *overrides_extra])
    try:
        worker_times = C.record_worker_timings(trainer)
        driver: dict = {}
        cpu: dict = {}
        results = []
        batches = iter(loader)
        with (
            C.timed_driver_fn(trainer, "reward_fn", driver, "driver/reward_fn"),
            C.timed_driver_fn(trainer, "_compute_advantage", driver, "driver/adv"),
            C.phase_cpu_times(cpu),
        ):
            for i in range(steps + warmup):
                worker_times.new_step()
                driver.clear()
                cpu.clear()
                trainer.global_steps += 1
                metrics = trainer.train_step(DataProto.from_single_dict(next(batches)))
                if i < warmup:
                    continue
                results.append(summarise(metrics, worker_times.per_step[-1], dict(driver), dict(cpu)))
        return results
    finally:
        C.shutdown_trainer(trainer)


def summarise(metrics: dict, worker: dict, driver: dict, cpu: dict | None = None) -> dict:
    out = {"step": metrics["timing_s/step"]}
    if cpu and "step" in cpu:  # the phases the trainer times with ``timer``; gen (timed elsewhere) is the rest
        cpu = dict(cpu)
        cpu.setdefault("gen", max(0.0, cpu["step"] - sum(v for k, v in cpu.items() if k != "step")))
        out["cpu"] = cpu
    compute_total = 0.0
    for phase, keys in PHASE_WORKER_KEYS.items():
        wall = metrics.get(f"timing_s/{phase}")
        if wall is None:
            continue
        compute = sum(worker.get(k, 0.0) for k in keys)
        if phase in DRIVER_COMPUTE:
            compute += driver.get(DRIVER_COMPUTE[phase], 0.0)
        out[phase] = (wall, compute)
        compute_total += compute
    out["compute"] = compute_total
    out["overhead"] = out["step"] - compute_total
    return out


def report(label: str, results: list[dict]) -> list:
    phases = [p for p in PHASE_WORKER_KEYS if p in results[0]]
    rows = []
    cpu = lambda phase: C.median([r["cpu"].get(phase, 0.0) for r in results]) if "cpu" in results[0] else float("nan")  # noqa: E731
    for phase in phases:
        wall = C.median([r[phase][0] for r in results])
        compute = C.median([r[phase][1] for r in results])
        where = "driver" if phase in DRIVER_COMPUTE else "workers"
        rows.append([phase, wall, compute, wall - compute, cpu(phase), where])
    in_phases = C.median([sum(r[p][0] for p in phases) for r in results])
    step = C.median([r["step"] for r in results])
    rows.append(["(between phases)", step - in_phases, 0.0, step - in_phases, float("nan"), "driver"])
    rows.append(
        [
            "step",
            step,
            C.median([r["compute"] for r in results]),
            C.median([r["overhead"] for r in results]),
            cpu("step"),
            "",
        ]
    )
    C.print_table(
        f"{label}: median over {len(results)} steps, seconds (CPU: this process's user+sys; with Ray "
        "the workers' CPU is elsewhere)",
        ["phase", "driver wall", "compute", "overhead", "CPU", "compute on"],
        rows,
    )
    step_vals = [r["step"] for r in results]
    pct = C.median([100 * r["overhead"] / r["step"] for r in results])
    return [
        label,
        step,
        C.median([r["compute"] for r in results]),
        C.median([r["overhead"] for r in results]),
        pct,
        step / C.median([r["compute"] for r in results]),
        min(step_vals),
        max(step_vals),
    ]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="tiny settings for a smoke run")
    p.add_argument("--steps", type=int, default=None, help="measured steps per backend (default 5; quick 1)")
    p.add_argument("--backends", default="ray1,ray2,inprocess", help="comma list of ray1, ray2, inprocess")
    p.add_argument(
        "--torch-threads",
        type=int,
        default=1,
        help="torch threads in the driver (the in-process worker runs there; Ray workers run with "
        "OMP_NUM_THREADS=1). Default 1: on a small shared machine more threads mostly measure contention",
    )
    p.add_argument(
        "--override",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra main_ppo-style override for every backend (repeatable)",
    )
    args = p.parse_args(argv)
    C.set_threads(args.torch_threads)
    setup = C.GRPOSetup(prompts=4, n=2, response_length=8, train_size=32) if args.quick else C.GRPOSetup()
    steps = args.steps or (1 if args.quick else 5)
    warmup = 1
    configs = {"ray1": ("ray", 1), "ray2": ("ray", 2), "inprocess": ("inprocess", 1)}

    summary = []
    with tempfile.TemporaryDirectory(prefix="hf_bench_") as root:
        data_dir, model_dir = C.make_assets(root, setup)
        for name in args.backends.split(","):
            backend, workers = configs[name]
            label = f"{backend} ({workers} worker{'s' if workers > 1 else ''})"
            results = run_backend(
                label, backend, workers, setup, steps, warmup, data_dir, model_dir, root, args.override
            )
            summary.append(report(label, results))

    print(
        f"\nGRPO step on the tiny model: {setup.prompts} prompts x {setup.n} samples, <= {setup.response_length} "
        f"response tokens, 1 optimizer step; {C.machine_line()}"
    )
    C.print_table(
        "Controller overhead = step - (worker compute + driver compute); medians, seconds",
        ["backend", "step", "compute", "overhead", "overhead %", "step/compute", "step min", "step max"],
        summary,
    )
    for row in summary:
        verdict = "meets" if row[4] <= GOAL_PCT else "MISSES"
        print(f"  {row[0]}: overhead {row[4]:.2f}% of the step -> {verdict} the goal (<= {GOAL_PCT:.0f}%)")


if __name__ == "__main__":
    main()
