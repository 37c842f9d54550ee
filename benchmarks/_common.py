"""Shared setup for the benchmarks: the tiny task + model in a temp dir, a GRPO config, a trainer built
the way ``main_ppo.run_ppo`` builds it (without ``fit``), and small timing/table helpers.

Benchmarks print numbers; they never assert timings.
"""

from __future__ import annotations

import os
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, field

# Ray workers run with OMP_NUM_THREADS=1; give this process (bare loop, direct baseline, in-process
# worker) the same before torch is imported. torch.set_num_threads(1) alone was not equivalent: the
# in-process GRPO step ran 8.2 s without this and 5.2 s with it on the same loaded 2-core machine.
# An explicit --torch-threads N still raises torch's own pool with torch.set_num_threads(N).
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from a checkout

from hybridflow.trainer.ppo.metric_utils import flat_metric_values  # noqa: E402


@dataclass
class GRPOSetup:
    """The workload every benchmark shares: ``prompts`` × ``n`` samples of up to ``response_length`` tokens."""

    prompts: int = 16
    n: int = 8
    response_length: int = 32
    prompt_length: int = 128
    lr: float = 1e-4
    train_size: int = 256
    seed: int = 0


def make_assets(root: str, setup: GRPOSetup) -> tuple[str, str]:
    """Write the tiny arithmetic task (GSM8K layout) and the tiny Qwen2 under ``root``; (data_dir, model_dir)."""
    from hybridflow.data.tiny_task import write_tiny_task
    from hybridflow.models.tiny import save_tiny_model

    data_dir, model_dir = os.path.join(root, "data"), os.path.join(root, "model")
    write_tiny_task(data_dir, seed=setup.seed, train_size=setup.train_size, test_size=16)
    save_tiny_model(model_dir, seed=setup.seed)
    return data_dir, model_dir


def grpo_overrides(
    data_dir: str, model_dir: str, out_dir: str, setup: GRPOSetup, backend: str, n_workers: int, steps: int
) -> list[str]:
    """veRL-style overrides for a GRPO run that matches the bare loop: one optimizer step per batch
    (mini-batch = the whole batch, one micro-batch per rank), no KL, the gsm8k rule scorer."""
    per_rank = setup.prompts * setup.n // n_workers
    return [
        "algorithm.adv_estimator=grpo",
        f"data.train_files={data_dir}/train.parquet",
        f"data.val_files={data_dir}/test.parquet",
        f"data.train_batch_size={setup.prompts}",
        f"data.max_prompt_length={setup.prompt_length}",
        f"data.max_response_length={setup.response_length}",
        f"actor_rollout_ref.model.path={model_dir}",
        "actor_rollout_ref.model.enable_gradient_checkpointing=False",
        f"actor_rollout_ref.actor.optim.lr={setup.lr}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={setup.prompts}",
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={per_rank}",
        "actor_rollout_ref.actor.use_kl_loss=False",
        "actor_rollout_ref.actor.entropy_coeff=0",
        f"actor_rollout_ref.rollout.n={setup.n}",
        "actor_rollout_ref.rollout.temperature=1.0",
        f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={per_rank}",
        f"trainer.total_training_steps={steps}",
        "trainer.test_freq=-1",
        "trainer.save_freq=-1",
        "trainer.val_before_train=False",
        "trainer.logger=['console']",
        f"trainer.default_local_dir={out_dir}/ckpt",
        f"trainer.n_gpus_per_node={n_workers}",
        f"trainer.backend={backend}",
        "trainer.device=cpu",
    ]


def build_trainer(overrides: list[str], ray_num_cpus: int | None = None):
    """(trainer with workers initialised, train dataloader), as ``run_ppo`` builds them."""
    from hybridflow.config.loader import load_config
    from hybridflow.data.rl_dataset import RLHFDataset, collate_fn
    from hybridflow.data.sampler import create_rl_dataloader
    from hybridflow.main_ppo import build_reward_fns, checked_config, with_runtime_values
    from hybridflow.trainer.ppo.ray_trainer import RayPPOTrainer
    from hybridflow.workers.model_loading import load_tokenizer

    config = checked_config(load_config("ppo_trainer", overrides))  # the typed, validated tree
    tokenizer = load_tokenizer(config.actor_rollout_ref.model.path, False)
    train = RLHFDataset(config.data.train_files, tokenizer, config.data)
    loader = create_rl_dataloader(train, batch_size=int(config.data.train_batch_size), seed=0, shuffle=True)
    reward_fn, val_reward_fn = build_reward_fns(config, tokenizer)
    config = with_runtime_values(config, int(config.trainer.total_training_steps))
    if config.trainer.backend == "ray":
        from hybridflow.single_controller.ray.init import init_ray

        init_ray(config.ray_init, num_cpus=ray_num_cpus, runtime_env={"env_vars": {"HYBRIDFLOW_DEVICE": "cpu"}})
    else:
        os.environ["HYBRIDFLOW_DEVICE"] = "cpu"
    trainer = RayPPOTrainer(config, tokenizer, loader, None, reward_fn, val_reward_fn=None, collate_fn=collate_fn)
    trainer.init_workers()
    return trainer, loader


