"""On-policy distillation on the tiny model: the student (seed 0) learns from a teacher of the same
tokenizer (seed 1) served on the hf engine. With the distillation loss alone, the student-teacher KL
that the actor logs falls over the steps and every metric is finite."""

from __future__ import annotations

import pytest

from hybridflow.config.loader import load_config
from hybridflow.main_ppo import run_ppo
from tests.trainer.e2e_helpers import assert_finite, base_overrides, read_metrics

STEPS = 6


@pytest.fixture(scope="module")
def teacher_dir(tmp_path_factory) -> str:
    from hybridflow.models.tiny import save_tiny_model

    return save_tiny_model(str(tmp_path_factory.mktemp("teacher")), seed=1)


def distill_overrides(teacher_dir: str, loss_mode: str, *extra: str) -> list[str]:
    return [
        "distillation.enabled=True",
        f"distillation.teacher_models.teacher_model.model_path={teacher_dir}",
        "distillation.teacher_models.teacher_model.inference.name=hf",
        "distillation.teacher_models.teacher_model.inference.dtype=float32",
        f"distillation.distillation_loss.loss_mode={loss_mode}",
        "distillation.distillation_loss.topk=8",
        *extra,
    ]


def run_distillation(model_dir, data_dir, teacher_dir, tmp_path, loss_mode, *extra) -> list[dict]:
    overrides = base_overrides(model_dir, data_dir, tmp_path, steps=STEPS, backend="inprocess")
    overrides += ["trainer.test_freq=-1", "actor_rollout_ref.actor.optim.lr=3e-3"]
    run_ppo(load_config("ppo_trainer", overrides + distill_overrides(teacher_dir, loss_mode, *extra)))
    steps = [m for m in read_metrics(tmp_path) if "distillation/kl" in m]
    assert len(steps) == STEPS
    for m in steps:
        assert_finite(m)
        assert "timing_s/teacher" in m and "distillation/loss" in m
    return steps


def test_topk_distillation_moves_the_student_toward_the_teacher(tiny_model_dir, tiny_data_dir, teacher_dir, tmp_path):
    steps = run_distillation(
        tiny_model_dir,
        tiny_data_dir,
        teacher_dir,
        tmp_path,
        "forward_kl_topk",
        "distillation.distillation_loss.use_task_rewards=False",
    )
    kl = [m["distillation/kl"] for m in steps]
    assert sum(kl[-2:]) / 2 < 0.8 * sum(kl[:2]) / 2, kl


@pytest.mark.slow
def test_policy_gradient_distillation_with_task_rewards(tiny_model_dir, tiny_data_dir, teacher_dir, tmp_path):
    """k1 as a per-token advantage beside the task's GRPO loss: both terms are logged and finite."""
    steps = run_distillation(
        tiny_model_dir,
        tiny_data_dir,
        teacher_dir,
        tmp_path,
        "k1",
        "distillation.distillation_loss.use_policy_gradient=True",
    )
    assert all("distillation/pg_clipfrac" in m and "actor/pg_loss" in m for m in steps)
