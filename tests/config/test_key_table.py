"""The status table derived from declarations (hybridflow.config.key_table): each key's status is
written with its declaration, a place can change it for a class used in several places, and patterns
cover keys users add with +."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from hybridflow.config.base import BaseConfig, doc, section, undeclared
from hybridflow.config.errors import ConfigError
from hybridflow.config.key_table import derive_table
from hybridflow.config.status import HONOURED, NOT_SUPPORTED, NOTE, honoured, noted, refused
from hybridflow.config.support import SupportError, check_support


@dataclass
class Engine(BaseConfig):
    _target_: str = doc("pkg.Engine", "the class")
    lr: float = doc(0.1, "learning rate")
    offload: bool = doc(False, "offload", refused="no offload")
    fused: bool = doc(False, "fused kernels", note="speed only")
    kind: str = doc("a", "the kind", values=("a", "b"), reason="a and b are implemented")
    kwargs: dict = doc({}, "engine arguments", reason="passed as they are")


@dataclass
class Root(BaseConfig):
    actor: Engine = section(Engine, "the actor's engine", keys={"megatron.**": refused("no Megatron")})
    critic: Engine = section(
        Engine,
        "the critic's engine",
        keys={"offload": honoured(), "lr": refused("fixed lr"), "kwargs.bad": refused("bad")},
    )
    teacher: Engine = section(Engine, "not implemented", refused="no teacher")
    extra: dict = undeclared("free-form", note="ignored")
    seed: int = doc(1, "seed")
    legacy_seed: int = doc(1, "earlier spelling of seed")


def _table():
    return derive_table("t", Root(), {"**._target_": refused("a class path")}, aliases=(("legacy_seed", "seed"),))


def _status(table, key):
    rule = table.rule_for(key)
    return None if rule is None else (rule.status, rule.reason, rule.values)


def test_declared_statuses():
    t = _table()
    assert _status(t, "actor.lr") == (HONOURED, "", None)
    assert _status(t, "actor.offload") == (NOT_SUPPORTED, "no offload", None)
    assert _status(t, "actor.fused") == (NOTE, "speed only", None)
    assert _status(t, "actor.kind") == (HONOURED, "a and b are implemented", ("a", "b"))
    assert _status(t, "seed") == (HONOURED, "", None)


def test_a_dict_keys_status_covers_the_keys_added_below_it_but_a_scalars_does_not():
    t = _table()
    assert _status(t, "actor.kwargs.anything") == (HONOURED, "passed as they are", None)
    assert _status(t, "extra.a.b") == (NOTE, "ignored", None)
    assert t.rule_for("actor.lr.sub") is None  # +actor.lr.sub: not a key


def test_a_place_changes_the_status_of_a_class_used_elsewhere_with_another():
    t = _table()
    assert _status(t, "critic.offload") == (HONOURED, "", None)
    assert _status(t, "critic.lr") == (NOT_SUPPORTED, "fixed lr", None)
    assert _status(t, "critic.kwargs.bad") == (NOT_SUPPORTED, "bad", None)
    assert _status(t, "critic.kwargs.good") == (HONOURED, "passed as they are", None)
    # the other places keep the declaration
    assert _status(t, "actor.offload") == (NOT_SUPPORTED, "no offload", None)
    assert _status(t, "actor.lr") == (HONOURED, "", None)


def test_a_section_status_covers_everything_below_whatever_the_class_declares():
    t = _table()
    for key in ("teacher.lr", "teacher.fused", "teacher.kind", "teacher.kwargs.x", "teacher.added_with_plus"):
        assert _status(t, key) == (NOT_SUPPORTED, "no teacher", None), key


def test_patterns_for_keys_added_with_plus():
    t = _table()
    assert _status(t, "actor.megatron.tp.size") == (NOT_SUPPORTED, "no Megatron", None)
    assert t.rule_for("critic.megatron.tp") is None  # only the actor's place names it
    assert _status(t, "actor._target_") == (NOT_SUPPORTED, "a class path", None)
    assert t.rule_for("actor.unknown") is None


def test_legacy_spellings_have_no_rule_of_their_own():
    t = _table()
    assert t.alias_of("legacy_seed") == "seed"
    assert t.rule_for("legacy_seed") is None


def test_two_statuses_for_one_key_are_an_error():
    @dataclass
    class Clash(BaseConfig):
        kwargs: dict = doc({}, "arguments", refused="no", keys={"**": noted("maybe")})

    with pytest.raises(ConfigError, match=r"kwargs\.\*\*: two statuses"):
        derive_table("c", Clash())


def test_check_support_applies_the_derived_statuses():
    t = _table()
    defaults = {"actor": {"lr": 0.1, "offload": False, "fused": False, "kind": "a", "kwargs": {}}, "seed": 1}
    raw = {"actor": {"lr": 0.5, "offload": False, "fused": True, "kind": "b", "kwargs": {}}, "seed": 1}
    notes = check_support(t, raw, defaults, raw)
    assert notes == ["actor.fused=True is accepted but not applied: speed only"]
    raw["actor"]["offload"] = True
    raw["actor"]["kind"] = "c"
    with pytest.raises(SupportError) as e:
        check_support(t, raw, defaults, raw)
    assert "actor.offload=True is not supported by hybridflow (default: False): no offload" in str(e.value)
    assert "actor.kind='c' is not supported by hybridflow (supported: 'a', 'b'): a and b are implemented" in str(
        e.value
    )


def test_literal_rules_for_keys_the_tree_lacks_are_the_known_veRL_keys():
    """A literal ``keys=`` entry for a key no yaml holds is a rule for a ``+`` key, so a typo there would silently
    make a rule nobody hits. The list is written out here: a new entry must be added on purpose (check that
    veRL 0.9.1 has the key)."""
    from hybridflow.config.keys import TABLES

    found = {
        (name, r.pattern) for name, table in TABLES.items() for r in table.rules if r.shared and "*" not in r.pattern
    }
    assert found == {
        ("ppo_trainer", "actor_rollout_ref.rollout.sglang_rollout_mode"),
        ("ppo_trainer", "reward.reward_model.rollout.engine_kwargs.vllm"),
        ("ppo_trainer", "reward.reward_model.rollout.engine_kwargs.sglang"),
        ("ppo_trainer", "reward.reward_model.rollout.engine_kwargs.trtllm"),
        ("ppo_trainer", "distillation.teacher_models.teacher_model.inference.engine_kwargs.vllm"),
        ("ppo_trainer", "distillation.teacher_models.teacher_model.inference.engine_kwargs.sglang"),
        ("ppo_trainer", "distillation.teacher_models.teacher_model.inference.engine_kwargs.trtllm"),
        ("generation", "rollout.engine_kwargs.sglang"),
        ("generation", "rollout.engine_kwargs.trtllm"),
        ("generation", "rollout.sglang_rollout_mode"),
    }
