"""The ``trainer`` section (the run: steps, devices, logging, checkpoints, validation) and
``async_training`` (how far generation may run ahead of training)."""

from __future__ import annotations

import os
from dataclasses import dataclass, fields, replace

from hybridflow.config.base import BaseConfig, doc, section
from hybridflow.config.module import ModuleConfig
from hybridflow.config.reasons import NPU
from hybridflow.config.rules import Problems

__all__ = [
    "HybridRolloutSwitchConfig",
    "ColocateAsyncConfig",
    "SeparateAsyncConfig",
    "ReplaySamplerConfig",
    "TrainerV1Config",
    "TrainerConfig",
    "AsyncTrainingConfig",
]

RESUME_MODES = ("auto", "disable", "resume_path")
DEVICE_STATUS = dict(values=("auto", "cpu", "cuda", "gpu"), reason="auto, cpu or cuda; " + NPU)
_NO_HDFS = (
    "the PPO trainer keeps its checkpoints in trainer.default_local_dir (veRL 0.9's PPO checkpoint managers ignore "
    "this path and its resume refuses it); main_sft's trainer.default_hdfs_dir copies each checkpoint"
)
V1_MODES = ("sync", "colocate_async", "separate_async")
NO_SWITCH = (
    "lending idle trainer devices to generation needs rollout engines in the trainer's processes beside the "
    "standalone pool; in hybridflow's separate_async the actor workers hold no engine and the pools are fixed "
    "at start-up, so the trainer's devices cannot join the rollout"
)


@dataclass
class HybridRolloutSwitchConfig(BaseConfig):
    """``trainer.v1.separate_async.hybrid_rollout``: lending idle trainer devices to the rollout (veRL's V1 trainer)."""

    _target_: str = doc("verl.trainer.config.HybridRolloutSwitchConfig", "the class this section is read into")
    enable_switch: bool = doc(False, "let the trainer switch to rollout when idle")
    switch_threshold_ratio: float = doc(0.4, "share of train_batch_size sampleable before the replicas are reclaimed")
    adaptive_switch_threshold: bool = doc(True, "adapt the threshold to trainer starvation")
    switch_threshold_step_up: float = doc(0.05, "added to the threshold after sustained trainer idle")
    switch_threshold_step_down: float = doc(0.03, "subtracted from the threshold after a calm period")
    switch_threshold_release_steps: int = doc(2, "idle or calm steps before the threshold moves")
    switch_cost_window_size: int = doc(3, "steps averaged for the switch cost")


@dataclass
class ColocateAsyncConfig(BaseConfig):
    """``trainer.v1.colocate_async``."""

    num_warmup_batches: float = doc(1, "batches generated before the training loop starts")


@dataclass
class SeparateAsyncConfig(BaseConfig):
    """``trainer.v1.separate_async``."""

    num_warmup_batches: float = doc(1, "batches generated before the training loop starts")
    parameter_sync_step: int = doc(4, "trainer steps between weight syncs to the rollout")
    hybrid_rollout: HybridRolloutSwitchConfig = section(
        HybridRolloutSwitchConfig, "lending idle trainer devices", refused=NO_SWITCH
    )


@dataclass
class ReplaySamplerConfig(BaseConfig):
    """``trainer.v1.sampler``: the V1 trainer's replay-buffer sampling."""

    max_off_policy_threshold: int | None = doc(8, "model versions a trajectory may span; null: no limit")
    max_off_policy_strategy: str = doc("drop", "drop | wait: what happens to a trajectory beyond the threshold")
    sync_refill_failed_groups: bool = doc(
        False,
        "sync trainers drop a group with a failed trajectory and draw one new prompt for it (hybridflow: off, "
        "the failure stops the run naming the sample; veRL pads it); the async modes always replace it",
    )
    custom_sampler: ModuleConfig = section(ModuleConfig, "a sampler class of your own")
    sampler_kwargs: dict = doc({}, "arguments of the custom sampler")


