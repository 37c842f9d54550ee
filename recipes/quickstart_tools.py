"""Tool-use quickstart: does multi-turn RL teach a model to use a calculator? One command, a CPU.

    python recipes/quickstart_tools.py [--seed 0] [--workdir quickstart_tools_out] [--quick] [--interaction]

(``recipes/quickstart_tools.sh`` sets up the environment and calls this.) The task: 3-digit × 2-digit
multiplication (``What is 764*90?``), scored on the final ``#### N`` (gsm8k scorer). The tiny model cannot
multiply in its head; with the calculator tool (``CalculatorTool``, veRL-format tool yaml) it only has
to call it and copy the result. Phases, each timed:

1. data   the tiny Qwen2 (character tokenizer whose chat template renders tools hermes-style) and the
          task (``hybridflow.data.tiny_tool_task``): a few hundred multi-turn demonstrations, RL train
          rows (``agent_name: tool_agent``), dev and held-out test rows.
2. sft    ``python -m hybridflow.main_sft data.multiturn.enable=True``: loss on the assistant turns
          only. Part of the demonstrations call the tool, the rest answer from the head (the right
          product, which the model cannot learn), so the SFT model knows the call format but often
          does not use it. The checkpoint is picked by sampled dev behaviour: the first one whose tool
          calls copy the question and the result correctly often enough for RL to find them.
3. eval   greedy held-out accuracy through the tool agent (``greedy_agent_eval``): accuracy, the share
          of answers that called the tool, the share whose tool result was the right product.
4. rl     ``python -m hybridflow.main_ppo`` GRPO over the multi-turn ``tool_agent`` (tool results are
          tokens with mask 0), validation on held-out rows every few steps.
5. eval   the final checkpoint, exported with ``hybridflow.model_merger``, evaluated like 3.

``--interaction``: the second, short run: the same task with veRL's gsm8k interaction (a user who says
"incorrect, try again" after a wrong answer) on top of the tool, started from the SFT checkpoint; it
checks the interaction path trains end to end (turn metrics, accuracy before/after).

Writes ``<workdir>/quickstart_tools_result.json`` and ``<workdir>/quickstart_tools_curves.png``
(held-out accuracy, training reward and mean turns per step).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from quickstart import _saved_steps, child_env, export_final, log, read_metrics, run_module  # noqa: E402

FULL = dict(
    sft_size=800,
    train_size=1024,
    dev_size=64,
    test_size=200,
    sft_max_steps=600,
    sft_save_freq=25,
    sft_batch=64,
    rl_steps=40,
    test_freq=5,
    val_size=100,
    batch=8,
    n=8,
)
QUICK = dict(
    sft_size=32,
    train_size=32,
    dev_size=8,
    test_size=8,
    sft_max_steps=4,
    sft_save_freq=2,
    sft_batch=8,
    rl_steps=2,
    test_freq=1,
    val_size=8,
    batch=4,
    n=2,
)
# The model: the tiny Qwen2 with 2 layers (~0.34M parameters). Copying digits across ~40-60 tokens
# (the question into the call, the tool's result into the answer) appears suddenly in SFT: with
# 4 layers and 390-token sequences (tools as JSON schemas) it had not appeared after 8,000 sequences;
# with 2 layers and ~180-token sequences it appeared between 150 and 200 steps of 64 (both measured).
NUM_LAYERS = 2
MAX_PROMPT_LENGTH = 96  # tools block (~35 tokens) + the question
RESPONSE_LENGTH = 160  # call (73 tokens) + tool turn (58) + answer (11); a longer product or try fits
INTERACTION_RESPONSE_LENGTH = 320  # room for a hint (~95 tokens) and a second try
# SFT: stop at the first checkpoint whose sampled tool calls sometimes end in the right answer (RL finds
# the path from there). Copying appears within ~50 steps (measured, seed 0: 0% right answers of tool calls
# at step 275, 6% at 300, 48% at 325, where greedy held-out accuracy is already 77.5% and 40 GRPO steps
# added 1.5 points); a later checkpoint leaves RL nothing to show.
COPY_TARGET = 0.05


def tool_outcome(record: dict) -> dict:
    """What one conversation did: called the tool; got the right product back from it; answered right."""
    text, truth = record["response"], str(record["ground_truth"])
    return {
        "tool": "<tool_call>" in text,
        "tool_correct": f"<tool_response>\n{truth}\n</tool_response>" in text,
        "correct": record["score"] > 0,
    }


def summarize(records: list[dict]) -> dict:
    outcomes = [tool_outcome(r) for r in records]
    n = max(len(outcomes), 1)
    used = sum(o["tool"] for o in outcomes)
    return {
        "accuracy": sum(o["correct"] for o in outcomes) / n,
        "tool_share": used / n,
        "tool_correct_share": sum(o["tool_correct"] for o in outcomes) / n,
        "correct_given_tool": sum(o["tool_correct"] for o in outcomes) / max(used, 1),
        "accuracy_given_tool": sum(o["tool"] and o["correct"] for o in outcomes) / max(used, 1),
        "mean_turns": sum(r["num_turns"] for r in records) / n,
        "n": len(outcomes),
    }


def rollout_config(paths: dict, interaction: bool = False) -> dict:
    mt = {"tool_config_path": paths["tools"]}
    if interaction:
        mt["interaction_config_path"] = paths["interaction"]
    return {"multi_turn": mt}


def evaluate(
    model_dir: str,
    parquet: str,
    paths: dict,
    sizes: dict,
    interaction: bool = False,
    sample: bool = False,
    limit: int | None = None,
) -> dict:
    """Held-out (greedy) or dev (sampled at temperature 1) behaviour of a model through the tool agent."""
    from hybridflow.trainer.eval_utils import greedy_agent_eval

    response_length = INTERACTION_RESPONSE_LENGTH if interaction else RESPONSE_LENGTH
    config = rollout_config(paths, interaction)
    # sample: greedy decoding hides the tool path of a model that mostly answers directly
    _, records = greedy_agent_eval(
        model_dir,
        parquet,
        config,
        response_length=response_length,
        max_prompt_length=MAX_PROMPT_LENGTH,
        limit=limit,
        sample=sample,
    )
    return summarize(records) | {"samples": [r["response"][-120:] for r in records[:2]]}


# --------------------------------------------------------------------------------------------- data / SFT


def make_data(work: str, seed: int, sizes: dict, args) -> dict:
    import pyarrow.parquet as pq

    from hybridflow.data.tiny_tool_task import write_tiny_tool_task
    from hybridflow.models.tiny import save_tiny_model

    data_dir = os.path.join(work, "data")
    paths = write_tiny_tool_task(
        data_dir,
        seed=seed,
        sft_size=sizes["sft_size"],
        train_size=sizes["train_size"],
        test_size=sizes["dev_size"] + sizes["test_size"],
        tool_share=args.tool_share,
        interaction=args.interaction,
    )
    rows = pq.read_table(paths["test"])
    paths["dev"], paths["heldout"] = os.path.join(data_dir, "dev.parquet"), os.path.join(data_dir, "heldout.parquet")
    pq.write_table(rows.slice(0, sizes["dev_size"]), paths["dev"])
    pq.write_table(rows.slice(sizes["dev_size"]), paths["heldout"])
    paths["val"] = os.path.join(data_dir, "val.parquet")  # the RL run's periodic validation: part of held-out
    pq.write_table(rows.slice(sizes["dev_size"], sizes["val_size"]), paths["val"])
    paths["model"] = save_tiny_model(os.path.join(work, "tiny_model"), seed=seed, num_layers=NUM_LAYERS)
    return paths


def sft_warmup(work: str, paths: dict, sizes: dict, args) -> tuple[str, dict]:
    """main_sft in the background; its checkpoints are evaluated (sampled, on dev) as they appear."""
    sft_dir = os.path.join(work, "sft")
    shutil.rmtree(sft_dir, ignore_errors=True)
    batch = min(sizes["sft_batch"], sizes["sft_size"])
    cmd = [
        sys.executable,
        "-m",
        "hybridflow.main_sft",
        f"model.partial_pretrain={paths['model']}",
        f"data.train_files={paths['sft_train']}",
        f"data.val_files={paths['sft_train']}",
        "data.multiturn.enable=True",
        f"data.max_length={MAX_PROMPT_LENGTH + RESPONSE_LENGTH}",
        f"data.train_batch_size={batch}",
        f"data.micro_batch_size_per_gpu={batch}",
        f"optim.lr={args.sft_lr}",
        "optim.lr_scheduler=constant",
        "optim.warmup_steps_ratio=0.02",
        f"trainer.total_training_steps={sizes['sft_max_steps']}",
        f"trainer.save_freq={sizes['sft_save_freq']}",
        "trainer.test_freq=-1",
        "trainer.logger=[file]",
        f"trainer.default_local_dir={sft_dir}",
        f"trainer.seed={args.seed}",
        "model.strategy=none",
        f"trainer.device={args.device}",
    ]
    logfile = open(os.path.join(work, "sft.log"), "w")
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the evaluations share the cores with the SFT process
    proc = subprocess.Popen(cmd, stdout=logfile, stderr=subprocess.STDOUT, env=child_env(args.threads), cwd=REPO)
    history: dict = {}
    try:
        while True:
            finished = proc.poll() is not None
            pending = [s for s in _saved_steps(sft_dir) if s not in history]
            if pending:
                step = pending[0]  # in order: the first checkpoint that qualifies, not the newest
                history[step] = evaluate(
                    os.path.join(sft_dir, f"global_step_{step}"), paths["dev"], paths, sizes, sample=True
                )
                h = history[step]
                log(
                    f"SFT step {step}: dev (sampled) tool share {h['tool_share']:.0%}, right tool result "
                    f"{h['correct_given_tool']:.0%} and right answer {h['accuracy_given_tool']:.0%} of tool calls, "
                    f"accuracy {h['accuracy']:.0%}"
                )
                if h["accuracy_given_tool"] >= COPY_TARGET or args.quick:
                    break
            elif finished:
                break
            else:
                time.sleep(1.0)
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(timeout=60)
        logfile.close()
        torch.set_num_threads(threads)
    if not history:
        raise RuntimeError(f"SFT wrote no checkpoint (see {os.path.join(work, 'sft.log')})")
    step = max(history) if args.quick else max(history, key=lambda s: (history[s]["accuracy_given_tool"], s))
    log(f"chose SFT checkpoint global_step_{step}")
    return os.path.join(sft_dir, f"global_step_{step}"), history


# --------------------------------------------------------------------------------------------- RL


def rl_args(model: str, paths: dict, sizes: dict, run_dir: str, args) -> list[str]:
    steps = args.rl_steps or sizes["rl_steps"]
    response_length = INTERACTION_RESPONSE_LENGTH if args.interaction else RESPONSE_LENGTH
    out = [
        "algorithm.adv_estimator=grpo",
        f"actor_rollout_ref.rollout.n={sizes['n']}",
        f"data.train_files={paths['train']}",
        f"data.val_files={paths['val']}",
        f"data.train_batch_size={sizes['batch']}",
        f"data.max_prompt_length={MAX_PROMPT_LENGTH}",
        f"data.max_response_length={response_length}",
        f"data.seed={args.seed}",
        f"actor_rollout_ref.model.path={model}",
        "actor_rollout_ref.model.enable_gradient_checkpointing=False",
        f"actor_rollout_ref.actor.optim.lr={args.lr}",
        f"actor_rollout_ref.actor.optim.lr_warmup_steps={args.warmup}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={sizes['batch']}",
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={sizes['batch'] * sizes['n']}",
        "actor_rollout_ref.actor.use_kl_loss=False",
        "actor_rollout_ref.actor.entropy_coeff=0",
        "actor_rollout_ref.actor.strategy=fsdp",
        "actor_rollout_ref.actor.use_dynamic_bsz=True",
        f"actor_rollout_ref.actor.ppo_max_token_len_per_gpu={8 * (MAX_PROMPT_LENGTH + response_length)}",
        "actor_rollout_ref.rollout.name=hf",
        "actor_rollout_ref.rollout.temperature=1.0",
        f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={sizes['batch'] * sizes['n']}",
        "actor_rollout_ref.rollout.agent.num_workers=1",
        "actor_rollout_ref.rollout.multi_turn.enable=True",
        f"actor_rollout_ref.rollout.multi_turn.tool_config_path={paths['tools']}",
        "actor_rollout_ref.rollout.multi_turn.max_assistant_turns=4",
        "algorithm.use_kl_in_reward=False",
        f"trainer.total_training_steps={steps}",
        f"trainer.test_freq={sizes['test_freq']}",
        f"trainer.save_freq={steps}",
        "trainer.val_before_train=True",
        "trainer.logger=['console','file']",
        "trainer.log_val_generations=1",
        f"trainer.default_local_dir={run_dir}",
        "trainer.resume_mode=disable",
        f"trainer.backend={args.backend}",
        "trainer.n_gpus_per_node=1",
        f"trainer.device={args.device}",
        "trainer.project_name=quickstart_tools",
        f"trainer.experiment_name=grpo_tools_seed{args.seed}",
    ]
    if args.interaction:
        out += [
            f"actor_rollout_ref.rollout.multi_turn.interaction_config_path={paths['interaction']}",
            "actor_rollout_ref.rollout.multi_turn.max_user_turns=3",
        ]
    return out + list(args.rl_override)


def curves(rows: list[dict]) -> dict[str, list]:
    """Per step: held-out accuracy (validation), training reward, mean turns."""
    val = []
    for r in rows:
        keys = [k for k in r if k.startswith("val-core/") and "/reward/mean@" in k]
        if keys:
            val.append((r["step"], float(r[keys[0]])))
    reward = [(r["step"], float(r["critic/score/mean"])) for r in rows if "critic/score/mean" in r]
    turns = [(r["step"], float(r["agent/num_turns/mean"])) for r in rows if "agent/num_turns/mean" in r]
    tools = [(r["step"], float(r["agent/tool_calls"])) for r in rows if "agent/tool_calls" in r]
    return {"val_accuracy": val, "train_reward": reward, "mean_turns": turns, "tool_calls": tools}


def write_png(path: str, c: dict, title: str) -> str:
    """Two panels sharing the step axis: held-out accuracy and training reward; mean turns and tool
    calls per trajectory. matplotlib (the [plot] extra)."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    top = max([v for _, v in c["mean_turns"] + c["tool_calls"]] + [4.0])
    panels = [
        (
            "score",
            (-0.02, 1.02),
            [
                ("held-out accuracy (greedy)", c["val_accuracy"], "tab:orange"),
                ("training reward (mean)", c["train_reward"], "tab:blue"),
            ],
        ),
        (
            "per trajectory",
            (0, top * 1.05),
            [("mean turns", c["mean_turns"], "tab:green"), ("tool calls", c["tool_calls"], "tab:blue")],
        ),
    ]
    fig, axes = plt.subplots(len(panels), 1, figsize=(7, 5.2), sharex=True)
    for ax, (ylabel, ylim, series) in zip(axes, panels):
        for label, points, color in series:
            if points:
                ax.plot(*zip(*points), "o-" if len(points) < 30 else "-", color=color, label=label, markersize=3)
        ax.set(ylabel=ylabel, ylim=ylim)
        ax.grid(alpha=0.3)
        ax.legend(loc="best", fontsize=8)
    axes[0].set_title(title)
    axes[-1].set_xlabel("training step")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


