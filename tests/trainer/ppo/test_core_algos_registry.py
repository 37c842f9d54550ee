"""Registries (lookup, errors, user extension) and config= given as an object or a mapping."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from hybridflow.trainer.ppo import core_algos
from hybridflow.trainer.ppo.core_algos import AdvantageEstimator

T = torch.tensor


def test_builtin_estimators_resolve_by_name_and_enum():
    assert core_algos.get_adv_estimator_fn("gae") is core_algos.compute_gae_advantage_return
    assert core_algos.get_adv_estimator_fn(AdvantageEstimator.GRPO) is core_algos.compute_grpo_outcome_advantage
    for est in AdvantageEstimator:  # every enum value has an implementation
        assert callable(core_algos.get_adv_estimator_fn(est))
    assert AdvantageEstimator("reinforce_plus_plus_baseline") == "reinforce_plus_plus_baseline"
    assert core_algos.get_policy_loss_fn("vanilla") is core_algos.compute_policy_loss_vanilla
    assert core_algos.get_policy_loss_fn("gspo") is core_algos.compute_policy_loss_gspo


def test_unknown_names_list_known_ones():
    with pytest.raises(KeyError) as err:
        core_algos.get_adv_estimator_fn("ppo_magic")
    assert "ppo_magic" in str(err.value) and "gae" in str(err.value) and "rloo" in str(err.value)
    with pytest.raises(KeyError, match="vanilla"):
        core_algos.get_policy_loss_fn("nope")


def test_duplicate_registration_is_an_error():
    """An estimator under a taken name is refused (veRL's register_adv_est); a policy loss under a taken
    name replaces the earlier one, as veRL's register_policy_loss does (tests/utils/test_registry.py)."""
    with pytest.raises(ValueError, match="has already been registered"):
        core_algos.register_adv_est("gae")(lambda *a, **k: None)
    with pytest.raises(ValueError, match="has already been registered"):
        core_algos.register_adv_est(AdvantageEstimator.RLOO)(lambda *a, **k: None)
    assert core_algos.get_adv_estimator_fn("gae") is core_algos.compute_gae_advantage_return


@pytest.fixture
def scratch_names():
    yield
    core_algos.ADV_ESTIMATOR_REGISTRY._entries.pop("test_sign_only", None)
    core_algos.POLICY_LOSS_REGISTRY._entries.pop("test_zero", None)


def test_user_registered_functions_are_retrievable(scratch_names):
    @core_algos.register_adv_est("test_sign_only")
    def sign_only(token_level_rewards, response_mask, config=None, **kwargs):
        adv = torch.sign(token_level_rewards.sum(-1, keepdim=True)) * response_mask
        return adv, adv

    @core_algos.register_policy_loss("test_zero")
    def zero_loss(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean", config=None):
        z = (log_prob * 0).sum()
        return z, z.detach(), z.detach(), z.detach()

    fn = core_algos.get_adv_estimator_fn("test_sign_only")
    assert fn is sign_only
    adv, _ = fn(token_level_rewards=T([[0.0, -2.0]]), response_mask=T([[1.0, 1.0]]), index=np.array(["a"]))
    torch.testing.assert_close(adv, T([[-1.0, -1.0]]))
    assert core_algos.get_policy_loss_fn("test_zero") is zero_loss
    assert "test_sign_only" in core_algos.ADV_ESTIMATOR_REGISTRY.names()


WRAPS = [dict, lambda d: SimpleNamespace(**d), OmegaConf.create]


@pytest.mark.parametrize("wrap", WRAPS)
def test_gae_config_supplies_gamma_lam(wrap):
    g = torch.Generator().manual_seed(0)
    rewards, values = torch.randn(3, 4, generator=g), torch.randn(3, 4, generator=g)
    mask = torch.ones(3, 4)
    ref = core_algos.compute_gae_advantage_return(rewards, values, mask, 0.9, 0.7)
    got = core_algos.compute_gae_advantage_return(rewards, values, mask, config=wrap({"gamma": 0.9, "lam": 0.7}))
    for a, b in zip(ref, got, strict=True):
        torch.testing.assert_close(a, b)
    # the config wins over the positional values (veRL: the config supplies them)
    got = core_algos.compute_gae_advantage_return(
        rewards, values, mask, 0.1, 0.1, config=wrap({"gamma": 0.9, "lam": 0.7})
    )
    torch.testing.assert_close(got[1], ref[1])
    other = core_algos.compute_gae_advantage_return(rewards, values, mask, 0.1, 0.1)
    assert not torch.allclose(other[1], ref[1])


@pytest.mark.parametrize("wrap", WRAPS)
def test_grpo_and_reinforce_config(wrap):
    rewards = T([[1.0, 0.0], [0.0, 0.0], [3.0, 0.0]])
    mask = torch.ones(3, 2)
    index = np.array(["a", "a", "a"], dtype=object)
    # mean 4/3, no std division -> [-1/3, -4/3, 5/3]
    adv, _ = core_algos.compute_grpo_outcome_advantage(
        rewards, mask, index, config=wrap({"norm_adv_by_std_in_grpo": False, "gamma": 1.0})
    )
    torch.testing.assert_close(adv[:, 0], T([-1 / 3, -4 / 3, 5 / 3]))
    # REINFORCE++ gamma from config: row 1 r = [1, 0] -> G = [1, 0]; gamma 0.5 on row r = [0, 2] -> [1, 2]
    r = T([[1.0, 0.0], [0.0, 2.0]])
    _, ret = core_algos.compute_reinforce_plus_plus_outcome_advantage(r, torch.ones(2, 2), config=wrap({"gamma": 0.5}))
    torch.testing.assert_close(ret, T([[1.0, 0.0], [1.0, 2.0]]))
    # newer veRL passes the config third, positionally
    _, ret2 = core_algos.compute_reinforce_plus_plus_outcome_advantage(r, torch.ones(2, 2), wrap({"gamma": 0.5}))
    torch.testing.assert_close(ret2, ret)


@pytest.mark.parametrize("wrap", WRAPS)
def test_policy_loss_config_object_or_mapping(wrap):
    old = torch.zeros(1, 2)
    new = torch.log(T([[1.5, 0.5]]))
    adv = T([[1.0, -1.0]])
    # clip 0.2 both ways: token 1 (A=+1, ratio 1.5) -> -1.2; token 2 (A=-1, ratio 0.5) -> 0.8; mean -0.2
    loss, *_ = core_algos.get_policy_loss_fn("vanilla")(
        old, new, adv, torch.ones(1, 2), "token-mean", wrap({"clip_ratio": 0.2, "clip_ratio_c": 3.0})
    )
    torch.testing.assert_close(loss, T(-0.2))