def shutdown_trainer(trainer) -> None:
    """Stop Ray workers (if any) and Ray itself; a no-op for the in-process backend."""
    try:
        import ray
    except ImportError:  # pragma: no cover
        return
    if ray.is_initialized():
        for group in getattr(trainer, "_all_groups", {}).values():
            stop = getattr(group, "shutdown", None)
            if stop is not None:
                try:
                    stop()
                except Exception:  # noqa: BLE001 - best effort; ray.shutdown below kills the rest
                    pass
        ray.shutdown()


@dataclass
class WorkerTimes:
    """Seconds the workers reported per call (max over ranks: the driver waits for the slowest)."""

    per_step: list[dict[str, float]] = field(default_factory=list)

    def new_step(self) -> None:
        self.per_step.append({})

    def add(self, metrics: dict) -> None:
        if not self.per_step:
            self.new_step()
        cur = self.per_step[-1]
        for key, values in (metrics or {}).items():
            if key.startswith("timing_s/"):
                vals = flat_metric_values(values)  # one list per rank after DataProto.concat
                cur[key] = cur.get(key, 0.0) + float(max(float(v) for v in vals))


def record_worker_timings(trainer) -> WorkerTimes:
    """Wrap the trainer's WorkerGroup methods so the timings the workers put in ``meta_info['metrics']``
    are kept (the trainer pops some of them before they reach the step metrics)."""
    times = WorkerTimes()
    methods = {
        "actor_rollout_wg": ["generate_sequences", "compute_log_prob", "compute_ref_log_prob", "update_actor"],
        "critic_wg": ["compute_values", "update_critic"],
        "rm_wg": ["compute_rm_score"],
    }
    for attr, names in methods.items():
        group = getattr(trainer, attr, None)
        if group is None:
            continue
        for name in names:
            original = getattr(group, name, None)
            if original is None:
                continue

            def wrapped(*args, _original=original, **kwargs):
                out = _original(*args, **kwargs)
                times.add(out.meta_info.get("metrics", {}))
                return out

            setattr(group, name, wrapped)
    # since the rollout became a server, the driver's AgentLoopManager generates (the worker group's
    # generate_sequences is no longer called); its output carries timing_s/generate_sequences too
    manager = getattr(trainer, "async_rollout_manager", None)
    if manager is not None:
        original = manager.generate_sequences

        def generate(*args, _original=original, **kwargs):
            out = _original(*args, **kwargs)
            times.add(out.meta_info.get("metrics", {}))
            return out

        manager.generate_sequences = generate
    return times


@contextmanager
def timed_driver_fn(obj, attr: str, sink: dict, key: str):
    """Time every call of ``obj.attr`` (driver-side compute such as the reward function) into ``sink[key]``."""
    original = getattr(obj, attr)

    def wrapped(*args, **kwargs):
        start = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            sink[key] = sink.get(key, 0.0) + time.perf_counter() - start

    setattr(obj, attr, wrapped)
    try:
        yield
    finally:
        setattr(obj, attr, original)


@contextmanager
def phase_cpu_times(sink: dict):
    """CPU seconds of this process (user + system, all threads) per phase the trainer times with
    ``ray_trainer.timer``, added into ``sink[phase]``."""
    import hybridflow.trainer.ppo.ray_trainer as ray_trainer

    original = ray_trainer.timer

    @contextmanager
    def timer(name, timing):
        start = time.process_time()
        with original(name, timing):
            yield
        sink[name] = sink.get(name, 0.0) + time.process_time() - start

    ray_trainer.timer = timer
    try:
        yield
    finally:
        ray_trainer.timer = original


def set_threads(n: int) -> None:
    """torch intra-op threads of this process (0 keeps torch's default)."""
    import torch

    if n > 0:
        torch.set_num_threads(n)


def median(values) -> float:
    return float(np.median(np.asarray(values, dtype=float))) if len(values) else float("nan")


def print_table(title: str, header: list[str], rows: list[list], widths: list[int] | None = None) -> None:
    """A plain fixed-width table (first column left-aligned)."""
    widths = widths or [max(len(_fmt(x)) for x in col) + 2 for col in zip(header, *rows)]
    print(f"\n{title}")
    line = "".join(f"{h:<{w}}" if i == 0 else f"{h:>{w}}" for i, (h, w) in enumerate(zip(header, widths)))
    print(line)
    print("-" * len(line))
    for row in rows:
        print("".join(f"{_fmt(x):<{w}}" if i == 0 else f"{_fmt(x):>{w}}" for i, (x, w) in enumerate(zip(row, widths))))


def _fmt(x) -> str:
    if isinstance(x, float):
        return f"{x:.3f}" if abs(x) < 100 else f"{x:.0f}"
    return str(x)


def machine_line() -> str:
    import torch

    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return (
        f"{os.cpu_count()} CPU cores, load average {load:.1f}, driver torch threads {torch.get_num_threads()}, "
        f"torch {torch.__version__}"
    )
