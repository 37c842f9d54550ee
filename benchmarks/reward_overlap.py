"""A step's wall time when each trajectory is scored as it finishes (``reward.num_workers`` processes,
veRL's reward loop) against scoring the batch after generation (``reward.num_workers=0``).

    python benchmarks/reward_overlap.py [--quick] [--steps N] [--workers K] [--cost-ms MS] [--backend inprocess|ray]

The reward is the gsm8k rule score behind a wait of ``--cost-ms`` (50) per sample, the cost of a remote
judge, a sandbox or a slow verifier that waits rather than computes. Both modes run the same GRPO
workload (tiny Qwen2, tiny arithmetic task, 16 prompts × 8 samples) in this one run, one after the
other; the table gives the median step and its phases (with overlap, gen includes the scoring that
ran alongside it) and the ratio. Goal: the step ≥ 30 % shorter with overlap.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common as C  # noqa: E402

GOAL_PCT = 30.0
SLOW_REWARD = """import time
from hybridflow.rewards.scorers import default_compute_score

def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    time.sleep({cost_s})
    return default_compute_score(data_source, solution_str, ground_truth, extra_info)
"""


def run_mode(num_workers: int, args, setup: C.GRPOSetup, data_dir: str, model_dir: str, root: str) -> list[dict]:
    """Per measured step: the step's and its phases' wall seconds, and the mean reward (same task: alike)."""
    from hybridflow.protocol import DataProto

    out_dir = os.path.join(root, f"run{num_workers}")
    overrides = C.grpo_overrides(data_dir, model_dir, out_dir, setup, args.backend, 1, args.steps + args.warmup)
    overrides += [
        f"reward.custom_reward_function.path={os.path.join(root, 'slow_reward.py')}",
        "reward.custom_reward_function.name=compute_score",
        f"reward.num_workers={num_workers}",
        f"actor_rollout_ref.rollout.agent.num_workers={args.agent_workers}",
    ]
    trainer, loader = C.build_trainer(overrides)
    try:
        batches, results = iter(loader), []
        for i in range(args.steps + args.warmup):
            trainer.global_steps += 1
            metrics = trainer.train_step(DataProto.from_single_dict(next(batches)))
            if i >= args.warmup:
                results.append({k: metrics.get(f"timing_s/{k}", 0.0) for k in ("step", "gen", "reward")})
                results[-1]["score"] = metrics["critic/score/mean"]
        return results
    finally:
        C.shutdown_trainer(trainer)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one measured step after one warm-up")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--workers", type=int, default=8, help="reward.num_workers of the overlapped mode")
    parser.add_argument("--agent-workers", type=int, default=8, help="actor_rollout_ref.rollout.agent.num_workers")
    parser.add_argument("--cost-ms", type=float, default=50.0, help="the reward's wait per sample")
    parser.add_argument("--backend", default="inprocess", choices=["inprocess", "ray"])
    args = parser.parse_args()
    if args.quick:
        args.steps, args.warmup = 1, 1
    setup = C.GRPOSetup()
    with tempfile.TemporaryDirectory() as root:
        data_dir, model_dir = C.make_assets(root, setup)
        with open(os.path.join(root, "slow_reward.py"), "w") as f:
            f.write(SLOW_REWARD.format(cost_s=args.cost_ms / 1000))
        modes = {"after generation (num_workers=0)": 0, f"overlapped (num_workers={args.workers})": args.workers}
        measured = {label: run_mode(k, args, setup, data_dir, model_dir, root) for label, k in modes.items()}
    samples = setup.prompts * setup.n
    print(
        f"\nreward_overlap: {samples} samples a step, reward {args.cost_ms:g} ms a sample "
        f"({samples * args.cost_ms / 1000:.1f} s serial), backend {args.backend}; {C.machine_line()}"
    )
    rows = [
        [label, *(C.median([r[k] for r in results]) for k in ("step", "gen", "reward", "score"))]
        for label, results in measured.items()
    ]
    C.print_table(
        f"median over {args.steps} steps (after {args.warmup} warm-up), seconds",
        ["mode", "step", "gen", "reward", "score/mean"],
        rows,
    )
    after, overlapped = rows[0][1], rows[1][1]
    cut = 100 * (1 - overlapped / after)
    print(
        f"\nratio overlapped / after generation = {overlapped / after:.3f}: step {cut:.1f} % shorter "
        f"(goal >= {GOAL_PCT:g} %) -> {'meets' if cut >= GOAL_PCT else 'MISSES'} the goal"
    )


if __name__ == "__main__":
    main()
