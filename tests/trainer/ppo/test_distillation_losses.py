"""The distillation losses against values computed by hand (probabilities 1/2, 1/4, 1/10), the
teacher routing, and the refusals of the teacher resolution."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from hybridflow.algorithms.distillation import (
    DISTILLATION_LOSS_REGISTRY,
    combine_with_task_loss,
    distillation_objective,
    get_distillation_loss,
)
from hybridflow.config import DistillationConfig, DistillationLossConfig, DistillationTeacherModelConfig
from hybridflow.trainer.ppo.teacher_setup import resolve_teachers, route_samples

L2 = math.log(2.0)
HALF, QUARTER, TENTH = math.log(0.5), math.log(0.25), math.log(0.1)


@pytest.mark.parametrize(
    "mode, expected",
    [
        ("k1", L2),  # log 1/2 - log 1/4
        ("kl", L2),
        ("abs", L2),
        ("k2", 0.5 * L2**2),
        ("mse", 0.5 * L2**2),
        ("k3", 0.5 + L2 - 1.0),  # r - log r - 1 with r = q/p = 1/2
        ("low_var_kl", 0.5 + L2 - 1.0),
    ],
)
def test_reverse_kl_estimators(mode, expected):
    loss = get_distillation_loss(mode)
    assert not loss.use_topk
    out = loss.fn(torch.tensor([[HALF]]), torch.tensor([[QUARTER]]), -0.1)  # the clamp is not theirs
    assert out.item() == pytest.approx(expected, abs=1e-6)


def test_forward_kl_topk_by_hand():
    loss = get_distillation_loss("forward_kl_topk")
    assert loss.use_topk and set(DISTILLATION_LOSS_REGISTRY) >= {"k3", "forward_kl_topk"}
    teacher = torch.tensor([[[HALF, QUARTER], [TENTH, TENTH]]])
    student = torch.tensor([[[QUARTER, QUARTER], [HALF, HALF]]])
    out = loss.fn(student, teacher, None)
    # 1/2 (log 1/2 - log 1/4) + 1/4 * 0; second position negative (top-k mass < 1): clamped to 0
    assert out.tolist()[0] == pytest.approx([0.5 * L2, 0.0], abs=1e-6)
    clamped = loss.fn(student, teacher, -1.0)  # log 1/4 -> -1 on both sides
    assert clamped[0, 0].item() == pytest.approx(0.5 * (HALF + 1.0), abs=1e-6)


MASK = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
TOKENS = torch.tensor([[1.0, 3.0], [2.0, 9.0]])  # 9 sits on padding


def objective(cfg, log_prob=None):
    log_prob = torch.zeros(2, 2, requires_grad=True) if log_prob is None else log_prob
    loss, metrics = distillation_objective(TOKENS, log_prob, torch.zeros(2, 2), MASK, cfg, "token-mean", {})
    return loss, metrics, log_prob


def test_supervised_objective_and_clamp():
    loss, metrics, _ = objective(DistillationLossConfig())
    assert loss.item() == pytest.approx(2.0) and metrics == {}  # (1 + 3 + 2) / 3
    loss, _, _ = objective(DistillationLossConfig(loss_max_clamp=2.5))
    assert loss.item() == pytest.approx((1 + 2.5 + 2) / 3)


def test_policy_gradient_objective_uses_minus_loss_as_advantage():
    cfg = DistillationLossConfig(use_policy_gradient=True, loss_mode="k1")
    loss, metrics, log_prob = objective(cfg)
    assert loss.item() == pytest.approx(2.0)  # ratio 1: -A * 1 averaged over the 3 tokens
    loss.backward()
    assert log_prob.grad.flatten().tolist() == pytest.approx([1 / 3, 1.0, 2 / 3, 0.0])  # -A / 3 per token
    assert {"distillation/pg_clipfrac", "distillation/ppo_kl"} <= set(metrics)


def test_combination_with_the_task_loss():
    d = torch.tensor(2.0)
    assert combine_with_task_loss(1.0, d, DistillationLossConfig(distillation_loss_coef=0.5)).item() == 2.0
    assert combine_with_task_loss(1.0, d, DistillationLossConfig(use_task_rewards=False)).item() == 2.0


def teachers(**named) -> DistillationConfig:
    return DistillationConfig(
        enabled=True, teacher_models={k: DistillationTeacherModelConfig(**v) for k, v in named.items()}
    )


def test_teacher_resolution_as_verl():
    single = resolve_teachers(teachers(teacher_model={"model_path": "/t"}))
    assert list(single) == ["default"] and single["default"][0] == "teacher_model"
    # another teacher added: teacher_model is dropped, each keyed by its key
    multi = resolve_teachers(
        teachers(
            teacher_model={"model_path": "/t"},
            a={"model_path": "/a", "key": "gsm"},
            b={"model_path": "/b", "key": "math"},
        )
    )
    assert {k: v[0] for k, v in multi.items()} == {"gsm": "a", "math": "b"}
    with pytest.raises(ValueError, match="teacher_models.teacher_model.model_path"):
        resolve_teachers(teachers(teacher_model={}))
    with pytest.raises(ValueError, match="teacher_models.b.key"):
        resolve_teachers(teachers(a={"model_path": "/a", "key": "x"}, b={"model_path": "/b", "key": "x"}))
    k1 = DistillationConfig(
        enabled=True,
        teacher_models={"teacher_model": DistillationTeacherModelConfig(model_path="/t")},
        distillation_loss=DistillationLossConfig(loss_mode="k1"),
    )
    with pytest.raises(ValueError, match="use_policy_gradient"):
        resolve_teachers(k1)


def test_route_samples_by_teacher_key():
    parts = route_samples(np.array(["gsm", "math", "gsm"], dtype=object), ["gsm", "math"])
    assert {k: v.tolist() for k, v in parts.items()} == {"gsm": [0, 2], "math": [1]}
    assert route_samples([None, None], ["default"])["default"].tolist() == [0, 1]
    with pytest.raises(ValueError, match="'code'"):
        route_samples(np.array(["code"], dtype=object), ["gsm", "math"])
