"""The Registry type and the module-level registries behave like the dicts veRL exposes (issue 14)."""

from collections.abc import Mapping

import pytest

from hybridflow.rewards import registry as reward_manager
from hybridflow.trainer.ppo import core_algos
from hybridflow.utils.registry import Registry, UnknownNameError


def _f():
    return 1


def _g():
    return 2


def test_registry_is_a_dict_like_mapping():
    reg = Registry("widget")
    reg.register("a", _f)
    reg["b"] = _g  # dict-style registration, as veRL code does with REGISTRY[name] = fn
    assert isinstance(reg, Mapping)
    assert len(reg) == 2 and list(reg.keys()) == ["a", "b"] and list(reg) == ["a", "b"]
    assert reg["a"] is _f and "b" in reg and "c" not in reg
    assert dict(reg.items()) == {"a": _f, "b": _g} and list(reg.values()) == [_f, _g]
    assert reg.get("c", None) is None and reg.get("c") is None and reg.get("c", _f) is _f  # dict.get
    assert reg.pop("b") is _g and "b" not in reg
    del reg["a"]
    assert len(reg) == 0
    reg.register("a", _f)
    reg.clear()
    assert len(reg) == 0 and list(reg.keys()) == []


def test_same_object_again_is_fine_a_different_one_raises():
    reg = Registry("widget")
    reg.register("a")(_f)
    reg.register("a")(_f)  # a module imported twice, a decorator run again
    reg["a"] = _f
    with pytest.raises(ValueError, match="widget a has already been registered"):  # veRL's words
        reg.register("a")(_g)
    assert reg["a"] is _f
    reg.register("a", _g, override=True)  # replacing on purpose
    assert reg["a"] is _g
    reg["a"] = _f  # a dict assignment replaces, as in veRL's dicts
    assert reg["a"] is _f


def test_unknown_name_lists_the_known_ones_and_is_key_and_value_error():
    reg = Registry("widget")
    reg.register("alpha", _f)
    reg.register("beta", _g)
    with pytest.raises(UnknownNameError) as err:
        reg["gamma"]
    assert "gamma" in str(err.value) and "alpha" in str(err.value) and "beta" in str(err.value)
    assert isinstance(err.value, KeyError) and isinstance(err.value, ValueError)
    with pytest.raises(KeyError):
        del reg["gamma"]


def test_core_algos_registries_behave_like_verls_dicts():
    reg = core_algos.ADV_ESTIMATOR_REGISTRY
    n = len(reg)
    assert n >= 11 and "gae" in reg and "rloo_vectorized" in reg and "grpo_vectorized" in reg
    assert reg["grpo"] is core_algos.compute_grpo_outcome_advantage
    assert dict(reg.items())["gae"] is core_algos.compute_gae_advantage_return
    # re-registering the same function under its name is fine (veRL compares with !=)
    core_algos.register_adv_est("gae")(core_algos.compute_gae_advantage_return)
    core_algos.register_policy_loss("vanilla")(core_algos.compute_policy_loss_vanilla)
    assert len(reg) == n
    # veRL's get_*_fn raise ValueError for unknown names, in its words; ours is also a KeyError and lists them
    with pytest.raises(ValueError, match="^Unknown advantage estimator simply: nope; known: .*gae"):
        core_algos.get_adv_estimator_fn("nope")
    with pytest.raises(ValueError, match="^Unsupported loss mode: nope; known: .*vanilla"):
        core_algos.get_policy_loss_fn("nope")
    with pytest.raises(ValueError, match="Adv estimator gae has already been registered"):
        core_algos.register_adv_est("gae")(core_algos.compute_grpo_outcome_advantage)
    assert reg.get("nope") is None and list(reg.keys())[:2] == ["gae", "grpo"]  # dict.get; registration order


def test_a_policy_loss_registered_again_replaces_the_earlier_one_as_in_verl():
    reg = core_algos.POLICY_LOSS_REGISTRY
    original = reg["vanilla"]

    def mine(*args, **kwargs):
        return original(*args, **kwargs)

    try:
        core_algos.register_policy_loss("vanilla")(mine)
        assert core_algos.get_policy_loss_fn("vanilla") is mine
    finally:
        reg["vanilla"] = original
    assert core_algos.get_policy_loss_fn("vanilla") is original
    assert set(core_algos.POLICY_LOSS_REGISTRY.keys()) >= {"vanilla", "gspo", "gpg"}


def test_clear_and_restore_a_module_registry():
    # A test suite (veRL's own do this) may clear a registry and put entries back.
    reg = core_algos.POLICY_LOSS_REGISTRY
    saved = dict(reg.items())
    try:
        reg.clear()
        assert len(reg) == 0
        with pytest.raises(KeyError):
            core_algos.get_policy_loss_fn("vanilla")
    finally:
        for name, fn in saved.items():
            reg[name] = fn
    assert core_algos.get_policy_loss_fn("vanilla") is core_algos.compute_policy_loss_vanilla


def test_reward_manager_registry_under_verls_names():
    from hybridflow.workers.reward_manager import registry as verl_path

    reg = reward_manager.REWARD_MANAGER_REGISTRY
    assert reg is reward_manager.REWARD_MANAGERS is verl_path.REWARD_MANAGER_REGISTRY and "naive" in reg
    assert reward_manager.get_reward_manager_cls("naive") is reg["naive"]

    @reward_manager.register("test_parity_manager")
    class Custom(reg["naive"]):
        pass

    try:
        assert reg["test_parity_manager"] is Custom
        reward_manager.register("test_parity_manager")(Custom)  # same class again: fine
        with pytest.raises(ValueError, match="Reward manager test_parity_manager has already been registered"):
            reward_manager.register("test_parity_manager")(reg["naive"])
        with pytest.raises(ValueError, match="^Unknown reward manager: nope; known: .*naive"):
            reward_manager.get_reward_manager_cls("nope")
    finally:
        reg.pop("test_parity_manager", None)