@dataclass
class TrainerV1Config(BaseConfig):
    """``trainer.v1``: veRL's V1 trainer modes (hybridflow has one trainer; async_training sets its mode)."""

    trainer_mode: str = doc("sync", "sync | colocate_async | separate_async", values=V1_MODES)
    sync: dict = doc({}, "the synchronous trainer's settings")
    colocate_async: ColocateAsyncConfig = section(ColocateAsyncConfig, "asynchronous, trainer and rollout colocated")
    separate_async: SeparateAsyncConfig = section(SeparateAsyncConfig, "asynchronous, trainer and rollout apart")
    sampler: ReplaySamplerConfig = section(ReplaySamplerConfig, "replay-buffer sampling")

    def validate(self) -> list[str]:
        """The V1 keys' own ranges (the rules against data, actor and rollout: ``config.rules``)."""
        p, s = Problems(), self.sampler
        threshold = s.max_off_policy_threshold
        if threshold is not None and (isinstance(threshold, bool) or not isinstance(threshold, int) or threshold < 1):
            p.errors.append(
                f"trainer.v1.sampler.max_off_policy_threshold must be an integer >= 1 or null, got {threshold!r}"
            )
        if s.max_off_policy_strategy not in ("drop", "wait"):
            p.errors.append(
                f"trainer.v1.sampler.max_off_policy_strategy={s.max_off_policy_strategy!r} is not one of drop, wait"
            )
        if bool(s.custom_sampler.path) != bool(s.custom_sampler.name):
            p.errors.append("trainer.v1.sampler.custom_sampler needs both path and name")
        for mode in ("colocate_async", "separate_async"):
            if getattr(self, mode).num_warmup_batches < 0:
                p.errors.append(f"trainer.v1.{mode}.num_warmup_batches must be >= 0")
        p.positive("trainer.v1.separate_async.parameter_sync_step", self.separate_async.parameter_sync_step)
        # never silently ignored: the settings of a mode not chosen (the sampler's: of both asynchronous modes)
        for name, cls, modes in (
            ("sampler", ReplaySamplerConfig, ("colocate_async", "separate_async")),
            ("colocate_async", ColocateAsyncConfig, ("colocate_async",)),
            ("separate_async", SeparateAsyncConfig, ("separate_async",)),
        ):
            settings = getattr(self, name)
            if name == "sampler":  # its one key of the synchronous mode
                settings = replace(settings, sync_refill_failed_groups=False)
            if self.trainer_mode not in modes and settings != cls():
                p.errors.append(f"trainer.v1.{name} acts in trainer_mode={' or '.join(modes)}, not {self.trainer_mode}")
        return p.raise_errors()


