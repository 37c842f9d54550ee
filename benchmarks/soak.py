"""Soak: many GRPO steps on the tiny model, printing driver and worker RSS every 50 steps.

Goal (issue 6): no RSS growth beyond 5% after step 50. Prints a table and the growth ratio
(RSS at the last report / RSS at step 50) for the driver and each worker process.

    python benchmarks/soak.py --steps 300 --backend ray --workers 2
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import psutil

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from hybridflow.data.tiny_task import write_tiny_task  # noqa: E402
from hybridflow.main_ppo import build_trainer  # noqa: E402
from hybridflow.utils.config import load_config  # noqa: E402
from hybridflow.utils.tiny_model import save_tiny_model  # noqa: E402

TOY_REWARD = '''
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return sum(c.isdigit() for c in solution_str) / max(len(solution_str), 1)
'''


def rss_mb(pid: int) -> float:
    return psutil.Process(pid).memory_info().rss / 2**20


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--every", type=int, default=50)
    ap.add_argument("--backend", choices=["ray", "inprocess"], default="ray")
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args(argv)

    work = tempfile.mkdtemp(prefix="hf_soak_")
    model_dir = save_tiny_model(os.path.join(work, "model"), seed=0)
    write_tiny_task(os.path.join(work, "data"), seed=0, train_size=512, test_size=16)
    reward = os.path.join(work, "reward.py")
    with open(reward, "w") as fh:
        fh.write(TOY_REWARD)
    data = os.path.join(work, "data")
    config = load_config("ppo_trainer", [
        "algorithm.adv_estimator=grpo", f"data.train_files={data}/train.parquet", f"data.val_files={data}/test.parquet",
        "data.train_batch_size=8", "data.max_prompt_length=128", "data.max_response_length=16",
        f"actor_rollout_ref.model.path={model_dir}", "actor_rollout_ref.model.enable_gradient_checkpointing=False",
        "actor_rollout_ref.actor.optim.lr=1e-5", "actor_rollout_ref.actor.ppo_mini_batch_size=8",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16", "actor_rollout_ref.rollout.n=4",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16",
        f"trainer.total_training_steps={args.steps}", "trainer.test_freq=-1", "trainer.save_freq=-1",
        "trainer.val_before_train=False", "trainer.logger=[]", f"trainer.default_local_dir={work}/ckpt",
        f"trainer.backend={args.backend}", f"trainer.n_gpus_per_node={args.workers if args.backend == 'ray' else 1}",
        f"custom_reward_function.path={reward}",
    ])
    trainer = build_trainer(config)
    trainer.init_workers()
    group = trainer._all_groups.get("_fused", trainer.actor_rollout_wg)
    pids = group.execute_all_sync("get_pid")
    procs = {"driver": os.getpid(), **{f"worker{r}": pid for r, pid in enumerate(pids) if pid != os.getpid()}}

    rows: list[tuple[int, float, dict[str, float]]] = []
    step_fn = trainer.train_step
    start = time.perf_counter()

    def train_step(batch):
        out = step_fn(batch)
        if trainer.global_steps % args.every == 0:
            rows.append((trainer.global_steps, time.perf_counter() - start, {k: rss_mb(p) for k, p in procs.items()}))
            print(f"step {trainer.global_steps}: " + ", ".join(f"{k} {v:.0f} MB" for k, v in rows[-1][2].items()), flush=True)
        return out

    trainer.train_step = train_step
    try:
        trainer.fit()
    finally:
        trainer.shutdown_workers()

    names = list(procs)
    print(f"\nsoak: {args.steps} GRPO steps, backend={args.backend}, workers={len(pids)}")
    print(f"{'step':>6} {'elapsed_s':>10} " + " ".join(f"{n + '_MB':>12}" for n in names))
    for step, elapsed, rss in rows:
        print(f"{step:>6} {elapsed:>10.1f} " + " ".join(f"{rss[n]:>12.1f}" for n in names))
    if len(rows) >= 2:
        base = rows[0][2]
        print("\ngrowth after step", rows[0][0], "(last / first report; goal <= 1.05):")
        for n in names:
            ratio = rows[-1][2][n] / base[n]
            print(f"  {n}: {ratio:.3f} {'OK' if ratio <= 1.05 else 'ABOVE GOAL'}")


if __name__ == "__main__":
    main()