# --------------------------------------------------------------------------------------------- main


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workdir", default="quickstart_tools_out")
    p.add_argument("--quick", action="store_true", help="tiny sizes and 2 RL steps: checks the plumbing only")
    p.add_argument(
        "--interaction", action="store_true", help="the second run: the gsm8k interaction on top of the tool"
    )
    p.add_argument("--rl_steps", type=int, default=None)
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--sft_lr", type=float, default=1e-3)
    p.add_argument("--tool_share", type=float, default=0.5, help="share of SFT demonstrations that call the tool")
    p.add_argument("--backend", choices=("ray", "inprocess"), default="inprocess")
    p.add_argument("--threads", type=int, default=min(2, os.cpu_count() or 1))
    p.add_argument("--device", choices=("cpu", "cuda", "auto"), default="cpu")
    p.add_argument("--sft_model", default=None, help="skip SFT: start RL from this Hugging Face directory")
    p.add_argument("--rl_override", action="append", default=[], metavar="KEY=VALUE")
    return p.parse_args(argv)


def main(argv=None) -> dict:
    args = parse(argv)
    sizes = dict(QUICK if args.quick else FULL)
    work = os.path.abspath(args.workdir)
    os.makedirs(work, exist_ok=True)
    os.environ.update({k: v for k, v in child_env(args.threads).items() if k != "PYTHONPATH"})
    import torch

    torch.set_num_threads(args.threads)
    start, phases = time.perf_counter(), {}

    def phase(name, t0):
        phases[name] = round(time.perf_counter() - t0, 1)
        log(f"{name}: {phases[name]:.0f} s")

    t0 = time.perf_counter()
    paths = make_data(work, args.seed, sizes, args)
    phase("data", t0)

    t0 = time.perf_counter()
    history = {}
    sft_model = os.path.abspath(args.sft_model) if args.sft_model else None
    if sft_model is None:
        sft_model, history = sft_warmup(work, paths, sizes, args)
    phase("sft", t0)

    t0 = time.perf_counter()
    before = evaluate(sft_model, paths["heldout"], paths, sizes, args.interaction)
    phase("eval_before", t0)
    log(
        f"held-out before RL: accuracy {before['accuracy']:.1%}, tool share {before['tool_share']:.1%}, "
        f"right tool result {before['tool_correct_share']:.1%}"
    )

    t0 = time.perf_counter()
    run_dir = os.path.join(work, "grpo_run")
    metrics_path = os.path.join(work, "grpo_metrics.jsonl")
    shutil.rmtree(run_dir, ignore_errors=True)
    if os.path.exists(metrics_path):
        os.remove(metrics_path)
    run_module(
        "hybridflow.main_ppo",
        rl_args(sft_model, paths, sizes, run_dir, args),
        child_env(args.threads, HYBRIDFLOW_FILE_LOGGER_PATH=metrics_path),
        os.path.join(work, "grpo.log"),
    )
    phase("rl", t0)

    t0 = time.perf_counter()
    args.algo = "grpo"  # export_final's name for the exported directory
    final_model = export_final(run_dir, work, args)
    after = evaluate(final_model, paths["heldout"], paths, sizes, args.interaction)
    phase("eval_after", t0)

    rows = read_metrics(metrics_path)
    c = curves(rows)
    png = os.path.join(work, "quickstart_tools_curves.png")
    title = "GRPO with a calculator tool" + (" and the gsm8k interaction" if args.interaction else "")
    write_png(png, c, title)
    last = rows[-1] if rows else {}
    result = {
        "seed": args.seed,
        "quick": args.quick,
        "interaction": args.interaction,
        "before": before,
        "after": after,
        "improvement": after["accuracy"] - before["accuracy"],
        "steps": max((r["step"] for r in rows), default=0),
        "wall_seconds": round(time.perf_counter() - start, 1),
        "phase_seconds": phases,
        "sft_checkpoint": sft_model,
        "sft_dev": {
            str(k): {kk: v[kk] for kk in ("tool_share", "correct_given_tool", "accuracy_given_tool", "accuracy")}
            for k, v in history.items()
        },
        "heldout_prompts": sizes["test_size"],
        "curves": c,
        "png": png,
        "last_step_agent_metrics": {k: v for k, v in last.items() if k.startswith("agent/")},
        "rl_overrides": rl_args(sft_model, paths, sizes, run_dir, args),
        "final_model": final_model,
    }
    with open(os.path.join(work, "quickstart_tools_result.json"), "w") as f:
        json.dump(result, f, indent=1)
    log(
        f"held-out accuracy {before['accuracy']:.1%} -> {after['accuracy']:.1%} "
        f"({(after['accuracy'] - before['accuracy']) * 100:+.1f} points); right tool use "
        f"{before['tool_correct_share']:.1%} -> {after['tool_correct_share']:.1%}; tool share "
        f"{before['tool_share']:.1%} -> {after['tool_share']:.1%}; {result['steps']} GRPO steps; total "
        f"{result['wall_seconds']:.0f} s; wrote {png}"
    )
    return result


if __name__ == "__main__":
    main()
