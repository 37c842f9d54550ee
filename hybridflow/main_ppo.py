"""``python -m hybridflow.main_ppo key=val ...``: veRL's command line, hybridflow's trainer.

The config is validated before anything expensive starts (an unknown key fails before Ray does).
``run_ppo`` is the library call: it raises (``WorkerHangError`` for a hang, with its report) and
never ends the process. ``main`` is the command line: it turns errors into exit codes
(2: a bad config, ``EXIT_CODE_HANG``: a hang, ``EXIT_CODE_WORKER_DIED``: a dead worker, each after printing
the error as the last thing on stderr) and SIGTERM into an orderly stop (workers and the Ray processes it
started are shut down, exit code 143).
"""

from __future__ import annotations

import dataclasses
import logging
import signal
import sys

from hybridflow.config.base import part_of_tree, to_dict
from hybridflow.config.convert import as_section
from hybridflow.config.loader import ConfigError, parse_cli
from hybridflow.config.ppo_trainer import PPOTrainerConfig
from hybridflow.data.custom_dataset import build_rl_dataset
from hybridflow.data.rl_dataset import RLHFDataset, collate_fn
from hybridflow.data.sampler import create_rl_dataloader
from hybridflow.rewards.streaming import RewardRecipe
from hybridflow.single_controller.base import WorkerDiedError, WorkerHangError
from hybridflow.single_controller.factory import start_backend, write_timeline
from hybridflow.trainer.config_checks import resolve_device, validate_ppo_config
from hybridflow.trainer.ppo.ray_trainer import RayPPOTrainer
from hybridflow.utils.environ import restored_environ
from hybridflow.utils.logging_utils import setup_cli_logging
from hybridflow.workers.model_loading import load_tokenizer, local_model_path, tokenizer_dir

logger = logging.getLogger(__name__)

EXIT_CODE_HANG = 3  # the command line's exit code when the watchdog reported a hang
EXIT_CODE_WORKER_DIED = 4  # ... when a worker process died (killed, out of memory, node lost)
EXIT_CODE_SIGTERM = 128 + signal.SIGTERM


def with_runtime_values(config: PPOTrainerConfig, total_training_steps: int) -> PPOTrainerConfig:
    """A new config with the values only known at start-up (the LR schedule length)."""

    def steps(section):  # a section whose optim gets the schedule length
        return dataclasses.replace(
            section, optim=dataclasses.replace(section.optim, total_training_steps=total_training_steps)
        )

    aref = config.actor_rollout_ref
    with part_of_tree():  # sections of a validated tree: construction checks veRL makes on lone sections stay off
        return dataclasses.replace(
            config, actor_rollout_ref=dataclasses.replace(aref, actor=steps(aref.actor)), critic=steps(config.critic)
        )


def build_reward_fns(config, tokenizer):
    """The training and validation reward managers (the same, but the validation one logs a sample)."""
    config = as_section(config, PPOTrainerConfig)
    recipe = RewardRecipe(config.reward, config.data.reward_fn_key, tokenizer, run_config=to_dict(config))
    return recipe.build(num_examine=0), recipe.build(num_examine=1)


def check_prompts_fit(dataset: RLHFDataset, key: str) -> None:
    """With data.truncation=error an overlong prompt would stop training mid-epoch, after the workers
    started; find it now (one tokenization pass; filtered datasets are already known to fit)."""
    if getattr(dataset, "truncation", None) != "error" or dataset.config.filter_overlong_prompts:
        return  # (a data.custom_cls dataset without RLHFDataset's truncation setting is not checked)
    for i in range(len(dataset)):
        try:
            dataset[i]
        except ValueError as e:
            raise ValueError(f"{key}={dataset.data_files}: {e}") from None


def checked_config(config) -> PPOTrainerConfig:
    """The run's one typed configuration: a composed tree read into ``PPOTrainerConfig`` and validated (once
    per launch; the notes are logged). Raises ConfigError listing every error."""
    config = as_section(config, PPOTrainerConfig)
    for note in validate_ppo_config(config):
        logger.warning("[config] %s", note)
    return config


