"""Asynchronous training throughput: sync vs one-step-off vs fully async on the same pools, one run.

    python benchmarks/async_throughput.py [--quick] [--steps N] [--modes sync,one_step_off,fully_async]
                                          [--workload skewed|long] [--staleness S] [--seed S]
                                          [--override KEY=VALUE ...]

Pools: the actor (with its reference) on one Ray worker, the rollout engine (hf server) on another
(``actor_rollout_ref.rollout.nnodes=1``): the three modes differ only in the driver's schedule.
Workloads (``_skewed_workload.py``), 8 prompts × 4 samples per step, EOS ignored, so every mode generates
exactly the same tokens: ``skewed`` (default), one prompt in eight asks for ``--long`` tokens (default 96),
the rest for ``--short`` (default 8); ``long``, every prompt asks for ``--long`` tokens. A GRPO step on the
dense toy reward (share of digit characters) trains the tiny Qwen2.

Per mode: seconds per step (median after ``--warmup`` steps), samples/s, the trainer's idle fraction
(time waiting for rollouts / step time), the rollout pool's idle fraction (time with nothing in flight;
sync: the time outside generation), the version lag, the mean score of the last steps' samples (in the
asynchronous modes drawn from policies up to `max lag` versions old) and the final policy's validation score
(16 test prompts x 4 samples at temperature 1: the score to compare; ``--seed`` varies data order and
sampling). Fully async weights its stale samples with token-level truncated IS (``rollout_is=token``). The ratio
is samples/s against sync, measured in the same run, and against the synchronous schedule doing the same
work per step ("like sync": with rollout log-probs as pi_old, when the asynchronous row skips the
recomputation as veRL's fully async recipe does by default). Beside each ratio: the overlap bound of its
baseline, step / max(gen, step - gen) of the baseline's medians (gen = ``timing_s/gen``, the rest of the
step = training: old log-probs, update, weight push, reward, bookkeeping), i.e. what a perfect overlap
gains at the synchronous phase speeds, and the share of it reached (ratio / bound). Goals: fully async
>= 90 % of its bound on ``skewed``, >= 2x sync on ``long`` (there the bound is <= 1.5x once generation
is >= 2/3 of the sync step, so the asynchronous rollout must also generate faster: two steps' groups in
flight decode in one batch; ``--staleness S`` lets (1 + S) steps' groups be in flight). CPU s/step and
cores busy count every process of the run: overlap needs two free cores.
Timings on a shared machine are noisy; the table prints the load average.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common as C  # noqa: E402

GOAL_OF_BOUND = 0.9  # skewed workload: fully async reaches this share of its overlap bound
GOAL_LONG = 2.0  # long workload: fully async samples/s over sync's
VAL_N = 4  # samples per test prompt in the final validation (16 prompts)
SEPARATE = ["actor_rollout_ref.rollout.nnodes=1", "actor_rollout_ref.rollout.n_gpus_per_node=1"]
MODES = {
    "sync": SEPARATE,
    "one_step_off": [*SEPARATE, "async_training.mode=one_step_off"],
    "fully_async": [
        *SEPARATE,
        "async_training.mode=fully_async",  # staleness_threshold: --staleness (overrides() adds it)
        "async_training.trigger_parameter_sync_step=1",
        "async_training.require_batches=2",
        "async_training.partial_rollout=True",
        # token-level truncated IS weights pi_old / pi_rollout against the staleness: on the long workload they
        # halved the gap of the final policy's score to sync's (docs/measurements.md, 2026-11-28)
        "algorithm.rollout_correction.rollout_is=token",
    ],
}
# veRL's fully async recipe also takes pi_old from the rollout's log-probs (no recomputation by the actor)
MODES["fully_async+rollout_logprobs"] = [*MODES["fully_async"], "async_training.use_rollout_log_probs=True"]
# the same saving in the synchronous schedule (rollout correction's bypass mode), for a like-for-like ratio
MODES["sync+rollout_logprobs"] = [*SEPARATE, "algorithm.rollout_correction.bypass_mode=True"]
BASELINE = {"fully_async": "sync", "one_step_off": "sync", "fully_async+rollout_logprobs": "sync+rollout_logprobs"}
TOY_REWARD = """
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    s = solution_str or ""
    return sum(c.isdigit() for c in s) / max(len(s), 1)
