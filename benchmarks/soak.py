"""Soak: a long GRPO run on the tiny task with periodic checkpoints and random kills of a worker,
resumed automatically (resume_mode=auto) by a small wrapper. Not part of CI.

    nice -n 10 python benchmarks/soak.py --steps 200 --save_freq 10 --kills 5      (~15-25 min on 2 cores)
    python benchmarks/soak.py --quick                                               (6 steps, 1 kill)
    ... --kills 0 --engine_kills 1: a rollout engine (hf: the worker process; vllm: its EngineCore) killed
    0.2 s into a generation instead

The wrapper (``run_with_auto_resume``) builds the trainer the way ``main_ppo`` does and calls ``fit``;
when a worker dies the trainer shuts its workers down and raises, and the wrapper builds a fresh
trainer in the same driver (same Ray session), which resumes from the newest complete checkpoint. A
killer arms a timer at the start of each scheduled step and SIGKILLs a random worker process a random
fraction of a second later, so kills land in generation, in the update, or in the checkpoint save.

Reported:
- steps done: committed steps (each step's last execution; executions after the last checkpoint of a
  killed attempt are redone by the next attempt and their updates are discarded with the workers) and
  all executions; restarts.
- samples lost / repeated: the committed steps' prompt ids (the batch's ``index``) against the order
  an uninterrupted dataloader with the same seed produces, step by step and per epoch (every prompt of
  a completed epoch exactly once); and, at every resume, the dataloader state restored from the
  checkpoint against the reference loader's state after as many batches. Both must show zero.
- memory growth per 100 steps: a least-squares slope of RSS over steps (from step ``--warmup`` on) for
  the driver (alive the whole run, restarts included) and for each worker process over its lifetime
  (from its ``--warmup``-th step on: a restarted worker warms up too).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import psutil  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

TOY_REWARD = """
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return sum(c.isdigit() for c in solution_str) / max(len(solution_str), 1)
"""


# ------------------------------------------------------------------------------------ pure accounting


def committed_steps(executions: list[tuple[int, int, list]]) -> dict[int, list]:
    """{step: prompt ids} of the execution whose update survived: the last one of each step.

    ``executions`` are (attempt, step, ids) in the order they ran. An attempt resumes from a checkpoint
    at or before its predecessor's last step, so a step that ran again later was redone and the later
    execution is the one the final weights contain."""
    out: dict[int, list] = {}
    for _attempt, step, ids in executions:
        out[step] = list(ids)
    return out


def sample_accounting(committed: dict[int, list], reference: dict[int, list], steps_per_epoch: int) -> dict:
    """Lost and repeated prompt ids of the committed steps against the reference order.

    lost: reference ids of steps 1..N that no committed step of the same epoch trained on; repeated:
    ids trained more than once within an epoch; mismatched_steps: steps whose ids differ from the
    reference's (same set in another order counts too); missing_steps: steps never committed."""
    last = max(reference) if reference else 0
    missing_steps = [s for s in range(1, last + 1) if s not in committed]
    mismatched = [s for s in sorted(committed) if committed[s] != reference.get(s)]
    lost = repeated = 0
    for epoch in range((last + steps_per_epoch - 1) // steps_per_epoch):
        steps = range(epoch * steps_per_epoch + 1, min((epoch + 1) * steps_per_epoch, last) + 1)
        seen = Counter(i for s in steps for i in committed.get(s, []))
        expected = Counter(i for s in steps for i in reference[s])
        lost += sum((expected - seen).values())  # due in this epoch, never trained
        repeated += sum((seen - expected).values())  # trained beyond what the epoch holds
    return {"lost": lost, "repeated": repeated, "mismatched_steps": mismatched, "missing_steps": missing_steps}


def pooled_growth_per_100_steps(lifetimes: list[list[tuple[int, float]]]) -> float:
    """One slope for all lifetimes, each with its own level (each centred on its own means): lifetimes cut
    short by kills are too short to fit alone (RSS moves in allocator-sized jumps), together they are not."""
    parts = [np.array(v, dtype=float) for v in lifetimes if len({s for s, _ in v}) >= 2]
    if not parts:
        return float("nan")
    x = np.concatenate([p[:, 0] - p[:, 0].mean() for p in parts])
    y = np.concatenate([p[:, 1] - p[:, 1].mean() for p in parts])
    return float((x @ y) / (x @ x) * 100)


def growth_per_100_steps(points: list[tuple[int, float]]) -> float:
    """Least-squares slope of (step, MB) × 100; nan with fewer than 2 distinct steps."""
    if len({s for s, _ in points}) < 2:
        return float("nan")
    x = np.array([s for s, _ in points], dtype=float)
    y = np.array([m for _, m in points], dtype=float)
    return float(np.polyfit(x, y, 1)[0] * 100)


# ------------------------------------------------------------------------------------ the run


@dataclass
class SoakLog:
    executions: list = field(default_factory=list)  # (attempt, step, prompt ids)
    rss: list = field(default_factory=list)  # (attempt, step, {name: MB})
    resumes: list = field(default_factory=list)  # (attempt, step, restored loader state, reference state)
    kills: list = field(default_factory=list)  # (attempt, step, pid, delay_s)
    failures: list = field(default_factory=list)  # (attempt, step, error line)
    reference: dict = field(default_factory=dict)  # step -> prompt ids of an uninterrupted loader
    steps_per_epoch: int = 0


def rss_mb(pid: int) -> float:
    try:
        return psutil.Process(pid).memory_info().rss / 2**20
    except psutil.NoSuchProcess:
        return float("nan")


def make_config(work: str, args):
    from hybridflow.config.loader import load_config
    from hybridflow.data.tiny_task import write_tiny_task
    from hybridflow.models.tiny import save_tiny_model

    model_dir = save_tiny_model(os.path.join(work, "model"), seed=0)
    data = os.path.join(work, "data")
    write_tiny_task(data, seed=0, train_size=args.train_size, test_size=16)
    reward = os.path.join(work, "reward.py")
    with open(reward, "w") as fh:
        fh.write(TOY_REWARD)
    from hybridflow.main_ppo import checked_config

    per_rank = args.batch * args.n // args.workers
    return checked_config(
        load_config(
            "ppo_trainer",
            [
                "algorithm.adv_estimator=grpo",
                f"data.train_files={data}/train.parquet",
                f"data.val_files={data}/test.parquet",
                f"data.train_batch_size={args.batch}",
                "data.max_prompt_length=128",
                "data.max_response_length=16",
                "data.seed=7",
                f"actor_rollout_ref.model.path={model_dir}",
                "actor_rollout_ref.model.enable_gradient_checkpointing=False",
                "actor_rollout_ref.actor.optim.lr=1e-5",
                f"actor_rollout_ref.actor.ppo_mini_batch_size={args.batch}",
                f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={per_rank}",
                f"actor_rollout_ref.rollout.n={args.n}",
                f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={per_rank}",
                f"trainer.total_training_steps={args.steps}",
                "trainer.test_freq=-1",
                f"trainer.save_freq={args.save_freq}",
                "trainer.val_before_train=False",
                "trainer.logger=[]",
                f"trainer.default_local_dir={work}/ckpt",
                "trainer.resume_mode=auto",
                "trainer.backend=ray",
                f"trainer.n_gpus_per_node={args.workers}",
                "trainer.device=cpu",
                f"custom_reward_function.path={reward}",
                f"actor_rollout_ref.rollout.name={args.rollout}",
            ],
        )
    )


def reference_order(trainer, steps: int) -> tuple[dict[int, list], list[dict]]:
    """Prompt ids per step and the loader state after each step, from a fresh loader (same dataset,
    batch size and seed) iterated without interruption: the order a run that never died would see."""
    from hybridflow.data.sampler import create_rl_dataloader

    loader = trainer.train_dataloader
    fresh = create_rl_dataloader(
        loader.dataset,
        batch_size=loader.batch_size,
        seed=loader.sampler.seed,
        shuffle=loader.sampler.shuffle,
        drop_last=loader.drop_last,
    )
    ids, states, step = {}, [fresh.state_dict()], 0
    while step < steps:
        for batch in fresh:
            step += 1
            ids[step] = [int(i) for i in batch["index"]]
            states.append(fresh.state_dict())
            if step == steps:
                break
    return ids, states


def run_with_auto_resume(config, args, log: SoakLog) -> int:
    """Train to the end, rebuilding the trainer after every failure (resume_mode=auto); returns restarts."""
    from hybridflow.main_ppo import build_trainer
    from hybridflow.trainer import checkpoint as ckpt

    rng = random.Random(args.seed)
    chosen = rng.sample(range(2, args.steps), k=min(args.kills + args.engine_kills, args.steps - 2))
    kill_steps, engine_kill_steps = set(chosen[: args.kills]), set(chosen[args.kills :])
    ref_states = None
    attempt, restarts, start = 0, 0, time.perf_counter()
    while True:
        trainer = build_trainer(config)
        if ref_states is None:
            log.reference, ref_states = reference_order(trainer, args.steps)
            log.steps_per_epoch = len(trainer.train_dataloader)
        try:
            trainer.init_workers()
        except Exception as e:  # a worker lost while starting (Ray's memory monitor, on a crowded machine)
            log.failures.append((attempt, trainer.global_steps, f"init_workers: {type(e).__name__}"))
            trainer.shutdown_workers()
            restarts, attempt = restarts + 1, attempt + 1
            if restarts > args.max_restarts:
                raise
            continue
        group = trainer._all_groups.get("_fused", trainer.actor_rollout_wg)
        worker_pids = [p for p in group.execute_all_sync("get_pid") if p != os.getpid()]
        resumed_from = ckpt.find_latest_checkpoint(config.trainer.default_local_dir)
        if resumed_from:
            state = ckpt.load_dataloader_state(resumed_from)
            log.resumes.append(
                (attempt, int(state["global_steps"]), state["dataloader"], ref_states[int(state["global_steps"])])
            )
        original_step = trainer.train_step
        manager = trainer.async_rollout_manager
        original_generate = manager._run_workers

        def run_workers(prompts, _attempt=attempt, _pids=worker_pids, _trainer=trainer, _gen=original_generate):
            step = _trainer.global_steps
            if step in engine_kill_steps and not prompts.meta_info.get("validate", False):
                engine_kill_steps.discard(step)  # mid-generation: the engine of a random rank
                pid, delay = _engine_pid(rng.choice(_pids)), 0.2
                log.kills.append((_attempt, step, pid, f"engine, {delay}"))
                threading.Timer(delay, lambda: _kill(pid)).start()
            return _gen(prompts)

        manager._run_workers = run_workers

        def train_step(batch, _attempt=attempt, _pids=worker_pids, _step_fn=original_step, _trainer=trainer):
            step = _trainer.global_steps
            if step in kill_steps:  # once per scheduled step, whichever attempt reaches it
                kill_steps.discard(step)
                pid, delay = rng.choice(_pids), rng.uniform(0.0, args.kill_window)
                log.kills.append((_attempt, step, pid, round(delay, 2)))
                threading.Timer(delay, lambda: _kill(pid)).start()
            log.executions.append((_attempt, step, [int(i) for i in batch.non_tensor_batch["index"]]))
            metrics = _step_fn(batch)
            log.rss.append(
                (
                    _attempt,
                    step,
                    {"driver": rss_mb(os.getpid()), **{f"worker{r}@{p}": rss_mb(p) for r, p in enumerate(_pids)}},
                )
            )
            if step % 20 == 0:
                print(
                    f"[soak {time.perf_counter() - start:6.0f}s] attempt {_attempt} step {step}: "
                    f"score {metrics.get('critic/score/mean', float('nan')):.3f}",
                    flush=True,
                )
            return metrics

        trainer.train_step = train_step
        try:
            trainer.fit()
            return restarts
        except Exception as e:  # a dead worker: rebuild and resume
            line = f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
            log.failures.append((attempt, trainer.global_steps, line))
            print(f"[soak] attempt {attempt} failed at step {trainer.global_steps}: {line}", flush=True)
            restarts += 1
            attempt += 1
            if restarts > args.max_restarts:
                raise
        finally:
            trainer.shutdown_workers()


def _engine_pid(worker_pid: int) -> int:
    """The rollout engine's own process: vLLM's EngineCore under the worker, else the worker (hf runs in it)."""
    cores = [p.pid for p in psutil.Process(worker_pid).children(recursive=True) if "EngineCore" in p.name()]
    return cores[0] if cores else worker_pid


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def report(args, log: SoakLog, restarts: int, reference: dict, steps_per_epoch: int, wall: float) -> dict:
    committed = committed_steps(log.executions)
    acct = sample_accounting(committed, reference, steps_per_epoch)
    resume_mismatch = [
        (a, s)
        for a, s, got, want in log.resumes
        if {k: got[k] for k in ("epoch", "batches")} != {k: want[k] for k in ("epoch", "batches")}
    ]
    driver = [(s, m["driver"]) for _a, s, m in log.rss if s >= args.warmup]
    workers: dict[str, list] = {}
    for a, s, m in log.rss:
        for name, mb in m.items():
            if name != "driver":
                workers.setdefault(f"a{a}:{name}", []).append((s, mb))
    # each process's own first --warmup steps are left out (a restarted worker warms up too)
    workers = {k: [(s, mb) for s, mb in v if s >= v[0][0] + args.warmup - 1] for k, v in workers.items()}
    long_lived = {k: v for k, v in workers.items() if len(v) >= args.min_points}
    worker_growth = {k: growth_per_100_steps(v) for k, v in long_lived.items()}
    print(
        f"\nsoak: {args.steps} GRPO steps ({args.batch} prompts x {args.n}), {args.workers} Ray workers, "
        f"save_freq {args.save_freq}, "
        f"{len(log.kills)} kills ({args.engine_kills} of an engine mid-generation), {args.rollout} rollout, "
        f"wall {wall:.0f} s"
    )
    print(f"{'quantity':<44} {'value':>12}")
    rows = [
        ("steps committed (goal: all)", f"{len(committed)}/{args.steps}"),
        ("step executions (incl. redone after kills)", len(log.executions)),
        ("restarts (auto-resume)", restarts),
        ("samples lost (goal 0)", acct["lost"] * args.n),
        ("samples repeated (goal 0)", acct["repeated"] * args.n),
        ("steps whose prompts differ from reference", len(acct["mismatched_steps"])),
        ("resumes whose loader state != reference", f"{len(resume_mismatch)}/{len(log.resumes)}"),
        ("driver RSS growth, MB / 100 steps", f"{growth_per_100_steps(driver):.1f}"),
        ("worker RSS growth, MB / 100 steps (max)", f"{max(worker_growth.values(), default=float('nan')):.1f}"),
        ("worker RSS growth, all lifetimes pooled", f"{pooled_growth_per_100_steps(list(workers.values())):.1f}"),
        ("driver RSS first -> last, MB", f"{driver[0][1]:.0f} -> {driver[-1][1]:.0f}" if driver else "n/a"),
    ]
    for name, value in rows:
        print(f"{name:<44} {value!s:>12}")
    print("\nkills (attempt, step, pid, delay s):", log.kills)
    print("failures (attempt, step, error):")
    for f in log.failures:
        print("  ", f)
    print(
        "resumes (attempt, from step, restored loader state):",
        [(a, s, {k: g[k] for k in ("epoch", "batches")}) for a, s, g, _ in log.resumes],
    )
    print(
        f"worker RSS growth per lifetime (MB / 100 steps, >= {args.min_points} points):",
        {k: round(v, 1) for k, v in worker_growth.items()},
    )
    # like for like across runs: a lifetime cut short by a kill is fitted over its early, warming steps only
    print(
        f"worker RSS growth over each lifetime's first {args.min_points} fitted steps (MB / 100 steps):",
        {k: round(growth_per_100_steps(v[: args.min_points]), 1) for k, v in long_lived.items()},
    )
    if args.rss_json:
        with open(args.rss_json, "w") as f:
            json.dump({"rss": log.rss, "kills": log.kills, "warmup": args.warmup}, f)
    ok = (
        acct["lost"] == 0
        and acct["repeated"] == 0
        and not acct["mismatched_steps"]
        and not acct["missing_steps"]
        and not resume_mismatch
        and len(committed) == args.steps
    )
    print(f"\nverdict: {'zero samples lost or repeated' if ok else 'SAMPLES LOST OR REPEATED'}")
    return {"ok": ok, **acct, "restarts": restarts, "resume_mismatch": resume_mismatch}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--save_freq", type=int, default=10)
    ap.add_argument("--kills", type=int, default=5, help="random worker kills over the run")
    ap.add_argument("--engine_kills", type=int, default=0, help="rollout engines killed mid-generation")
    ap.add_argument("--rollout", default="hf", choices=["hf", "vllm"], help="the rollout engine")
    ap.add_argument("--kill_window", type=float, default=2.0, help="a kill lands 0..this many seconds into its step")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--n", type=int, default=4)
    ap.add_argument("--train_size", type=int, default=512, help="prompts; batch 8 gives 64 steps per epoch")
    ap.add_argument(
        "--warmup", type=int, default=10, help="steps of each process's life before its memory growth is measured"
    )
    ap.add_argument("--min_points", type=int, default=30, help="worker lifetimes shorter than this are not fitted")
    ap.add_argument("--max_restarts", type=int, default=20)
    ap.add_argument("--rss_json", default=None, help="write every step's RSS per process (and the kills) here")
    ap.add_argument("--seed", type=int, default=0, help="seeds the kill schedule")
    ap.add_argument("--quick", action="store_true", help="6 steps, save every 2, one kill: checks the plumbing")
    args = ap.parse_args(argv)
    if args.quick:
        args.steps, args.save_freq, args.kills, args.train_size, args.warmup, args.min_points = 6, 2, 1, 64, 0, 3

    import ray

    work = tempfile.mkdtemp(prefix="hf_soak_")
    config = make_config(work, args)
    log, start = SoakLog(), time.perf_counter()
    try:
        run_with_auto_resume(config, args, log)
    finally:  # a run that gave up still reports what it saw
        if ray.is_initialized():
            ray.shutdown()
        out = report(args, log, len(log.failures), log.reference, log.steps_per_epoch, time.perf_counter() - start)
    return out


if __name__ == "__main__":
    main()
