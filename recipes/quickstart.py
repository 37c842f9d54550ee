"""Quickstart: does RL improve a model with hybridflow? One command, a CPU, about 5 minutes on 2 idle cores.

    python recipes/quickstart.py [--algo grpo|ppo] [--seed 0] [--workdir quickstart_out] [--quick]

(``recipes/quickstart.sh`` sets up the environment and calls this.) Phases, each timed (wall and CPU
seconds of every process involved, printed as a table at the end):

1. data   the built-in tiny Qwen2 (~0.6M parameters, character tokenizer) and the GSM8K-format
          2-digit arithmetic task (``hybridflow.data.tiny_task``, worked solutions written out digit by
          digit: ``6+9=15, 5+1+1=7, so 75\n#### 75``), seeded. The test split is cut in two: 100 "dev"
          prompts pick the SFT checkpoint, 200 held-out prompts measure before/after.
2. sft    ``python -m hybridflow.main_sft`` warms the random model up (lr 1e-3, 32 rows per step; 64 for
          PPO). Accuracy stays near 0 for ~400 steps and then climbs within ~150 steps, so the checkpoint is
          chosen by greedy dev accuracy (the first one in the 40-65% band), not by step count: RL
          needs room to improve, and checkpoints from earlier in the climb sample right answers too
          rarely at temperature 1 for GRPO to learn fast. Each checkpoint (every 25 steps) is first
          screened on 25 dev prompts (at most 4 right: below the band, the other 75 are not decoded),
          with the SFT process paused meanwhile so that the two never share the cores.
3. eval   greedy accuracy of that checkpoint on the 200 held-out prompts (gsm8k scorer, "#### N").
4. rl     ``python -m hybridflow.main_ppo``, 125 steps (PPO 150), its one worker inside main_ppo's process
          (no Ray start-up: ``trainer.backend=inprocess``, ``--backend ray`` for Ray). GRPO: 16 prompts × 8
          samples; PPO: 128 prompts × 1 sample, gae (γ = λ = 1) with a critic started from the SFT weights. Both: actor
          lr 1e-4 with 10 warm-up steps and cosine decay to 1e-5, no KL, temperature 1, one update per
          batch, so (in the default synchronous mode) the rollout's log-probs are π_old
          (``rollout_correction.bypass_mode``: no extra forward pass), validation every 25 steps,
          metrics to jsonl. (Constant lr 2e-4 or more
          collapsed the tiny policy to 0%, in a bare torch loop as well: the warm-up/decay keeps the
          final checkpoint off the noisy plateau the constant-lr runs ended on.)
5. eval   the final checkpoint exported with ``hybridflow.model_merger``'s merge and evaluated like 3.

Writes ``<workdir>/quickstart_result.json`` (accuracy_before, accuracy_after, steps, wall_seconds,
phase_seconds, phase_cpu_seconds, load averages, ...) and ``<workdir>/quickstart_curves.png`` (training
reward and validation accuracy per step, drawn with matplotlib: redrawn after every validation while RL
runs, so it can be watched, and once more at the end; ``python -m hybridflow.plot
<workdir>/<algo>_metrics.jsonl`` redraws it).

Measured (GRPO, 2 idle cores, 2026-11-28): seeds 0/1 48.5->88.5 / 41.5->80.0% (+40.0/+38.5 points) in 279/289 s
(seed 0: SFT 115 s, 125 steps at a median 1.09 s); the earlier sizes (64-row SFT steps, 150 RL steps) in the same
hour: 47.0->79.0% (+32.0) in 382 s. Why 32 rows: the SFT reaches the band in more steps (550 against 400) but each
costs half, and its checkpoint learns faster under GRPO (+31 points in 25 steps against +14).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

# sizes of the full recipe and of --quick (a smoke test: no accuracy target)
FULL = dict(
    train_size=2048,
    dev_size=100,
    test_size=200,
    sft_max_steps=1200,
    sft_save_freq=25,
    sft_batch=32,
    rl_steps=125,
    test_freq=25,
    batch=16,
    n=8,
    response_length=40,
)
QUICK = dict(
    train_size=64,
    dev_size=8,
    test_size=8,
    sft_max_steps=4,
    sft_save_freq=2,
    sft_batch=64,
    rl_steps=2,
    test_freq=1,
    batch=4,
    n=2,
    response_length=8,
)
# PPO's figures were measured with the earlier sizes (64-row SFT steps, 150 RL steps); GRPO's with FULL's
PPO_SIZES = dict(sft_batch=64, rl_steps=150)
BAND = (0.40, 0.65)  # SFT dev accuracy that leaves room to improve
# an SFT checkpoint is first screened on this many dev prompts; at most SCREEN_PASS of them right means
# below the band (P(<= 4 of 25 | 40%) = 1%), and the rest of the dev prompts are not decoded
SCREEN, SCREEN_PASS = 25, 4
MAX_PROMPT_LENGTH = 112  # tokens: the longest tiny-task prompt is ~100 characters = tokens
# the longest worked solution + EOS: ~30 tokens for 'steps', ~17 for 'direct'
FULL_RESPONSE_LENGTH = {"steps": 40, "direct": 24}


def recipe_sizes(args) -> dict:
    """The sizes of this run: --quick or the full recipe, the response length of the task style,
    and --batch/--n where given."""
    sizes = dict(QUICK) if args.quick else dict(FULL, response_length=FULL_RESPONSE_LENGTH[args.task_style])
    if args.algo == "ppo" and not args.quick:
        sizes.update(PPO_SIZES)
    sizes.update({k: v for k, v in (("batch", args.batch), ("n", args.n), ("sft_batch", args.sft_batch)) if v})
    return sizes


def log(msg: str) -> None:
    print(f"[quickstart {time.strftime('%H:%M:%S')}] {msg}", flush=True)


class CPUClock:
    """CPU seconds (user + system) of this process and of every process it started, Ray's workers
    included: a daemon thread samples the process tree every ``interval`` seconds and keeps each
    process's latest figure, so a process that ends between two samples loses at most its last
    ``interval``. On a machine shared with other jobs the wall time says little; this does."""

    def __init__(self, interval: float = 1.0):
        self._cpu: dict[tuple[int, float], float] = {}
        self._lock = threading.Lock()
        try:
            import psutil

            self._root = psutil.Process()
        except Exception:  # no psutil: CPU seconds are reported as None
            self._root = None
            return
        self._stop = threading.Event()
        threading.Thread(target=self._run, args=(interval,), daemon=True, name="quickstart-cpu-clock").start()

    def _run(self, interval: float) -> None:
        while not self._stop.wait(interval):
            self._sample()

    def _sample(self) -> None:
        import psutil

        try:
            procs = [self._root, *self._root.children(recursive=True)]
        except psutil.Error:
            return
        for proc in procs:
            try:
                key, times = (proc.pid, proc.create_time()), proc.cpu_times()
            except psutil.Error:
                continue
            with self._lock:
                self._cpu[key] = times.user + times.system

    def seconds(self) -> float | None:
        if self._root is None:
            return None
        self._sample()
        with self._lock:
            return sum(self._cpu.values())


def child_env(threads: int, **extra) -> dict:
    env = dict(
        os.environ,
        OMP_NUM_THREADS=str(threads),
        MKL_NUM_THREADS=str(threads),
        TOKENIZERS_PARALLELISM="false",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
    )
    env["PYTHONPATH"] = os.pathsep.join(p for p in (REPO, env.get("PYTHONPATH", "")) if p)
    env.update(extra)
    return env


def run_module(module: str, args: list[str], env: dict, logfile: str) -> None:
    """Run ``python -m module args`` to completion; its output goes to ``logfile`` (tail shown on failure)."""
    with open(logfile, "w") as out:
        code = subprocess.call(
            [sys.executable, "-m", module, *args], stdout=out, stderr=subprocess.STDOUT, env=env, cwd=REPO
        )
    if code != 0:
        with open(logfile) as f:
            tail = f.read()[-3000:]
        raise RuntimeError(f"python -m {module} failed with exit code {code}; last output ({logfile}):\n{tail}")


# --------------------------------------------------------------------------------------------- data


def make_data(work: str, seed: int, sizes: dict, style: str = "direct") -> dict:
    import pyarrow.parquet as pq

    from hybridflow.data.tiny_task import write_tiny_task
    from hybridflow.models.tiny import save_tiny_model

    data_dir = os.path.join(work, "data")
    paths = write_tiny_task(
        data_dir,
        seed=seed,
        train_size=sizes["train_size"],
        test_size=sizes["dev_size"] + sizes["test_size"],
        style=style,
    )
    rows = pq.read_table(paths["test"])
    paths["dev"] = os.path.join(data_dir, "dev.parquet")
    paths["heldout"] = os.path.join(data_dir, "heldout.parquet")
    pq.write_table(rows.slice(0, sizes["dev_size"]), paths["dev"])
    pq.write_table(rows.slice(sizes["dev_size"]), paths["heldout"])
    paths["model"] = save_tiny_model(os.path.join(work, "tiny_model"), seed=seed)
    return paths


# --------------------------------------------------------------------------------------------- SFT


def _saved_steps(sft_dir: str) -> list[int]:
    """Steps whose HF directory is complete (latest_checkpointed_iteration.txt is written after it)."""
    latest = os.path.join(sft_dir, "latest_checkpointed_iteration.txt")
    if not os.path.isfile(latest):
        return []
    with open(latest) as f:
        text = f.read().strip()
    last = int(text) if text.isdigit() else -1
    steps = [int(p.rsplit("_", 1)[-1]) for p in glob.glob(os.path.join(sft_dir, "global_step_*"))]
    return sorted(s for s in steps if s <= last)


def choose_checkpoint(history: dict[int, float], band=BAND) -> int:
    """The first step in the band; else the step closest to the band's middle."""
    for step in sorted(history):
        if band[0] <= history[step] <= band[1]:
            return step
    middle = sum(band) / 2
    return min(sorted(history), key=lambda s: abs(history[s] - middle))


