"""KL estimators, KL controllers and the KL-penalised reward."""

import math
from types import SimpleNamespace

import pytest
import torch
from omegaconf import OmegaConf

from hybridflow.trainer.ppo import core_algos

T = torch.tensor

# logprob = ln 0.5, ref = ln 0.25 -> x = log(pi/pi_ref) = ln 2 = 0.693147
#   k1 = x = 0.693147;  abs = 0.693147;  k2 = x^2/2 = 0.240227;  k3 = exp(-x) + x - 1 = 0.5 + 0.693147 - 1 = 0.193147
X = math.log(2.0)
KL_CASES = {"kl": X, "k1": X, "abs": X, "mse": X * X / 2, "k2": X * X / 2, "low_var_kl": 0.5 + X - 1, "k3": 0.5 + X - 1}


@pytest.mark.parametrize("name", list(KL_CASES))
def test_kl_types_by_hand(name):
    lp, ref = T([[math.log(0.5)]], dtype=torch.float64), T([[math.log(0.25)]], dtype=torch.float64)
    torch.testing.assert_close(core_algos.kl_penalty(lp, ref, name), T([[KL_CASES[name]]], dtype=torch.float64))


def test_kl_signs_and_clamps():
    lp, ref = T([math.log(0.25)]), T([math.log(0.5)])  # x = -ln 2
    assert core_algos.kl_penalty(lp, ref, "k1").item() == pytest.approx(-X)
    assert core_algos.kl_penalty(lp, ref, "abs").item() == pytest.approx(X)
    # k3 with x = -ln 2: exp(ln 2) - ln 2 - 1 = 2 - 0.693147 - 1 = 0.306853
    assert core_algos.kl_penalty(lp, ref, "k3").item() == pytest.approx(1 - X)
    # large gaps: ref - lp = 5 -> e^5 - 6 = 142.4 -> clamped to 10; ref - lp = -30 -> clamp(-20): e^-20 + 19 -> 10
    out = core_algos.kl_penalty(T([0.0, 0.0]), T([5.0, -30.0]), "low_var_kl")
    torch.testing.assert_close(out, T([10.0, 10.0]))


def test_kl_straight_through_and_errors():
    lp = T([math.log(0.5)], requires_grad=True)
    ref = T([math.log(0.25)])
    val = core_algos.kl_penalty(lp, ref, "k3+")
    assert val.item() == pytest.approx(0.5 + X - 1)  # value of k3
    val.backward()
    assert lp.grad.item() == pytest.approx(X)  # gradient of k2 = x
    with pytest.raises(NotImplementedError, match="full"):
        core_algos.kl_penalty(lp, ref, "full")
    with pytest.raises(KeyError, match="low_var_kl"):
        core_algos.kl_penalty(lp, ref, "k4")


def test_adaptive_controller_by_hand():
    # init 0.1, target 0.5, horizon 100, n_steps 50
    # kl 1.0: error = clip(1.0/0.5 - 1 = 1, +-0.2) = 0.2 -> x (1 + 0.2*50/100) = 1.1 -> 0.11
    # kl 0.45: error = 0.9 - 1 = -0.1 -> x (1 - 0.1*0.5) = 0.95 -> 0.1045
    ctrl = core_algos.AdaptiveKLController(init_kl_coef=0.1, target_kl=0.5, horizon=100)
    ctrl.update(T(1.0), n_steps=50)
    assert ctrl.value == pytest.approx(0.11)
    ctrl.update(0.45, n_steps=50)
    assert ctrl.value == pytest.approx(0.1045)
    fixed = core_algos.FixedKLController(0.3)
    fixed.update(123.0, 10)
    assert fixed.value == 0.3


@pytest.mark.parametrize("wrap", [dict, lambda d: SimpleNamespace(**d), OmegaConf.create])
def test_get_kl_controller_from_object_or_mapping(wrap):
    fixed = core_algos.get_kl_controller(wrap({"type": "fixed", "kl_coef": 0.2}))
    assert isinstance(fixed, core_algos.FixedKLController) and fixed.value == 0.2
    adaptive = core_algos.get_kl_controller(
        wrap({"type": "adaptive", "kl_coef": 0.1, "target_kl": 0.5, "horizon": 100})
    )
    assert isinstance(adaptive, core_algos.AdaptiveKLController)
    assert (adaptive.value, adaptive.target, adaptive.horizon) == (0.1, 0.5, 100)
    with pytest.raises(ValueError):
        core_algos.get_kl_controller(wrap({"type": "adaptive", "kl_coef": 0.1, "target_kl": 0.5, "horizon": 0}))
    with pytest.raises(NotImplementedError, match="adaptive"):
        core_algos.get_kl_controller(wrap({"type": "pid", "kl_coef": 0.1}))


def test_compute_rewards():
    # 1 - 0.5 * (-0.2 - -0.5) = 1 - 0.15 = 0.85
    torch.testing.assert_close(core_algos.compute_rewards(T([1.0]), T([-0.2]), T([-0.5]), 0.5), T([0.85]))


def test_apply_kl_penalty_to_rewards():
    # kl (k1) = old - ref = [[0.1, 0.2, 0.3], [0.4, 0.5, junk]]; mask row 2 = [1, 1, 0]; beta = 0.5
    # rewards = scores - 0.5 * kl on valid tokens: [[-0.05, -0.1, 0.85], [-0.2, 0.75, 0]]
    # reported kl = mean over sequences of per-sequence means = (0.2 + 0.45) / 2 = 0.325
    scores = T([[0.0, 0.0, 1.0], [0.0, 1.0, 0.0]])
    ref = torch.zeros(2, 3)
    old = T([[0.1, 0.2, 0.3], [0.4, 0.5, 9.0]])
    mask = T([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    rewards, metrics = core_algos.apply_kl_penalty_to_rewards(
        scores, old, ref, mask, core_algos.FixedKLController(0.5), "kl"
    )
    torch.testing.assert_close(rewards, T([[-0.05, -0.1, 0.85], [-0.2, 0.75, 0.0]]))
    torch.testing.assert_close(metrics["actor/reward_kl_penalty"], T(0.325))
    assert metrics["actor/reward_kl_penalty_coeff"] == 0.5
    # adaptive: the reward uses the coefficient before the update; update with kl 0.325, target 0.65,
    # horizon 4, n_steps = batch 2: error = clip(0.5 - 1, +-0.2) = -0.2 -> 0.5 * (1 - 0.2*2/4) = 0.45
    ctrl = core_algos.AdaptiveKLController(0.5, 0.65, 4)
    rewards2, metrics2 = core_algos.apply_kl_penalty_to_rewards(scores, old, ref, mask, ctrl, "kl")
    torch.testing.assert_close(rewards2, rewards)
    assert metrics2["actor/reward_kl_penalty_coeff"] == 0.5 and ctrl.value == pytest.approx(0.45)