"""


def write_skewed_data(data_dir: str, long_tokens: int, short_tokens: int, every: int) -> None:
    """The tiny task's parquet files with agent_name and a per-sample response length added."""
    import pyarrow.parquet as pq

    for split in ("train", "test"):
        path = os.path.join(data_dir, f"{split}.parquet")
        rows = pq.read_table(path).to_pylist()
        for i, row in enumerate(rows):
            row["agent_name"] = "skewed_single_turn"
            row["extra_info"] = {
                **row["extra_info"],
                "response_tokens": long_tokens if i % every == 0 else short_tokens,
            }
        import pyarrow as pa

        pq.write_table(pa.Table.from_pylist(rows), path)


def overrides(data_dir, model_dir, out_dir, args, mode) -> list[str]:
    prompts, n = args.prompts, args.n
    reward = os.path.join(out_dir, "toy_reward.py")
    with open(reward, "w") as f:
        f.write(TOY_REWARD)
    return [
        "algorithm.adv_estimator=grpo",
        f"data.train_files={data_dir}/train.parquet",
        f"data.val_files={data_dir}/test.parquet",
        f"data.train_batch_size={prompts}",
        "data.max_prompt_length=128",
        f"data.max_response_length={args.long}",
        f"actor_rollout_ref.model.path={model_dir}",
        "actor_rollout_ref.model.enable_gradient_checkpointing=False",
        "actor_rollout_ref.actor.optim.lr=1e-4",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={prompts // 2}",
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={prompts * n // 2}",
        "actor_rollout_ref.actor.use_kl_loss=False",
        "actor_rollout_ref.actor.entropy_coeff=0",
        f"actor_rollout_ref.rollout.n={n}",
        "actor_rollout_ref.rollout.temperature=1.0",
        f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={prompts * n}",
        "actor_rollout_ref.rollout.agent.num_workers=1",
        f"custom_reward_function.path={reward}",
        f"trainer.total_training_steps={args.steps}",
        # one validation of the final policy, sampled as in training (greedy decoding of the tiny model saturates
        # at all digits, score 1.0): the score the modes compare; the training batches' score lags in the
        # asynchronous modes, whose samples come from policies up to `max lag` versions old
        f"trainer.test_freq={args.steps}",
        "actor_rollout_ref.rollout.val_kwargs.do_sample=True",
        "actor_rollout_ref.rollout.val_kwargs.temperature=1.0",
        f"actor_rollout_ref.rollout.val_kwargs.n={VAL_N}",
        f"data.seed={args.seed}",
        f"actor_rollout_ref.rollout.seed={args.seed}",
        "trainer.save_freq=-1",
        "trainer.val_before_train=False",
        "trainer.logger=['file']",
        f"trainer.default_local_dir={out_dir}/ckpt",
        "trainer.n_gpus_per_node=1",
        "trainer.backend=ray",
        "trainer.device=cpu",
        *MODES[mode],
        # more groups in flight: larger decode batches on the rollout (fully async only; the others fix it)
        *([f"async_training.staleness_threshold={args.staleness}"] if "fully_async" in mode else []),
        *args.override,
    ]


def summarize(rows: list[dict], mode: str, samples_per_step: int, warmup: int) -> dict:
    timed = rows[warmup:] or rows
    step_s = C.median([r["timing_s/step"] for r in timed])
    trainer_idle = C.median([r.get("timing_s/gen", 0.0) / r["timing_s/step"] for r in timed])
    if mode.startswith("sync"):  # the rollout pool works only while the step generates
        rollout_idle = C.median([1 - r.get("timing_s/gen", 0.0) / r["timing_s/step"] for r in timed])
    else:
        rollout_idle = C.median([r.get("async/rollout_idle_fraction", float("nan")) for r in timed])
    tail = rows[-3:]
    phases = {
        k: C.median([r.get(f"timing_s/{k}", 0.0) for r in timed])
        for k in ("gen", "old_log_prob", "update_actor", "update_weights", "sync_weights_total")
    }
    return {
        "phases": phases,
        "step_s": step_s,
        "samples_s": samples_per_step / step_s,
        "trainer_idle": trainer_idle,
        "rollout_idle": rollout_idle,
        "lag_max": max(r.get("async/staleness/max", 0.0) for r in rows),
        "score": sum(r["critic/score/mean"] for r in tail) / len(tail),
        "val_score": final_val_score(rows[-1]),
        "response_len": C.median([r["response_length/mean"] for r in timed]),
    }


def final_val_score(row: dict) -> float:
    """The mean sampled validation reward of the final policy (``val-core/<source>/reward/mean@N``)."""
    keys = [k for k in row if k.startswith("val-core/") and "/reward/mean@" in k]
    return sum(row[k] for k in keys) / len(keys) if keys else float("nan")


class StepCPU:
    """CPU seconds of this process and its descendants (the Ray workers, their children) at each step's end,
    polled from another thread: overlap needs free cores, and on a shared machine a run may get fewer than two.
    A process's last reading is kept after it exits."""

    def __init__(self, metrics_path: str, poll_s: float = 0.5):
        import psutil

        self._root, self._path, self._poll_s = psutil.Process(), metrics_path, poll_s
        self._cpu: dict[int, float] = {}
        self.marks: list[tuple[float, float]] = []  # (time, CPU seconds) when the metrics file reached a step
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._poll_s):
            for p in [self._root, *self._root.children(recursive=True)]:
                with contextlib.suppress(Exception):  # gone meanwhile
                    t = p.cpu_times()
                    self._cpu[p.pid] = t.user + t.system
            with contextlib.suppress(OSError):
                with open(self._path) as f:
                    steps = sum(1 for _ in f)
                while len(self.marks) < steps:
                    self.marks.append((time.perf_counter(), sum(self._cpu.values())))

    def close(self, warmup: int) -> tuple[float, float]:
        """(CPU seconds per step, cores busy) from the end of step ``warmup`` to the end of the step before the
        last: the last step also runs the final validation, whose CPU time is no step's."""
        self._stop.set()
        self._thread.join()
        if len(self.marks) <= warmup + 2:
            return float("nan"), float("nan")
        (t0, c0), (t1, c1) = self.marks[warmup], self.marks[-2]
        return (c1 - c0) / (len(self.marks) - 2 - warmup), (c1 - c0) / (t1 - t0)


def overlap_bound(step_s: float, gen_s: float) -> float:
    """The most a perfect overlap of a synchronous step's generation (``gen_s``) and training (the rest of the
    step, ``step_s - gen_s``) can speed it up, at the same generation and training speeds: step / longer phase."""
    return step_s / max(gen_s, step_s - gen_s)


def bound_of(results: dict, baseline: str) -> float:
    """``overlap_bound`` of ``baseline``'s medians (nan when it did not run)."""
    if baseline not in results:
        return float("nan")
    r = results[baseline]
    return overlap_bound(r["step_s"], r["phases"]["gen"])


def versus(results: dict, mode: str, baseline: str) -> tuple[float, float, float]:
    """``mode``'s samples/s over ``baseline``'s, the baseline's overlap bound, and the share of it reached."""
    r, bound = ratio(results, mode, baseline), bound_of(results, baseline)
    return r, bound, r / bound


def ratio(results: dict, mode: str, baseline: str) -> float:
    """samples/s of ``mode`` over ``baseline``'s (nan when the baseline did not run)."""
    if baseline not in results:
        return float("nan")
    return results[mode]["samples_s"] / results[baseline]["samples_s"]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="3 steps, 4 prompts: checks the plumbing only")
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--warmup", type=int, default=2, help="steps left out of the medians")
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--n", type=int, default=4)
    p.add_argument("--long", type=int, default=96, help="tokens of the long responses")
    p.add_argument("--short", type=int, default=8, help="tokens of the other responses")
    p.add_argument("--every", type=int, default=8, help="one prompt in EVERY asks for the long response")
    p.add_argument(
        "--workload",
        choices=("skewed", "long"),
        default="skewed",
        help="skewed: one prompt in --every asks for --long tokens; long: every prompt does (generation-bound)",
    )
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--seed", type=int, default=1, help="data order and rollout sampling (the scores' noise)")
    p.add_argument(
        "--override", action="append", default=[], metavar="KEY=VALUE", help="extra main_ppo override (all modes)"
    )
    p.add_argument(
        "--staleness",
        type=float,
        default=1.0,
        help="fully async's async_training.staleness_threshold: (1 + this) x a step's groups in flight",
    )
    args = p.parse_args(argv)
    if args.quick:
        args.steps, args.warmup, args.prompts, args.long = 3, 1, 4, 16
    if args.workload == "long":
        args.every = 1
    modes = [m for m in args.modes.split(",") if m]
    unknown = set(modes) - set(MODES)
    if unknown:
        p.error(f"unknown mode(s) {sorted(unknown)}; choose from {', '.join(MODES)}")

    import _skewed_workload  # noqa: F401 - registers skewed_single_turn in this process

    from hybridflow.config.loader import load_config
    from hybridflow.main_ppo import run_ppo
    from hybridflow.single_controller.ray.init import init_ray

    here = os.path.dirname(os.path.abspath(__file__))
    repo = os.path.dirname(here)
    # Ray workers (the agent loop workers among them) import the workload's loop at start-up
    init_ray(
        None,
        num_cpus=2,
        runtime_env={
            "worker_process_setup_hook": "_skewed_workload.register",
            "env_vars": {"HYBRIDFLOW_DEVICE": "cpu", "PYTHONPATH": os.pathsep.join([here, repo])},
        },
    )
    results = {}
    with tempfile.TemporaryDirectory() as root:
        data_dir, model_dir = C.make_assets(root, C.GRPOSetup(train_size=max(64, args.prompts * args.steps * 3)))
        write_skewed_data(data_dir, args.long, args.short, args.every)
        for mode in modes:
            out = os.path.join(root, mode)
            os.makedirs(out)
            print(f"[async_throughput] {mode}: {args.steps} steps", flush=True)
            cpu = StepCPU(os.path.join(out, "ckpt", "metrics.jsonl"))
            try:
                run_ppo(load_config("ppo_trainer", overrides(data_dir, model_dir, out, args, mode)))
            finally:
                cpu_per_step, cores = cpu.close(args.warmup)
            with open(os.path.join(out, "ckpt", "metrics.jsonl")) as f:
                rows = [json.loads(line) for line in f]
            results[mode] = summarize(rows, mode, args.prompts * args.n, args.warmup)
            results[mode].update(cpu_per_step=cpu_per_step, cores=cpu_per_step / results[mode]["step_s"])

    long_share = 1 / args.every
    C.print_table(
        f"GRPO on a {args.workload} workload: {args.prompts} prompts x {args.n} samples per step, {long_share:.0%} of "
        f"prompts ask for {args.long} tokens, the rest {args.short}; actor and rollout on separate Ray workers; "
        f"fully async: staleness_threshold={args.staleness:g}, partial rollout\n"
        f"{C.machine_line()}\nbound = the baseline's step / max(its gen, its step - gen) (perfect overlap at sync's "
        "phase speeds); reached = ratio / bound",
        [
            "mode",
            "s/step",
            "samples/s",
            "vs sync",
            "bound",
            "reached",
            "vs like sync",
            "bound",
            "reached",
            "trainer idle",
            "rollout idle",
            "max lag",
            "score (last 3)",
            "val score",
        ],
        [
            [
                m,
                r["step_s"],
                r["samples_s"],
                *versus(results, m, "sync"),
                *versus(results, m, BASELINE.get(m, m)),
                r["trainer_idle"],
                r["rollout_idle"],
                r["lag_max"],
                r["score"],
                r["val_score"],
            ]
            for m, r in results.items()
        ],
    )
    C.print_table(
        "where a step's time goes (median seconds; gen = waiting for rollouts; weights = push to the rollout); CPU "
        "s/step and cores busy: all the run's processes after the warm-up (an asynchronous row overlaps only as far "
        "as it gets two cores: with ~1 core busy on a loaded machine, its ratio says nothing about the overlap)",
        ["mode", "gen", "old_log_prob", "update_actor", "weights", "CPU s/step", "cores busy"],
        [
            [
                m,
                r["phases"]["gen"],
                r["phases"]["old_log_prob"],
                r["phases"]["update_actor"],
                max(r["phases"]["update_weights"], r["phases"]["sync_weights_total"]),
                r["cpu_per_step"],
                r["cores"],
            ]
            for m, r in results.items()
        ],
    )
    if "sync" in results:
        print(
            f"\ngeneration share of the sync step: {results['sync']['phases']['gen'] / results['sync']['step_s']:.0%}"
        )
    if "sync" in results and "fully_async" in results:
        r, bound, reached = versus(results, "fully_async", "sync")
        met = reached >= GOAL_OF_BOUND if args.workload == "skewed" else r >= GOAL_LONG
        goal = f"{GOAL_OF_BOUND:.0%} of the bound" if args.workload == "skewed" else f"{GOAL_LONG}x sync"
        print(
            f"\nfully_async: {r:.2f}x sync samples/s, {reached:.0%} of the overlap bound {bound:.2f}x "
            f"(goal on the {args.workload} workload >= {goal}) -> {'meets' if met else 'MISSES'} the goal"
        )
        for m in ("fully_async+rollout_logprobs",):
            if m in results:
                print(
                    f"{m}: {ratio(results, m, 'sync'):.2f}x sync, {ratio(results, m, BASELINE[m]):.2f}x {BASELINE[m]}"
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