def sft_warmup(work: str, paths: dict, sizes: dict, args) -> tuple[str, dict[int, float]]:
    """Run main_sft in the background, evaluate its checkpoints as they appear, stop in the band.

    While a checkpoint is evaluated the SFT process is paused (SIGSTOP/SIGCONT where the platform has
    them), so the evaluation and the training never share the cores: 2 SFT threads + 1 evaluation
    thread on 2 cores made every SFT step wait for a descheduled OpenMP thread. Returns the chosen
    checkpoint and {step: dev accuracy} of the checkpoints evaluated on all dev prompts."""
    from hybridflow.trainer.eval_utils import greedy_accuracy

    sft_dir = os.path.join(work, "sft")
    shutil.rmtree(sft_dir, ignore_errors=True)  # checkpoints of an earlier run must not be picked
    cmd = [
        sys.executable,
        "-m",
        "hybridflow.main_sft",
        f"model.partial_pretrain={paths['model']}",
        f"data.train_files={paths['sft_train']}",
        f"data.val_files={paths['sft_test']}",
        "data.prompt_key=question",
        "data.response_key=answer",
        "data.prompt_dict_keys=[]",
        "data.response_dict_keys=[]",
        "data.max_length=160",
        f"data.train_batch_size={min(sizes['sft_batch'], sizes['train_size'])}",
        f"data.micro_batch_size_per_gpu={min(sizes['sft_batch'], sizes['train_size'])}",
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
        # the values the SFT band was measured with (veRL 0.9.1's SFT defaults differ: betas 0.999, checkpointing on)
        "optim.betas=[0.9,0.95]",
        "model.enable_gradient_checkpointing=False",
    ]
    logfile = os.path.join(work, "sft.log")
    out = open(logfile, "w")
    proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=child_env(args.threads), cwd=REPO)
    can_pause = hasattr(signal, "SIGSTOP")
    # the first evaluation's one-off cost (imports, the rollout server's set-up: ~5 CPU s) is paid now,
    # while the SFT process starts up, rather than with the SFT paused
    greedy_accuracy(paths["model"], paths["dev"], limit=1, response_length=2, max_prompt_length=MAX_PROMPT_LENGTH)
    history: dict[int, float] = {}  # full dev set
    screened: dict[int, float] = {}  # only the first SCREEN dev prompts: below the band

    def accuracy(step: int, limit: int | None) -> float:
        return greedy_accuracy(
            os.path.join(sft_dir, f"global_step_{step}"),
            paths["dev"],
            limit=limit,
            response_length=sizes["response_length"],
            max_prompt_length=MAX_PROMPT_LENGTH,
        )

    def evaluate(step: int) -> float:
        paused = can_pause and proc.poll() is None
        if paused:
            proc.send_signal(signal.SIGSTOP)
        try:
            if sizes["dev_size"] > 2 * SCREEN:
                first = accuracy(step, SCREEN)
                if first * SCREEN <= SCREEN_PASS:
                    screened[step] = first
                    log(f"SFT step {step}: dev accuracy {first:.0%} on the first {SCREEN} prompts")
                    return first
            acc = history[step] = accuracy(step, None)
        finally:
            if paused:
                proc.send_signal(signal.SIGCONT)
        log(f"SFT step {step}: dev accuracy {acc:.1%}")
        return acc

    try:
        while True:
            finished = proc.poll() is not None
            pending = [s for s in _saved_steps(sft_dir) if s not in history and s not in screened]
            if pending:
                acc = evaluate(pending[-1])  # the newest: skipped ones are revisited on overshoot
                if acc >= BAND[0] or args.quick:
                    break
            elif finished:
                break
            else:
                time.sleep(0.5)
    finally:
        if proc.poll() is None:
            if can_pause:
                proc.send_signal(signal.SIGCONT)
            proc.terminate()
            proc.wait(timeout=60)
        out.close()
    if proc.returncode not in (0, None, -15) and not history and not screened:
        with open(logfile) as f:
            raise RuntimeError(f"SFT failed ({logfile}):\n{f.read()[-3000:]}")
    if history and max(history.values()) > BAND[1]:  # jumped over the band: look at skipped checkpoints
        top = max(history, key=history.get)
        below = max([s for s in {**history, **screened} if s < top], default=0)
        for step in [s for s in _saved_steps(sft_dir) if below < s < top and s not in history]:
            if BAND[0] <= evaluate(step) <= BAND[1]:
                break
    if not history and not screened:
        raise RuntimeError(f"SFT wrote no checkpoint (see {logfile})")
    step = choose_checkpoint(history or screened)
    log(f"chose SFT checkpoint global_step_{step} (dev accuracy {(history or screened)[step]:.1%})")
    return os.path.join(sft_dir, f"global_step_{step}"), history


