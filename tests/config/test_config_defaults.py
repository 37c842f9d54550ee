"""The section classes of hybridflow.config and configs/ppo_trainer.yaml say the same thing: at every
place of ``PPO_TRAINER_SECTIONS`` each field's default equals the yaml's (resolved) value, and each yaml
key is a field; every interpolation a declaration writes resolves to the default it declares. Change a
default on one side only and these tests name the key. configs/sft_trainer.yaml is checked as a whole
against ``SFTTrainerConfig`` the same way."""

from __future__ import annotations

import copy
import dataclasses

import pytest
from omegaconf import OmegaConf

from hybridflow.config import CONFIG_CLASSES, PPOTrainerConfig, SFTTrainerConfig, omega_conf_to_dataclass, to_dict
from hybridflow.config.loader import default_config, load_config
from hybridflow.config.sections import PPO_TRAINER_SECTIONS, Section
from hybridflow.config.tree import raw_tree


def node_at(tree, path: str):
    for part in path.split("."):
        tree = tree[part]
    return tree


def same(a, b) -> bool:
    """Equal, and a bool only equals a bool (True == 1 in Python, not in a config)."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return a == b


def differences(declared: dict, node: dict, path: str, owner: str = "the declaration") -> list[str]:
    """Every way a declared tree of defaults and the yaml ``node`` at ``path`` disagree."""
    out = []
    for key, value in declared.items():
        where = f"{path}.{key}"
        if key not in node:
            out.append(f"{where}: declared by {owner} (default {value!r}) but the yaml lacks it")
        elif isinstance(value, dict) and value and isinstance(node[key], dict):
            out += differences(value, node[key], where, owner)
        elif not same(value, node[key]):
            out.append(f"{where}: default {value!r} in {owner}, {node[key]!r} in the yaml")
    out += [f"{path}.{k}: a yaml key that {owner} does not declare" for k in node if k not in declared]
    return out


def defaults_of(section: Section) -> dict:
    return raw_tree(section.default(), section.follows, section.absent, interpolate=False)


@pytest.mark.parametrize("section", PPO_TRAINER_SECTIONS, ids=lambda s: s.path)
def test_defaults_equal_the_yaml_key_for_key(section: Section):
    yaml_node = node_at(default_config("ppo_trainer"), section.path)
    assert differences(defaults_of(section), yaml_node, section.path, section.cls.__name__) == []


def test_the_whole_file_is_declared():
    """Every top-level key of the yaml, sections and scalars, is a field of PPOTrainerConfig."""
    declared = raw_tree(PPOTrainerConfig(), interpolate=False)
    assert differences(declared, default_config("ppo_trainer"), "", "PPOTrainerConfig") == []
    assert {s.path for s in PPO_TRAINER_SECTIONS} >= {k for k, v in declared.items() if isinstance(v, dict)}


def test_interpolations_resolve_to_the_declared_defaults():
    """A key that follows another (${...}) resolves, in the declared tree, to the default it declares."""
    resolved = OmegaConf.to_container(OmegaConf.create(raw_tree(PPOTrainerConfig())), resolve=True)
    assert differences(raw_tree(PPOTrainerConfig(), interpolate=False), resolved, "", "PPOTrainerConfig") == []


def test_the_check_names_a_default_that_drifted():
    """Not vacuous: a changed value, a new yaml key and a missing one are each reported by key."""
    section = next(s for s in PPO_TRAINER_SECTIONS if s.path == "algorithm")
    node = copy.deepcopy(node_at(default_config("ppo_trainer"), section.path))
    node["kl_ctrl"]["kl_coef"] = 0.5
    node["brand_new_key"] = 1
    del node["gamma"]
    found = "\n".join(differences(defaults_of(section), node, section.path, "AlgoConfig"))
    assert "algorithm.kl_ctrl.kl_coef: default 0.001" in found
    assert "algorithm.brand_new_key: a yaml key that AlgoConfig does not declare" in found
    assert "algorithm.gamma: declared by AlgoConfig" in found
    assert differences(
        defaults_of(section),
        {**node_at(default_config("ppo_trainer"), "algorithm"), "use_kl_in_reward": 0},
        "algorithm",
    )  # 0 is not False


def test_an_interpolation_to_another_value_is_caught():
    """Not vacuous: a declared default that its interpolation does not resolve to is reported."""
    cfg = PPOTrainerConfig()
    object.__setattr__(cfg.actor_rollout_ref.actor, "rollout_n", 4)  # follows rollout.n, which is 1
    resolved = OmegaConf.to_container(OmegaConf.create(raw_tree(cfg)), resolve=True)
    found = differences(raw_tree(cfg, interpolate=False), resolved, "", "PPOTrainerConfig")
    assert found == [".actor_rollout_ref.actor.rollout_n: default 4 in PPOTrainerConfig, 1 in the yaml"]


@pytest.fixture(scope="module")
def loaded():
    return load_config("ppo_trainer", [])


@pytest.mark.parametrize("section", PPO_TRAINER_SECTIONS, ids=lambda s: s.path)
def test_the_yaml_reads_into_the_defaults(section: Section, loaded):
    """The yaml's section, converted, is the place's default instance; a loaded config (legacy
    spellings mirrored, interpolations resolved) converts too."""
    built = omega_conf_to_dataclass(node_at(default_config("ppo_trainer"), section.path), section.cls)
    assert type(built) is section.cls
    assert to_dict(built) == to_dict(section.default())
    assert type(omega_conf_to_dataclass(node_at(loaded, section.path), section.cls)) is section.cls


def test_every_key_has_a_one_line_doc():
    missing = [
        f"{cls.__name__}.{f.name}"
        for cls in CONFIG_CLASSES.values()
        for f in dataclasses.fields(cls)
        if not f.metadata.get("doc") or "\n" in f.metadata["doc"]
    ]
    assert missing == []


# --------------------------------------------------------------------------- sft_trainer.yaml


def test_the_whole_sft_file_is_declared():
    """Every key of sft_trainer.yaml, resolved, is a field of SFTTrainerConfig with that default."""
    declared = raw_tree(SFTTrainerConfig(), interpolate=False)
    assert differences(declared, default_config("sft_trainer"), "", "SFTTrainerConfig") == []


def test_the_sft_check_names_a_default_that_drifted():
    """Not vacuous: a yaml whose values or keys differ from the declaration is reported by key."""
    node = copy.deepcopy(default_config("sft_trainer"))
    node["optim"]["lr"] = 1e-3  # veRL's default, not hybridflow's
    node["profiler"]["tool_config"]["nsys"]["discrete"] = False  # null in veRL's profiler.yaml
    del node["trainer"]["checkpoint"]["load_contents"]
    found = "\n".join(differences(raw_tree(SFTTrainerConfig(), interpolate=False), node, "", "SFTTrainerConfig"))
    assert ".optim.lr: default 1e-05 in SFTTrainerConfig, 0.001 in the yaml" in found
    assert ".profiler.tool_config.nsys.discrete: default None in SFTTrainerConfig, False in the yaml" in found
    assert ".trainer.checkpoint.load_contents: declared by SFTTrainerConfig" in found


def test_the_sft_yaml_reads_into_the_defaults():
    """The yaml converts into the declared default instance; a loaded config (earlier spellings mirrored
    onto the canonical keys) converts too, into the SFT classes where veRL names its generic ones."""
    built = omega_conf_to_dataclass(default_config("sft_trainer"), SFTTrainerConfig)
    assert to_dict(built) == to_dict(SFTTrainerConfig())
    overrides = ["optim.lr_scheduler=wsd", "model.partial_pretrain=/m"]
    loaded = omega_conf_to_dataclass(load_config("sft_trainer", overrides), SFTTrainerConfig)
    assert type(loaded.optim).__name__ == "SFTOptimizerConfig"
    assert loaded.optim._target_.endswith(".FSDPOptimizerConfig")  # veRL's class named, the SFT one built
    assert loaded.optim.lr_scheduler_type == "wsd" and loaded.model.path == "/m"
    assert loaded.checkpoint.save_contents == loaded.checkpoint.load_contents == ["model", "optimizer", "extra"]