@dataclass
class TrainerConfig(BaseConfig):
    """``trainer``: the run (steps, devices, logging, checkpoints, validation)."""

    balance_batch: bool = doc(True, "reorder samples so every rank gets a similar token count")
    total_epochs: int = doc(30, "passes over the training data")
    total_training_steps: int | None = doc(None, "null: derived from total_epochs and the dataset size")
    project_name: str = doc("hybridflow_examples", "experiment tracking project (hybridflow: hybridflow_examples)")
    experiment_name: str = doc("gsm8k", "run name in the tracking tools")
    logger: str | list[str] = doc(["console"], "hybridflow: console only (veRL: console, wandb); a name or a list")
    log_val_generations: int = doc(0, "validation samples logged")
    rollout_data_dir: str | None = doc(None, "write every step's samples to <dir>/<step>.jsonl (replayable)")
    validation_data_dir: str | None = doc(None, "write every validation's samples to <dir>/<step>.jsonl")
    nnodes: int = doc(1, "nodes of the run")
    n_gpus_per_node: int = doc(1, "hybridflow: 1 (veRL: 8); devices per node on CUDA, worker processes per node on cpu")
    save_freq: int = doc(-1, "steps between checkpoints; -1: never")
    esi_redundant_time: int = doc(
        0,
        "save-before-shutdown margin (s)",
        note="applies to Volcengine's elastic instances, which hybridflow does not use",
    )
    resume_mode: str = doc("auto", "auto | disable | resume_path")
    resume_from_path: str | None = doc(None, "the checkpoint of resume_mode=resume_path")
    continue_after_failed_save: bool = doc(
        False,
        "hybridflow: a failed checkpoint save (full disk, lost mount) is logged and counted "
        "(checkpoint/failed_saves) and training goes on to the next save; default: the run stops with it",
    )
    resume_skip_damaged: bool = doc(
        False,
        "hybridflow: auto mode resumes from the newest whole checkpoint when the latest is damaged or "
        "foreign (default: refuse, naming the file)",
    )
    checkpoint_callback_class: str | None = doc(
        None,
        "a CheckpointCallback class (pkg.mod.Class or file.py:Class) whose on_save(trainer=, global_step=, "
        "checkpoint_dir=) runs on the driver after each complete save; an exception from it ends the run",
    )
    val_before_train: bool = doc(True, "validate before the first step")
    val_only: bool = doc(
        False, "validate (after resuming, the checkpoint's policy), log the metrics, stop: no training step"
    )
    rollout_only: bool = doc(False, "hybridflow: generate and score every step, train nothing")
    test_freq: int = doc(-1, "steps between validations; -1: never")
    critic_warmup: int = doc(0, "the actor trains from step critic_warmup on (steps count from 1)")
    default_hdfs_dir: str | None = doc(None, "a copy of the checkpoints on HDFS", refused=_NO_HDFS)
    del_local_ckpt_after_load: bool = doc(
        False,
        "delete the local checkpoint once loaded",
        refused="a resumed run keeps the checkpoint it loaded: deleting it would leave none if the run then fails "
        "before its next save",
    )
    default_local_dir: str = doc(
        "checkpoints/hybridflow_examples/gsm8k",
        "checkpoint directory",
        follows="checkpoints/${trainer.project_name}/${trainer.experiment_name}",
    )
    max_actor_ckpt_to_keep: int | None = doc(None, "actor checkpoints kept; null: all")
    max_critic_ckpt_to_keep: int | None = doc(None, "critic checkpoints kept; null: all")
    ray_wait_register_center_timeout: int = doc(
        300, "seconds to wait for the register center", note="hybridflow's workers do not wait on a register center"
    )
    watchdog_timeout: float | None = doc(
        1800.0, "hybridflow: seconds without progress before a worker call is declared stuck (stacks dumped); null: off"
    )
    device: str = doc(
        "auto", "hybridflow: auto (cuda when torch sees a GPU) | cpu | cuda (veRL: cuda)", **DEVICE_STATUS
    )
    backend: str = doc("ray", "hybridflow: ray | inprocess (workers inside the driver, world size 1)")
    use_v1: bool = doc(
        True,
        "veRL's V1 trainer switch (hybridflow has one trainer)",
        note="chooses between veRL's trainer/worker implementations; hybridflow has one of each",
    )
    use_legacy_worker_impl: str = doc(
        "auto",
        "veRL main's switch between worker implementations; hybridflow has one",
        note="chooses between veRL's trainer/worker implementations; hybridflow has one of each",
    )
    v1: TrainerV1Config = section(TrainerV1Config, "veRL's V1 trainer modes (one machinery with async_training)")

    def validate(self, device: str, visible_devices: int | None = None) -> list[str]:
        """The run's length, resumption and watchdog, and the devices per node against ``visible_devices``
        (CUDA devices on this node; ``device``: cpu or cuda). Raises ConfigError listing every problem."""
        p = Problems()
        nnodes, per_node = (
            p.positive("trainer.nnodes", self.nnodes),
            p.positive("trainer.n_gpus_per_node", self.n_gpus_per_node),
        )
        if nnodes and per_node and device == "cuda" and visible_devices is not None and per_node > visible_devices:
            p.errors.append(f"trainer.n_gpus_per_node={per_node} but only {visible_devices} CUDA device(s) are visible")
        elif nnodes and per_node and device == "cpu" and per_node > (os.cpu_count() or 1):
            p.notes.append(
                f"trainer.n_gpus_per_node={per_node} worker processes per node on cpu, more than the "
                f"{os.cpu_count()} CPU cores: they will share cores"
            )
        if self.resume_mode not in RESUME_MODES:
            p.errors.append(f"trainer.resume_mode={self.resume_mode!r} is not one of {', '.join(RESUME_MODES)}")
        if self.resume_mode == "resume_path" and not self.resume_from_path:
            p.errors.append("trainer.resume_mode=resume_path needs trainer.resume_from_path")
        if self.total_training_steps is None:
            p.positive("trainer.total_epochs", self.total_epochs)
        else:
            p.positive("trainer.total_training_steps", self.total_training_steps)
        timeout = self.watchdog_timeout
        if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0):
            p.errors.append(
                f"trainer.watchdog_timeout must be a positive number of seconds (or null to turn the "
                f"watchdog off), got {timeout!r}"
            )
        p.run(self.v1.validate)
        if self.val_only and not self.val_before_train:  # veRL would ignore val_only here and train
            p.errors.append(
                "trainer.val_only=True validates in the place of trainer.val_before_train, which is False: "
                "set trainer.val_before_train=True (or val_only=False to train)"
            )
        if self.val_only and self.rollout_only:
            p.errors.append("trainer.val_only=True and trainer.rollout_only=True: a run does one of them; choose one")
        if self.critic_warmup < 0:
            p.errors.append(f"trainer.critic_warmup must be >= 0, got {self.critic_warmup}")
        return p.raise_errors()


