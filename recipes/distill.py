"""On-policy distillation on a CPU: a student learns the quickstart's task from a stronger teacher.

    python recipes/distill.py [--seed 0] [--workdir distill_out] [--student DIR] [--teacher DIR] [--quick]

(``recipes/distill.sh`` sets up the environment and calls this.) Phases, each timed:

1. data      the quickstart's tiny model and arithmetic task (``quickstart.make_data``, same seed).
2. sft       the student: the quickstart's SFT warm-up checkpoint (``quickstart.sft_warmup``), or ``--student``.
3. teacher   a stronger model: the quickstart's GRPO from that checkpoint (``quickstart.rl_args``, 150
             steps), exported to a Hugging Face directory, or ``--teacher`` (e.g. a quickstart's
             ``grpo_final_hf``: the teacher only needs the student's tokenizer).
4. eval      greedy held-out accuracy of the student and the teacher (the quickstart's 200 prompts).
5. distill   ``python -m hybridflow.main_ppo`` with veRL's ``distillation.*`` keys: the teacher is
             served on an hf engine of its own and scores the student's sampled tokens (its top-k
             log-probs); the loss is ``forward_kl_topk`` alone (``use_task_rewards=False``).
6. eval      the distilled student, then a second run that adds the task's GRPO loss
             (``use_task_rewards=True``) and its evaluation (``--runs`` picks them).

Writes ``<workdir>/distill_result.json``: accuracy_before / accuracy_after (the student's),
teacher_accuracy, the curves (``kl``: the student-teacher KL per step as the actor logs it,
``val_accuracy``: greedy validation accuracy), the task-reward run's numbers, wall seconds per phase.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from quickstart import FULL as QUICKSTART_FULL  # noqa: E402
from quickstart import (  # noqa: E402
    FULL_RESPONSE_LENGTH,  # noqa: E402
    MAX_PROMPT_LENGTH,
    QUICK,
    child_env,
    curves,
    export_final,
    make_data,
    read_metrics,
    rl_args,
    run_module,
    sft_warmup,
)

# distillation: 16 prompts x 4 samples per step (the teacher's top-k carries the signal; no group needed)
# sft_batch: the student the distillation figures were measured with (64-row SFT steps)
FULL = dict(
    QUICKSTART_FULL, sft_batch=64, response_length=FULL_RESPONSE_LENGTH["steps"], n=4, rl_steps=40, test_freq=20
)


def log(msg: str) -> None:
    print(f"[distill {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workdir", default="distill_out")
    p.add_argument("--student", default=None, help="skip SFT: the student's Hugging Face directory")
    p.add_argument("--teacher", default=None, help="skip the teacher's GRPO: the teacher's Hugging Face directory")
    p.add_argument("--steps", type=int, default=None, help="distillation steps (default 40; 2 with --quick)")
    p.add_argument("--lr", type=float, default=1e-4, help="the student's learning rate")
    p.add_argument("--loss_mode", default="forward_kl_topk")
    p.add_argument("--topk", type=int, default=16)
    p.add_argument(
        "--runs",
        default="distill,distill_task",
        help="which runs: distill (distillation alone), distill_task (with use_task_rewards=True)",
    )
    p.add_argument("--quick", action="store_true", help="tiny sizes: checks the plumbing only")
    p.add_argument("--backend", choices=("ray", "inprocess"), default="ray")
    p.add_argument("--threads", type=int, default=min(2, os.cpu_count() or 1))
    args, extra = p.parse_known_args(argv)
    # what the quickstart's helpers read
    args.rl_override, args.mode, args.device, args.task_style = extra, "sync", "cpu", "steps"
    args.lr_schedule, args.sft_lr, args.data_seed = "cosine", 1e-3, None
    return args


def distill_overrides(args, teacher: str, task_rewards: bool) -> list[str]:
    return [
        "distillation.enabled=True",
        f"distillation.teacher_models.teacher_model.model_path={teacher}",
        "distillation.teacher_models.teacher_model.num_replicas=1",
        "distillation.teacher_models.teacher_model.inference.name=hf",
        f"distillation.distillation_loss.loss_mode={args.loss_mode}",
        f"distillation.distillation_loss.topk={args.topk}",
        f"distillation.distillation_loss.use_task_rewards={task_rewards}",
    ]


def accuracy(model: str, paths: dict, sizes: dict) -> float:
    from hybridflow.trainer.eval_utils import greedy_accuracy

    return greedy_accuracy(
        model, paths["heldout"], response_length=sizes["response_length"], max_prompt_length=MAX_PROMPT_LENGTH
    )


def run_rl(name: str, model: str, paths: dict, sizes: dict, args, work: str, extra: list[str]) -> tuple[str, list]:
    """One main_ppo run from ``model``; returns (its final model exported, its metrics rows)."""
    run_dir, metrics = os.path.join(work, f"{name}_run"), os.path.join(work, f"{name}_metrics.jsonl")
    shutil.rmtree(run_dir, ignore_errors=True)
    if os.path.exists(metrics):
        os.remove(metrics)
    args.algo = name  # export_final's directory name
    overrides = rl_args("grpo", model, paths, sizes, run_dir, args)
    run_module(
        "hybridflow.main_ppo",
        [*overrides, *extra],
        child_env(args.threads, HYBRIDFLOW_FILE_LOGGER_PATH=metrics),
        os.path.join(work, f"{name}.log"),
    )
    return export_final(run_dir, work, args), read_metrics(metrics)


def kl_curve(rows: list[dict]) -> list[tuple[int, float]]:
    return [(r["step"], float(r["distillation/kl"])) for r in rows if "distillation/kl" in r]


def main(argv=None) -> dict:
    args = parse(argv)
    sizes = dict(QUICK) if args.quick else dict(FULL)
    args.rl_steps = None
    work = os.path.abspath(args.workdir)
    os.makedirs(work, exist_ok=True)
    os.environ.update({k: v for k, v in child_env(args.threads).items() if k != "PYTHONPATH"})
    start, phases = time.perf_counter(), {}

    def phase(name: str, t0: float) -> None:
        phases[name] = round(time.perf_counter() - t0, 1)
        log(f"{name}: {phases[name]:.0f} s")

    t0 = start
    paths = make_data(work, args.seed, sizes, args.task_style)
    phase("data", t0)
    t0 = time.perf_counter()
    student = os.path.abspath(args.student) if args.student else sft_warmup(work, paths, sizes, args)[0]
    phase("sft", t0)
    t0 = time.perf_counter()
    if args.teacher:
        teacher = os.path.abspath(args.teacher)
    else:  # the quickstart's GRPO, its sizes and schedule
        quickstart_sizes = (
            dict(QUICK) if args.quick else dict(QUICKSTART_FULL, response_length=sizes["response_length"])
        )
        args.warmup = 10
        teacher = run_rl("teacher_grpo", student, paths, quickstart_sizes, args, work, [])[0]
    phase("teacher", t0)

    t0 = time.perf_counter()
    before, teacher_acc = accuracy(student, paths, sizes), accuracy(teacher, paths, sizes)
    phase("eval_before", t0)
    log(f"held-out accuracy: student {before:.1%}, teacher {teacher_acc:.1%}")

    distill_sizes = dict(sizes, rl_steps=args.steps or sizes["rl_steps"])
    args.warmup = min(5, distill_sizes["rl_steps"])
    runs = {}
    for name, task_rewards in (("distill", False), ("distill_task", True)):
        if name not in args.runs.split(","):
            continue
        t0 = time.perf_counter()
        final, rows = run_rl(
            name, student, paths, distill_sizes, args, work, distill_overrides(args, teacher, task_rewards)
        )
        after = accuracy(final, paths, sizes)
        phase(name, t0)
        reward, val = curves(rows)
        runs[name] = {
            "use_task_rewards": task_rewards,
            "accuracy_after": after,
            "kl": kl_curve(rows),
            "val_accuracy": val,
            "train_reward": reward,
            "final_model": final,
        }
        kl = runs[name]["kl"]
        log(
            f"{name}: student {before:.1%} -> {after:.1%} ({(after - before) * 100:+.1f} points); "
            f"KL {kl[0][1]:.3f} -> {kl[-1][1]:.3f}"
            if kl
            else f"{name}: student {before:.1%} -> {after:.1%}"
        )
    main_run = runs.get("distill") or next(iter(runs.values()))
    result = {
        "seed": args.seed,
        "quick": args.quick,
        "student": student,
        "teacher": teacher,
        "teacher_accuracy": teacher_acc,
        "accuracy_before": before,
        "accuracy_after": main_run["accuracy_after"],
        "improvement": main_run["accuracy_after"] - before,
        "curves": {"kl": main_run["kl"], "val_accuracy": main_run["val_accuracy"]},
        "runs": runs,
        "distill_steps": distill_sizes["rl_steps"],
        "loss_mode": args.loss_mode,
        "topk": args.topk,
        "wall_seconds": round(time.perf_counter() - start, 1),
        "phase_seconds": phases,
        "load_average_1min": round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None,
        "cpu_count": os.cpu_count(),
    }
    with open(os.path.join(work, "distill_result.json"), "w") as f:
        json.dump(result, f, indent=1)
    log(f"wrote {os.path.join(work, 'distill_result.json')} ({result['wall_seconds']:.0f} s)")
    return result


if __name__ == "__main__":
    main()
