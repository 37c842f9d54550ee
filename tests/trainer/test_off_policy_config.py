"""validate_ppo_config on algorithm.rollout_correction and algorithm.filter_groups: bad values and
combinations that would silently do something else fail (or are explained) at start-up."""

import pytest

from hybridflow.config.loader import ConfigError, load_config
from hybridflow.trainer.config_checks import validate_ppo_config
from tests.trainer.test_config_checks import QUICKSTART

RC = "algorithm.rollout_correction"


def _check(*overrides):
    return validate_ppo_config(load_config("ppo_trainer", [*QUICKSTART, *overrides]))


def test_defaults_pass_and_are_veRLs():
    cfg = load_config("ppo_trainer", QUICKSTART)
    assert dict(cfg.algorithm.rollout_correction) == {
        "rollout_is": None,
        "rollout_is_threshold": 2.0,
        "rollout_rs": None,
        "rollout_rs_threshold": None,
        "bypass_mode": False,
        "loss_type": "ppo_clip",
        "rollout_is_batch_normalize": False,
    }
    assert dict(cfg.algorithm.filter_groups) == {
        "_target_": "verl.trainer.config.FilterGroupsConfig",
        "enable": False,
        "metric": "reward",
        "max_num_gen_batches": 0,
        "max_inflight_gen_batches": 1,
    }
    validate_ppo_config(cfg)


@pytest.mark.parametrize(
    "overrides, message",
    [
        ([f"{RC}.rollout_rs=seq_mean_k3"], f"{RC}.rollout_rs='seq_mean_k3' needs {RC}.rollout_rs_threshold"),
        ([f"{RC}.rollout_is=tok"], f"{RC}.rollout_is='tok'"),
        ([f"{RC}.rollout_is=token", f"{RC}.rollout_is_threshold=abc"], "'abc' is not a number"),
        ([f"{RC}.bypass_mode=True", "actor_rollout_ref.rollout.calculate_log_probs=False"], "calculate_log_probs=True"),
        ([f"{RC}.rollout_is=token", "actor_rollout_ref.rollout.calculate_log_probs=False"], "calculate_log_probs=True"),
        ([f"{RC}.bypass_mode=True", "actor_rollout_ref.actor.policy_loss.loss_mode=gspo"], "loss_mode=gspo"),
        (["actor_rollout_ref.actor.policy_loss.loss_mode=bypass_mode"], "set that instead"),
        (["algorithm.filter_groups.enable=True", "algorithm.filter_groups.metric=null"], "filter_groups.metric must"),
        (["algorithm.filter_groups.max_inflight_gen_batches=0"], "max_inflight_gen_batches must be >= 1"),
    ],
)
def test_refused_with_the_key(overrides, message):
    with pytest.raises(ConfigError) as err:
        _check(*overrides)
    assert message in str(err.value)


def test_notes_for_settings_that_do_nothing():
    notes = _check(f"{RC}.bypass_mode=True", f"{RC}.rollout_is=sequence")
    assert any("logged, not applied" in n for n in notes)
    notes = _check("algorithm.filter_groups.enable=True", "actor_rollout_ref.rollout.n=1")
    assert any("nothing is filtered" in n for n in notes)
    assert not any("filter_groups" in n or "rollout_correction" in n for n in _check())