@dataclass
class AsyncTrainingConfig(BaseConfig):
    """``async_training``: veRL's fully async keys (its recipe) plus the mode of hybridflow's one driver."""

    mode: str = doc(
        "sync",
        "sync | one_step_off | fully_async; the asynchronous modes need rollout.nnodes > 0",
        values=("sync", "one_step_off", "fully_async"),
    )
    staleness_threshold: float = doc(0.1, "fully_async: generate at most (1 + this) x a sync period's prompts ahead")
    trigger_parameter_sync_step: int = doc(4, "fully_async: trainer steps between weight syncs to the rollout")
    require_batches: int = doc(1, "fully_async: ppo_mini_batch_size groups of prompts per step")
    partial_rollout: bool = doc(True, "fully_async: requests in flight at a sync continue on the new weights")
    use_rollout_log_probs: bool = doc(False, "asynchronous modes: pi_old is the engine's log-probs (no recomputation)")

    def validate(self) -> list[str]:
        """The knobs of the mode chosen: fully_async's are fixed by the other modes (sync: no overlap;
        one_step_off: one step ahead, a sync every step, no partial rollouts), so a value changed from its
        default would change nothing there. (The rules that read the rollout: ``hybridflow.config.rules``.)"""
        p, mode = Problems(), self.mode
        if mode != "fully_async":
            defaults = {f.name: f.default for f in fields(AsyncTrainingConfig)}
            for key in ("staleness_threshold", "trigger_parameter_sync_step", "require_batches", "partial_rollout"):
                if getattr(self, key) != defaults[key]:
                    p.errors.append(
                        f"async_training.{key}={getattr(self, key)} acts in async_training.mode=fully_async only; "
                        f"mode={mode} fixes it (leave it at {defaults[key]}, or use mode=fully_async)"
                    )
        if mode == "sync" and self.use_rollout_log_probs:
            p.errors.append(
                "async_training.use_rollout_log_probs=True acts in the asynchronous modes only; with "
                "async_training.mode=sync use algorithm.rollout_correction.bypass_mode=True for the same effect"
            )
        if mode != "sync" and self.staleness_threshold < 0:
            p.errors.append(f"async_training.staleness_threshold must be >= 0, got {self.staleness_threshold}")
        if mode == "fully_async":
            p.positive("async_training.trigger_parameter_sync_step", self.trigger_parameter_sync_step)
            p.positive("async_training.require_batches", self.require_batches)
        return p.raise_errors()
