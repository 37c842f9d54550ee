"""configs/ppo_trainer.yaml is what ``python -m devtools.config_yaml`` writes from the
declarations in hybridflow/config/: editing one side only fails here."""

from __future__ import annotations

import dataclasses

import pytest
import yaml

from devtools import config_yaml
from hybridflow.config import ConfigError
from hybridflow.config.base import BaseConfig, doc, section


def test_the_committed_yaml_is_what_the_generator_writes():
    assert config_yaml.main(["--check"]) == 0


def test_a_changed_default_or_doc_makes_the_file_stale():
    """Not vacuous: a different default, and a different doc, each change the text at that key."""
    factory, header = config_yaml.CONFIGS["ppo_trainer.yaml"]
    text = (config_yaml.ROOT / "configs" / "ppo_trainer.yaml").read_text()
    cfg = factory()
    object.__setattr__(cfg.data, "train_batch_size", 7)
    changed = config_yaml.render(cfg, header)
    assert changed != text
    assert yaml.safe_load(changed)["data"]["train_batch_size"] == 7
    assert "  train_batch_size: 7  # prompts per training step" in changed.splitlines()


@dataclasses.dataclass
class _Inner(BaseConfig):
    a: int = doc(1, "the a")
    b: int = doc(2, "the b", follows="${.a}")


@dataclasses.dataclass
class _Outer(BaseConfig):
    n: int = doc(3, "the n")
    inner: _Inner = section(_Inner, "inner section", follows={"a": "${n}", "b": None})
    other: _Inner = section(_Inner, "another place", absent=("a",))


def test_render_writes_values_interpolations_docs_and_places():
    text = config_yaml.render(_Outer(), "a header")
    assert text.splitlines() == [
        "# a header",
        "",
        "# the n",
        "n: 3",
        "",
        "# inner section",
        "inner:",
        "  a: ${n}  # the a",  # the place's interpolation
        "  b: 2  # the b",  # the place turns the field's own interpolation off
        "",
        "# another place",
        "other:",
        "  b: ${.a}  # the b",  # a left out at this place; b keeps its own
    ]


def test_a_follows_that_names_no_key_is_refused():
    @dataclasses.dataclass
    class Bad(BaseConfig):
        inner: _Inner = section(_Inner, "inner", follows={"c": "${x}"})

    with pytest.raises(ConfigError, match="inner: follows names 'c'"):
        config_yaml.render(Bad())


@pytest.mark.parametrize("name", sorted(config_yaml.CONFIGS))
def test_every_value_survives_the_round_trip(name):
    """The text reads back (yaml, no resolution) as the declared tree, interpolation strings included."""
    from hybridflow.config.tree import raw_tree

    factory = config_yaml.CONFIGS[name][0]
    assert yaml.safe_load(config_yaml.render(factory(), "")) == raw_tree(factory())


@pytest.mark.parametrize("name", sorted(config_yaml.CONFIGS))
def test_interpolations_resolve_to_the_declared_defaults(name):
    """Each generated file, resolved, holds the declared defaults (a follows that points elsewhere fails)."""
    from omegaconf import OmegaConf

    from hybridflow.config.tree import raw_tree

    factory = config_yaml.CONFIGS[name][0]
    resolved = OmegaConf.to_container(OmegaConf.create(raw_tree(factory())), resolve=True)
    assert resolved == raw_tree(factory(), interpolate=False)


def test_a_changed_sft_default_makes_the_file_stale():
    """sft_trainer.yaml is generated too: a changed default of its declaration changes the text at that key."""
    factory, header = config_yaml.CONFIGS["sft_trainer.yaml"]
    text = (config_yaml.ROOT / "configs" / "sft_trainer.yaml").read_text()
    assert config_yaml.render(factory(), header) == text
    cfg = factory()
    object.__setattr__(cfg.optim, "lr", 3e-4)
    changed = config_yaml.render(cfg, header)
    assert changed != text
    assert yaml.safe_load(changed)["optim"]["lr"] == 3e-4 and yaml.safe_load(text)["optim"]["lr"] == 1e-5


def test_a_hand_edited_sft_yaml_fails_the_check(tmp_path, monkeypatch, capsys):
    """Editing the generated file instead of the declaration is caught by ``--check``, naming the file."""
    for name in config_yaml.CONFIGS:
        text = (config_yaml.ROOT / "configs" / name).read_text()
        if name == "sft_trainer.yaml":
            assert "  train_batch_size: 256  #" in text
            text = text.replace("  train_batch_size: 256  #", "  train_batch_size: 128  #")
        (tmp_path / name).write_text(text)
    monkeypatch.setattr(config_yaml, "_target", lambda name: tmp_path / name)
    assert config_yaml.main(["--check"]) == 1
    assert "stale: sft_trainer.yaml;" in capsys.readouterr().err
    assert "train_batch_size: 128" in (tmp_path / "sft_trainer.yaml").read_text()  # --check writes nothing