def build_trainer(config: PPOTrainerConfig) -> RayPPOTrainer:
    """Data, rewards and the trainer from a validated config (workers not started yet)."""
    device = resolve_device(config.trainer.device)
    model_path = local_model_path(config.actor_rollout_ref.model.path, "actor_rollout_ref.model.path")
    trust = bool(config.data.trust_remote_code or config.actor_rollout_ref.model.trust_remote_code)
    model = config.actor_rollout_ref.model
    tokenizer_path = config.data.tokenizer or tokenizer_dir(
        model.tokenizer_path, model_path, "actor_rollout_ref.model.tokenizer_path"
    )
    tokenizer = load_tokenizer(tokenizer_path, trust, chat_template=model.custom_chat_template)

    # data and rewards first: bad input fails before any worker starts
    d = config.data  # data.custom_cls or RLHFDataset; *_max_samples: part of the files
    train_dataset = build_rl_dataset(d.train_files, tokenizer, d, d.train_max_samples, "data.train_max_samples")
    val_dataset = build_rl_dataset(d.val_files, tokenizer, d, d.val_max_samples, "data.val_max_samples")
    gen_batch = int(d.gen_batch_size or d.train_batch_size)  # the dataloader's batch (DAPO's generation batch)
    for key, size in (("data.train_batch_size", int(d.train_batch_size)), ("data.gen_batch_size", gen_batch)):
        if len(train_dataset) < size:
            raise ValueError(
                f"{key}={size} is larger than the training set ({len(train_dataset)} prompts in "
                f"{d.train_files}): no full batch"
            )
    if config.data.seed is None:
        raise ConfigError(
            "data.seed=null (veRL's unseeded sampler) is not supported: the sampler's seed is part of "
            "every checkpoint so that a run can resume; set data.seed to an integer"
        )
    dataloader = create_rl_dataloader(
        train_dataset, batch_size=gen_batch, seed=int(config.data.seed), shuffle=bool(config.data.shuffle)
    )
    reward_fn, val_reward_fn = build_reward_fns(config, tokenizer)
    check_prompts_fit(train_dataset, "data.train_files")  # last: the one check that tokenizes every prompt
    check_prompts_fit(val_dataset, "data.val_files")

    t = config.trainer
    total = int(t.total_training_steps) if t.total_training_steps else len(dataloader) * int(t.total_epochs)
    # V1 separate_async: parameter_sync_step actor updates a step, each one step of the LR schedule (as veRL)
    updates = int(t.v1.separate_async.parameter_sync_step) if t.v1.trainer_mode == "separate_async" else 1
    config = with_runtime_values(config, total * updates)

    # the backend stays up after the run (a later run in this process reuses a Ray session); run_ppo
    # puts the environment back
    start_backend(t.backend, config.ray_kwargs.ray_init, worker_env={"HYBRIDFLOW_DEVICE": device})
    return RayPPOTrainer(config, tokenizer, dataloader, val_dataset, reward_fn, val_reward_fn, collate_fn=collate_fn)


def run_ppo(config) -> dict:
    """Build data, rewards and workers from a config (a composed tree or a ``PPOTrainerConfig``; checked
    here) and train; returns the last metrics.

    Raises on failure (``WorkerHangError`` when the watchdog reports a hang); never ends the process."""
    config = checked_config(config)
    with restored_environ(["HYBRIDFLOW_DEVICE"]):
        trainer = build_trainer(config)
        try:
            trainer.init_workers()  # a role that fails to start: the others are shut down too
            metrics = trainer.fit()
            if timeline := config.ray_kwargs.timeline_json_file:  # veRL writes it after a finished run
                logger.info("Ray timeline written to %s", write_timeline(config.trainer.backend, timeline))
            return metrics
        finally:
            trainer.shutdown_workers()  # a finished run gives its devices back to the Ray session


def _stop_on_sigterm(signum, frame):
    raise SystemExit(EXIT_CODE_SIGTERM)


def _error_text(e: BaseException) -> str:
    notes = "".join(f"\n{n}" for n in getattr(e, "__notes__", []))
    return f"error: {type(e).__name__}: {e}{notes}"


def main(argv=None) -> None:
    setup_cli_logging()
    config = parse_cli("ppo_trainer", sys.argv[1:] if argv is None else argv)
    # SIGTERM unwinds the run like an error: workers shut down, then Ray's processes (Ray's own
    # handler, installed when it starts, does the same with exit code 15)
    previous = signal.signal(signal.SIGTERM, _stop_on_sigterm)
    try:
        run_ppo(config)  # the config is checked first, once
    except ConfigError as e:  # inconsistent values: a message with the numbers, not a traceback
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    except WorkerHangError as e:  # the report is written and the workers are down: say so, exit non-zero
        print(_error_text(e), file=sys.stderr, flush=True)
        raise SystemExit(EXIT_CODE_HANG) from None
    except WorkerDiedError as e:  # the message names the group, rank and method; the traceback is the driver's
        print(_error_text(e), file=sys.stderr, flush=True)
        raise SystemExit(EXIT_CODE_WORKER_DIED) from None
    finally:
        signal.signal(signal.SIGTERM, previous)  # main() called from Python leaves its caller's handler


if __name__ == "__main__":
    main()