# --------------------------------------------------------------------------------------------- RL


def rl_args(algo: str, model: str, paths: dict, sizes: dict, run_dir: str, args) -> list[str]:
    """veRL-style overrides for main_ppo (the calibration's sizes: 16 prompts × 8 samples, lr 1e-4, no KL)."""
    steps = args.rl_steps or sizes["rl_steps"]
    common = [
        f"data.train_files={paths['train']}",
        f"data.val_files={paths['heldout']}",
        f"data.train_batch_size={sizes['batch']}",
        f"data.max_prompt_length={MAX_PROMPT_LENGTH}",
        f"data.max_response_length={sizes['response_length']}",
        f"data.seed={args.seed}",
        f"actor_rollout_ref.model.path={model}",
        "actor_rollout_ref.model.enable_gradient_checkpointing=False",
        # padded forward passes, as measured (veRL 0.9.1 turns use_remove_padding on by default)
        "actor_rollout_ref.model.use_remove_padding=False",
        "critic.model.use_remove_padding=False",
        f"actor_rollout_ref.actor.optim.lr={args.lr}",
        f"actor_rollout_ref.actor.optim.lr_warmup_steps={args.warmup}",
        f"actor_rollout_ref.actor.optim.warmup_style={args.lr_schedule}",
        "actor_rollout_ref.actor.optim.min_lr_ratio=0.1",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={sizes['batch']}",
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={sizes['batch'] * sizes['n'] // sync_steps(args.mode)}",
        "actor_rollout_ref.actor.use_kl_loss=False",
        "actor_rollout_ref.actor.entropy_coeff=0",
        "actor_rollout_ref.actor.strategy=fsdp",
        "actor_rollout_ref.rollout.name=hf",
        "actor_rollout_ref.rollout.temperature=1.0",
        f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={sizes['batch'] * sizes['n']}",
        # one agent loop process: the rollout is one server in one worker (each process costs ~5 CPU s to start)
        "actor_rollout_ref.rollout.agent.num_workers=1",
        "algorithm.use_kl_in_reward=False",
        f"trainer.total_training_steps={steps}",
        f"trainer.test_freq={sizes['test_freq']}",
        f"trainer.save_freq={steps}",
        "trainer.val_before_train=True",
        "trainer.logger=['console','file','plot']",
        "trainer.log_val_generations=2",
        f"trainer.default_local_dir={run_dir}",
        "trainer.resume_mode=disable",
        f"trainer.backend={args.backend}",
        "trainer.n_gpus_per_node=1",
        f"trainer.device={args.device}",
        "trainer.project_name=quickstart",
        f"trainer.experiment_name={algo}_seed{args.seed}",
    ]
    if args.mode == "sync":
        # one update per batch (mini-batch = batch, 1 epoch) is on-policy: pi_old is the policy that
        # sampled, so the rollout's own log-probs serve as pi_old and the extra forward pass is skipped
        common += [
            "actor_rollout_ref.rollout.calculate_log_probs=True",
            "algorithm.rollout_correction.bypass_mode=True",
        ]
    common += async_args(args.mode, sizes["batch"] if algo == "grpo" else sizes["batch"] * sizes["n"])
    if algo == "grpo":
        return ["algorithm.adv_estimator=grpo", f"actor_rollout_ref.rollout.n={sizes['n']}", *common, *args.rl_override]
    # PPO: one sample per prompt would give 16 samples per step; keep the sample budget of GRPO by
    # taking batch × n prompts with n=1, and learn a value function from the SFT model's weights
    return [
        "algorithm.adv_estimator=gae",
        "algorithm.gamma=1.0",
        "algorithm.lam=1.0",
        "actor_rollout_ref.rollout.n=1",
        f"critic.model.path={model}",
        "critic.model.enable_gradient_checkpointing=False",
        f"critic.optim.lr={args.critic_lr}",
        f"critic.ppo_micro_batch_size_per_gpu={sizes['batch'] * sizes['n'] // sync_steps(args.mode)}",
        f"trainer.critic_warmup={args.critic_warmup}",
        *[
            a
            for a in common
            if not a.startswith(("data.train_batch_size", "actor_rollout_ref.actor.ppo_mini_batch_size"))
        ],
        f"data.train_batch_size={sizes['batch'] * sizes['n']}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={sizes['batch'] * sizes['n'] // sync_steps(args.mode)}",
        *args.rl_override,
    ]


def rl_threads(args) -> int:
    """Torch threads per RL process: the asynchronous modes run the trainer and the rollout side by side,
    so they share the threads (2 processes x 2 threads on 2 cores made a one-step-off step 2.5x slower)."""
    return args.threads if args.mode in ("sync", "colocate_async") else max(1, args.threads // 2)


def sync_steps(mode: str) -> int:
    """Mini-batch updates between weight syncs: separate_async's parameter_sync_step, else one a step."""
    return 2 if mode == "separate_async" else 1


def async_args(mode: str, prompts_per_step: int) -> list[str]:
    """The schedule (``async_training.mode``): sync keeps the colocated hybrid engine; the asynchronous
    modes put the rollout on a worker of its own (one more CPU) and train the same prompts per step."""
    if mode == "sync":
        return []
    if mode == "colocate_async":  # generation runs ahead by one warm-up batch on the colocated engine
        return ["trainer.v1.trainer_mode=colocate_async"]
    if mode == "separate_async":  # two mini-batches a step, pi_old the weights of the step's start
        return [
            "actor_rollout_ref.rollout.nnodes=1",
            "actor_rollout_ref.rollout.n_gpus_per_node=1",
            "trainer.v1.trainer_mode=separate_async",
            f"trainer.v1.separate_async.parameter_sync_step={sync_steps(mode)}",
            f"actor_rollout_ref.actor.ppo_mini_batch_size={prompts_per_step // sync_steps(mode)}",
        ]
    separate = [
        "actor_rollout_ref.rollout.nnodes=1",
        "actor_rollout_ref.rollout.n_gpus_per_node=1",
        f"async_training.mode={mode}",
    ]
    if mode == "one_step_off":
        return separate
    # a step takes require_batches × ppo_mini_batch_size prompts: one mini-batch of the whole step
    return [
        *separate,
        "async_training.staleness_threshold=1",
        "async_training.trigger_parameter_sync_step=1",
        "async_training.partial_rollout=True",
        "async_training.require_batches=1",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={prompts_per_step}",
    ]


def read_metrics(path: str) -> list[dict]:
    if not os.path.isfile(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def curves(rows: list[dict]) -> tuple[list[tuple[int, float]], list[tuple[int, float]]]:
    """(training reward per step, validation accuracy per step) from the trainer's jsonl metrics."""
    reward = [(r["step"], float(r["critic/score/mean"])) for r in rows if "critic/score/mean" in r]
    val = []
    for r in rows:
        keys = [k for k in r if k.startswith("val-core/") and "/reward/mean@" in k]
        if keys:
            val.append((r["step"], float(r[keys[0]])))
    return reward, val


def export_final(run_dir: str, work: str, args) -> str:
    """The last RL checkpoint as a Hugging Face directory (``hybridflow.model_merger``'s merge, called
    here rather than as ``python -m hybridflow.model_merger merge ...``: one process start less)."""
    from hybridflow.model_merger import merge_checkpoint
    from hybridflow.trainer.checkpoint import complete_steps

    steps = complete_steps(run_dir)
    if not steps:
        raise RuntimeError(f"the RL run saved no checkpoint in {run_dir}")
    target = os.path.join(work, f"{args.algo}_final_hf")
    merge_checkpoint(os.path.join(run_dir, f"global_step_{max(steps)}", "actor"), target, backend="fsdp")
    return target


# --------------------------------------------------------------------------------------------- main


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--algo", choices=("grpo", "ppo"), default="grpo")
    p.add_argument("--seed", type=int, default=0, help="seeds the model init, the data, SFT and the RL data order")
    p.add_argument(
        "--data_seed",
        type=int,
        default=None,
        help="seed of the task data (default: --seed); keep it "
        "equal to the SFT run's when reusing a checkpoint with --sft_model, so held-out stays held out",
    )
    p.add_argument("--workdir", default="quickstart_out")
    p.add_argument("--quick", action="store_true", help="tiny sizes and 2 RL steps: checks the plumbing only")
    p.add_argument("--rl_steps", type=int, default=None, help="RL steps (default 125; 150 for ppo; 2 with --quick)")
    p.add_argument("--lr", type=float, default=1e-4, help="actor learning rate")
    p.add_argument("--critic_lr", type=float, default=5e-4)
    p.add_argument("--critic_warmup", type=int, default=2)
    p.add_argument("--sft_lr", type=float, default=1e-3)
    p.add_argument("--sft_batch", type=int, default=None, help="SFT rows per step (default 32; 64 for ppo)")
    p.add_argument(
        "--backend",
        choices=("ray", "inprocess"),
        default=None,
        help="trainer.backend of the RL run (default: inprocess for --mode sync, whose one colocated worker then "
        "runs in main_ppo's process: the same numbers as ray without Ray's start-up and its processes, ~65 CPU s; "
        "ray for the other modes)",
    )
    p.add_argument(
        "--mode",
        choices=("sync", "one_step_off", "fully_async", "colocate_async", "separate_async"),
        default="sync",
        help="async_training.mode, or veRL's V1 trainer.v1.trainer_mode (colocate_async, separate_async); "
        "all but sync and colocate_async generate on a separate rollout worker",
    )
    p.add_argument(
        "--threads",
        type=int,
        default=min(2, os.cpu_count() or 1),
        help="torch threads of the SFT and RL processes (default: 2 where there are 2 cores; on a 2-core "
        "machine shared with other jobs 1 is faster)",
    )
    p.add_argument(
        "--batch", type=int, default=None, help="GRPO prompts per step (default 16; PPO takes batch × n prompts)"
    )
    p.add_argument("--n", type=int, default=None, help="GRPO samples per prompt (default 8)")
    p.add_argument(
        "--rl_override",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra main_ppo override, appended last (repeatable), e.g. algorithm.norm_adv_by_std_in_grpo=False",
    )
    p.add_argument("--warmup", type=int, default=10, help="actor lr warm-up steps")
    p.add_argument(
        "--lr_schedule",
        choices=("cosine", "constant"),
        default="cosine",
        help="actor lr after warm-up: cosine decay to 0.1 x lr (default) or constant",
    )
    p.add_argument(
        "--task_style",
        choices=("direct", "steps"),
        default="steps",
        help="worked solutions as '56+19=75' (direct) or written out digit by digit (steps)",
    )
    p.add_argument(
        "--device",
        choices=("cpu", "cuda", "auto"),
        default="cpu",
        help="where SFT and RL run (the evaluations use the GPU whenever torch sees one)",
    )
    p.add_argument("--sft_model", default=None, help="skip SFT: start RL from this Hugging Face directory")
    args = p.parse_args(argv)
    args.backend = args.backend or ("inprocess" if args.mode == "sync" else "ray")
    return args


def require_matplotlib() -> None:
    """The figure is the recipe's last output: find out before the 10 minutes, not after."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise SystemExit(
            "the quickstart draws its curves with matplotlib, which is not installed: "
            "pip install matplotlib (it is in requirements-cpu.txt and the [plot] extra)"
        ) from None


def phase_table(phases: dict, cpu: dict, setup: float | None, load: tuple[float, float], threads: int) -> str:
    """The per-phase wall and CPU seconds as printed at the end of a run."""
    lines = [f"{'phase':<14}{'wall s':>9}{'CPU s':>9}"]
    if setup is not None:
        lines.append(f"{'setup check':<14}{setup:>9.1f}{'':>9}")
    for name, wall in phases.items():
        lines.append(
            f"{name:<14}{wall:>9.1f}{cpu[name]:>9.1f}"
            if cpu.get(name) is not None
            else f"{name:<14}{wall:>9.1f}{'':>9}"
        )
    total_cpu = sum(v for v in cpu.values() if v is not None) if cpu else None
    total = sum(phases.values()) + (setup or 0.0)
    lines.append(f"{'total':<14}{total:>9.1f}" + (f"{total_cpu:>9.1f}" if total_cpu is not None else ""))
    lines.append(
        f"({os.cpu_count()} CPU cores, {threads} torch threads per process; 1-minute load average "
        f"{load[0]:.2f} at the start, {load[1]:.2f} at the end: above ~0.5 the machine was shared "
        "and the wall times are too)"
    )
    return "\n".join(lines)


def _load_average() -> float:
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")


def main(argv=None) -> dict:
    args = parse(argv)
    require_matplotlib()
    sizes = recipe_sizes(args)
    work = os.path.abspath(args.workdir)
    os.makedirs(work, exist_ok=True)
    os.environ.update({k: v for k, v in child_env(args.threads).items() if k != "PYTHONPATH"})
    load_start, clock = _load_average(), CPUClock()
    start, phases, cpu = time.perf_counter(), {}, {}
    import torch

    torch.set_num_threads(args.threads)
    from hybridflow.trainer.eval_utils import greedy_accuracy
    from hybridflow.utils.plotting import draw_curves

    def phase(name, t0, c0):
        phases[name] = round(time.perf_counter() - t0, 1)
        c1 = clock.seconds()
        cpu[name] = round(c1 - c0, 1) if c1 is not None and c0 is not None else None
        log(f"{name}: {phases[name]:.0f} s" + (f" ({cpu[name]:.0f} CPU s)" if cpu[name] is not None else ""))

    t0, c0 = start, clock.seconds()  # "data" includes this process's imports
    paths = make_data(work, args.seed if args.data_seed is None else args.data_seed, sizes, args.task_style)
    phase("data", t0, c0)

    t0, c0 = time.perf_counter(), clock.seconds()
    history = {}
    if args.sft_model:
        sft_model = os.path.abspath(args.sft_model)
    else:
        sft_model, history = sft_warmup(work, paths, sizes, args)
    phase("sft", t0, c0)

    t0, c0 = time.perf_counter(), clock.seconds()
    before = greedy_accuracy(
        sft_model, paths["heldout"], response_length=sizes["response_length"], max_prompt_length=MAX_PROMPT_LENGTH
    )
    phase("eval_before", t0, c0)
    log(f"held-out greedy accuracy before {args.algo.upper()}: {before:.1%}")

    t0, c0 = time.perf_counter(), clock.seconds()
    run_dir = os.path.join(work, f"{args.algo}_run")
    metrics_path = os.path.join(work, f"{args.algo}_metrics.jsonl")
    shutil.rmtree(run_dir, ignore_errors=True)  # a previous run's checkpoints would be resumed or exported
    if os.path.exists(metrics_path):
        os.remove(metrics_path)
    png = os.path.join(work, "quickstart_curves.png")
    run_module(
        "hybridflow.main_ppo",
        rl_args(args.algo, sft_model, paths, sizes, run_dir, args),
        child_env(rl_threads(args), HYBRIDFLOW_FILE_LOGGER_PATH=metrics_path, HYBRIDFLOW_PLOT_PATH=png),
        os.path.join(work, f"{args.algo}.log"),
    )
    phase("rl", t0, c0)

    t0, c0 = time.perf_counter(), clock.seconds()
    final_model = export_final(run_dir, work, args)
    after, samples = greedy_accuracy(
        final_model,
        paths["heldout"],
        response_length=sizes["response_length"],
        max_prompt_length=MAX_PROMPT_LENGTH,
        return_samples=3,
    )
    phase("eval_after", t0, c0)

    rows = read_metrics(metrics_path)
    reward, val = curves(rows)
    draw_curves(
        png,
        {"training reward (mean)": reward, "validation accuracy (greedy)": val},
        title=f"{args.algo.upper()} on the tiny arithmetic task",
    )
    setup = float(os.environ["QUICKSTART_SETUP_SECONDS"]) if os.environ.get("QUICKSTART_SETUP_SECONDS") else None
    load_end = _load_average()
    step_seconds = [r["timing_s/step"] for r in rows if "timing_s/step" in r]
    result = {
        "algo": args.algo,
        "seed": args.seed,
        "data_seed": args.seed if args.data_seed is None else args.data_seed,
        "quick": args.quick,
        "backend": args.backend,
        "mode": args.mode,
        "rl_overrides": rl_args(args.algo, sft_model, paths, sizes, run_dir, args),
        "accuracy_before": before,
        "accuracy_after": after,
        "improvement": after - before,
        "steps": max((r["step"] for r in rows), default=0),
        "wall_seconds": round(time.perf_counter() - start, 1),
        "phase_seconds": phases,
        "setup_seconds": setup,  # the venv check/install of quickstart.sh, before this process started
        "phase_cpu_seconds": cpu,  # user + system of this process and all it started (CPUClock)
        "rl_step_seconds_median": round(sorted(step_seconds)[len(step_seconds) // 2], 3) if step_seconds else None,
        "load_average_1min": [round(load_start, 2), round(load_end, 2)],
        "cpu_count": os.cpu_count(),
        "threads": args.threads,
        "sft_checkpoint": sft_model,
        "sft_dev_accuracy": {str(k): v for k, v in sorted(history.items())},
        "heldout_prompts": sizes["test_size"],
        "train_reward": reward,
        "val_accuracy": val,
        "final_model": final_model,
        "metrics_jsonl": metrics_path,
        "png": png,
        "samples_after": samples,
    }
    with open(os.path.join(work, "quickstart_result.json"), "w") as f:
        json.dump(result, f, indent=1)
    table = phase_table(phases, cpu, setup, (load_start, load_end), args.threads)
    print("\n" + table + "\n", flush=True)
    median = result["rl_step_seconds_median"]
    log(
        f"accuracy before {before:.1%} -> after {after:.1%} ({(after - before) * 100:+.1f} points) "
        f"in {result['steps']} {args.algo.upper()} steps"
        + (f" (median step {median:.2f} s)" if median else "")
        + f"; total {result['wall_seconds'] + (setup or 0.0):.0f} s; "
        f"wrote {os.path.join(work, 'quickstart_result.json')} and {png}"
    )
    return result


if __name__ == "__main__":
    main()
