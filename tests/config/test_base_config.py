"""veRL's BaseConfig behaviour on hybridflow's sections: mapping access, read-only fields, pickling."""

from __future__ import annotations

import dataclasses
import pickle
from dataclasses import FrozenInstanceError, dataclass

import pytest

from hybridflow.base_config import BaseConfig
from hybridflow.config import FSDPOptimizerConfig, KLControlConfig, field_doc
from hybridflow.config.base import doc


def test_a_section_reads_like_a_mapping():
    cfg = KLControlConfig(kl_coef=0.2)
    assert cfg["kl_coef"] == cfg.kl_coef == 0.2
    assert cfg.get("horizon") == 10000 and cfg.get("no_such_key", "fallback") == "fallback"
    assert list(cfg) == ["_target_", "type", "kl_coef", "horizon", "target_kl"]
    assert len(cfg) == 5
    assert dict(cfg)["target_kl"] == 0.1  # a Mapping: dict(), keys(), items() work
    assert "kl_coef" in cfg and "no_such_key" not in cfg and 3 not in cfg


def test_unknown_and_non_string_keys():
    cfg = KLControlConfig()
    with pytest.raises(AttributeError):
        cfg["no_such_key"]
    with pytest.raises(TypeError):
        cfg[0]


def test_fields_are_frozen_unless_declared_mutable():
    cfg = FSDPOptimizerConfig()
    with pytest.raises(FrozenInstanceError, match="lr"):
        cfg.lr = 0.1
    cfg.total_training_steps = 100  # the trainer fills it in (in _mutable_fields)
    assert cfg["total_training_steps"] == 100


def test_a_users_subclass_gets_the_same_interface():
    @dataclass
    class MyConfig(BaseConfig):
        _mutable_fields = {"steps"}
        steps: int = doc(1, "how many")
        name: str = doc("x", "what")

    cfg = MyConfig(name="y")
    cfg.steps = 2
    with pytest.raises(FrozenInstanceError):
        cfg.name = "z"
    assert (cfg["steps"], cfg.get("name"), len(cfg)) == (2, "y", 3)
    assert field_doc(MyConfig, "steps") == "how many"


def test_copies_and_pickles_are_equal_and_stay_frozen():
    cfg = FSDPOptimizerConfig(lr=3e-4, lr_scheduler_type="cosine")
    again = pickle.loads(pickle.dumps(cfg))
    assert again == cfg and dataclasses.replace(cfg, lr=1e-3).lr == 1e-3
    with pytest.raises(FrozenInstanceError):
        again.lr = 1.0
