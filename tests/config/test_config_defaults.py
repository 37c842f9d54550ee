"""The section classes of hybridflow.config and configs/ppo_trainer.yaml say the same thing: at every
place of ``PPO_TRAINER_SECTIONS`` each field's default equals the yaml's (resolved) value, and each yaml
key is a field. Change a default on one side only and these tests name the key."""

from __future__ import annotations

import copy
import dataclasses

import pytest

from hybridflow.config import CONFIG_CLASSES, omega_conf_to_dataclass, to_dict
from hybridflow.config.base import is_undeclared
from hybridflow.config.loader import default_config, load_config
from hybridflow.config.sections import PPO_TRAINER_SECTIONS, Section


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


def differences(obj, node: dict, path: str, absent: tuple[str, ...] = (), rel: str = "") -> list[str]:
    """Every way the defaults of ``obj`` and the yaml ``node`` at ``path`` disagree."""
    out = []
    names = set()
    for f in dataclasses.fields(obj):
        key_rel = f"{rel}.{f.name}" if rel else f.name
        key = f"{path}.{f.name}"
        value = getattr(obj, f.name)
        if key_rel in absent:
            if f.name in node:
                out.append(f"{key}: listed as absent but the yaml has it")
            continue
        if f.name == "_target_" and value == "" and "_target_" not in node:
            continue  # a section veRL reads without a _target_
        names.add(f.name)
        if f.name not in node:
            out.append(f"{key}: a field of {type(obj).__name__} (default {value!r}) that the yaml lacks")
        elif is_undeclared(f):
            if not isinstance(node[f.name], dict):
                out.append(f"{key}: declared as a free-form mapping, the yaml holds {node[f.name]!r}")
        elif dataclasses.is_dataclass(value):
            if not isinstance(node[f.name], dict):
                out.append(f"{key}: a section in the class, {node[f.name]!r} in the yaml")
            else:
                out += differences(value, node[f.name], key, absent, key_rel)
        elif not same(value, node[f.name]):
            out.append(f"{key}: default {value!r} in {type(obj).__name__}, {node[f.name]!r} in the yaml")
    out += [f"{path}.{k}: a yaml key that {type(obj).__name__} does not declare" for k in node if k not in names
            and f"{rel}.{k}".lstrip(".") not in absent]
    return out


@pytest.mark.parametrize("section", PPO_TRAINER_SECTIONS, ids=lambda s: s.path)
def test_defaults_equal_the_yaml_key_for_key(section: Section):
    yaml_node = node_at(default_config("ppo_trainer"), section.path)
    assert differences(section.cls(), yaml_node, section.path, section.absent) == []


def test_the_check_names_a_default_that_drifted():
    """Not vacuous: a changed value, a new yaml key and a missing one are each reported by key."""
    section = PPO_TRAINER_SECTIONS[0]
    node = copy.deepcopy(node_at(default_config("ppo_trainer"), section.path))
    node["kl_ctrl"]["kl_coef"] = 0.5
    node["brand_new_key"] = 1
    del node["gamma"]
    found = "\n".join(differences(section.cls(), node, section.path))
    assert "algorithm.kl_ctrl.kl_coef: default 0.001" in found
    assert "algorithm.brand_new_key: a yaml key that AlgoConfig does not declare" in found
    assert "algorithm.gamma: a field of AlgoConfig" in found
    assert differences(section.cls(), {**node_at(default_config("ppo_trainer"), "algorithm"),
                                       "use_kl_in_reward": 0}, "algorithm")  # 0 is not False


def strip_undeclared(obj) -> dict:
    tree = to_dict(obj)

    def walk(o, t):
        for f in dataclasses.fields(o):
            if is_undeclared(f):
                t.pop(f.name)
            elif dataclasses.is_dataclass(getattr(o, f.name)):
                walk(getattr(o, f.name), t[f.name])
        return t
    return walk(obj, tree)


@pytest.fixture(scope="module")
def loaded():
    return load_config("ppo_trainer", [])


@pytest.mark.parametrize("section", PPO_TRAINER_SECTIONS, ids=lambda s: s.path)
def test_the_yaml_reads_into_the_defaults(section: Section, loaded):
    """The yaml's section, converted, is the class's default instance; a loaded config (legacy spellings
    mirrored, interpolations resolved) converts too."""
    built = omega_conf_to_dataclass(node_at(default_config("ppo_trainer"), section.path), section.cls)
    assert type(built) is section.cls
    assert strip_undeclared(built) == strip_undeclared(section.cls())
    assert type(omega_conf_to_dataclass(node_at(loaded, section.path), section.cls)) is section.cls


def test_every_key_has_a_one_line_doc():
    missing = [f"{cls.__name__}.{f.name}" for cls in CONFIG_CLASSES.values() for f in dataclasses.fields(cls)
               if not f.metadata.get("doc") or "\n" in f.metadata["doc"]]
    assert missing == []
