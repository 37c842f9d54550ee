"""veRL's ``trainer.val_only=True``: validate, log, stop. With a checkpoint it validates the checkpoint's policy
(veRL's way to evaluate a saved run): the same greedy answers as the training run's own validation after that
step, and no training step runs. In-process backend, tiny model."""

from __future__ import annotations

import json

import pytest

from hybridflow.config.loader import ConfigError, load_config
from hybridflow.main_ppo import checked_config, run_ppo
from hybridflow.trainer.ppo import ray_trainer
from tests.trainer.e2e_helpers import base_overrides

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


def _config(tiny_model_dir, tiny_data_dir, tmp_path, *extra):
    overrides = base_overrides(tiny_model_dir, tiny_data_dir, tmp_path, steps=2, backend="inprocess")
    overrides += [
        f"trainer.default_local_dir={tmp_path / 'ckpt'}",
        "trainer.logger=['file']",
        "trainer.val_before_train=True",  # base_overrides turns it off; val_only validates in its place
        "actor_rollout_ref.rollout.val_kwargs.do_sample=False",  # greedy: the answers depend on the weights only
        *extra,
    ]
    return load_config("ppo_trainer", overrides)


def _validate_initial_policy(tiny_model_dir, tiny_data_dir, tmp_path, dump_dir, *extra) -> dict:
    """A val_only run without a checkpoint, its validation samples written to ``dump_dir``."""
    overrides = ("trainer.val_only=True", "trainer.resume_mode=disable", f"trainer.validation_data_dir={dump_dir}")
    return run_ppo(_config(tiny_model_dir, tiny_data_dir, tmp_path, *overrides, *extra))


def _answers(directory, step) -> list[str]:
    with open(directory / f"{step}.jsonl") as f:
        return [json.loads(line)["output"] for line in f]


def _logged(tmp_path) -> list[dict]:
    with open(tmp_path / "ckpt" / "metrics.jsonl") as f:
        return [json.loads(line) for line in f if line.strip()]


def test_val_only_validates_the_checkpoint_and_trains_nothing(tiny_model_dir, tiny_data_dir, tmp_path, monkeypatch):
    # 1) a 2-step run that validates before step 1 and after step 2 (test_freq=2 in base_overrides), and saves
    trained = tmp_path / "trained_val"
    run_ppo(
        _config(
            tiny_model_dir, tiny_data_dir, tmp_path, "trainer.save_freq=2", f"trainer.validation_data_dir={trained}"
        )
    )
    before_training, after_training = _answers(trained, 0), _answers(trained, 2)
    assert before_training != after_training  # the policy moved: the checks below can tell the two apart
    logged_before = len(_logged(tmp_path))

    steps = []
    original = ray_trainer.RayPPOTrainer.train_step
    monkeypatch.setattr(ray_trainer.RayPPOTrainer, "train_step", lambda self, p: steps.append(1) or original(self, p))

    # 2) val_only on the same directory: resumes step 2, validates, stops
    resumed = tmp_path / "resumed_val"
    metrics = run_ppo(
        _config(
            tiny_model_dir, tiny_data_dir, tmp_path, "trainer.val_only=True", f"trainer.validation_data_dir={resumed}"
        )
    )
    assert steps == []
    assert metrics["training/global_step"] == 2 and metrics["timing_s/testing"] > 0
    assert any(k.startswith("val-core/") for k in metrics)
    assert _answers(resumed, 2) == after_training  # the checkpoint's policy, greedy: the same answers
    logged = _logged(tmp_path)
    assert len(logged) == logged_before + 1 and logged[-1]["step"] == 2
    assert {k: v for k, v in logged[-1].items() if k.startswith("val-core/")} == {
        k: v for k, v in metrics.items() if k.startswith("val-core/")
    }

    # 3) without a checkpoint it validates the initial policy at step 0
    initial = tmp_path / "initial_val"
    metrics0 = _validate_initial_policy(tiny_model_dir, tiny_data_dir, tmp_path, initial)
    assert steps == [] and metrics0["training/global_step"] == 0
    assert _answers(initial, 0) == before_training


@pytest.mark.parametrize(
    "extra, message",
    [
        (
            ["trainer.val_before_train=False"],
            "trainer.val_only=True validates in the place of trainer.val_before_train",
        ),
        (
            ["trainer.val_before_train=True", "trainer.rollout_only=True"],
            "trainer.val_only=True and trainer.rollout_only",
        ),
    ],
)
def test_val_only_refuses_settings_it_cannot_honour(tiny_model_dir, tiny_data_dir, tmp_path, extra, message):
    config = _config(tiny_model_dir, tiny_data_dir, tmp_path, "trainer.val_only=True", *extra)
    with pytest.raises(ConfigError, match=message):
        checked_config(config)


def _prompts(directory, step) -> list[str]:
    with open(directory / f"{step}.jsonl") as f:
        return [json.loads(line)["input"] for line in f]


def test_validation_shuffle_validates_the_same_prompts_in_a_drawn_order(tiny_model_dir, tiny_data_dir, tmp_path):
    runs = {}
    for name, extra in (
        ("file", []),
        ("shuffled", ["data.validation_shuffle=True"]),
        ("again", ["data.validation_shuffle=True"]),
    ):
        out = tmp_path / name
        metrics = _validate_initial_policy(tiny_model_dir, tiny_data_dir, tmp_path, out, *extra)
        runs[name] = (_prompts(out, 0), metrics)
    (in_file, file_metrics), (shuffled, shuffled_metrics), (again, _) = runs["file"], runs["shuffled"], runs["again"]
    assert sorted(shuffled) == sorted(in_file) and shuffled != in_file  # the same rows, another order
    assert again == shuffled  # drawn from data.seed and the step: reproducible
    # the same metrics (their values may differ in the last bits: hf generation batches rows in another company)
    assert {k for k in shuffled_metrics if k.startswith("val-")} == {k for k in file_metrics if k.startswith("val-")}
