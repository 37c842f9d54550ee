"""veRL's config tree, generated: ``hybridflow/trainer/config/**.yaml`` from configs/ppo_trainer.yaml.

    python -m devtools.config_tree            # rewrite the tree
    python -m devtools.config_tree --check    # exit 1 when a file is stale

veRL example configs extend ``ppo_trainer`` through Hydra's search path (``hydra.searchpath:
[file://verl/trainer/config]``) and may pick or override its component groups (``actor/dp_actor.yaml``,
``ref/dp_ref.yaml``, ``rollout/rollout.yaml``, ...). This module writes the same files, with veRL 0.9.1's
names and ``defaults:`` lists, so that such a config composes with ``file://hybridflow/trainer/config``
(or ``pkg://hybridflow.trainer.config``). configs/ppo_trainer.yaml stays the one source: each file holds
the keys of its part of that tree, a file that includes others holds only what differs from them, and
the root holds the rest. ``build`` simulates Hydra's composition and refuses a tree that would not
compose back to configs/ppo_trainer.yaml; tests/devtools/test_config_tree.py composes it with Hydra.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from hybridflow.config import ActorConfig, CriticConfig
from hybridflow.config.loader import raw_default_config

__all__ = ["Part", "PARTS", "TREE_DIR", "build", "render", "main"]

TREE_DIR = Path(__file__).resolve().parents[1] / "hybridflow" / "trainer" / "config"
HEADER = "# Generated from configs/ppo_trainer.yaml by `python -m devtools.config_tree`; do not edit.\n"


def _keys(cls: type, *without: str) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls) if f.name not in without)


@dataclass(frozen=True)
class Part:
    """One yaml file of the tree. ``source``: the path of configs/ppo_trainer.yaml its body is read from.
    ``keys``: the keys of that subtree the file holds (None: all of them). A file with ``defaults``
    holds ``keys``, then whatever its subtree has that its defaults do not produce, less ``exclude``
    (subtrees another file mounts). ``target``: a class whose own ``_target_`` the file states (veRL's
    base files name the base class; the engine's file overrides it)."""

    file: str
    source: str
    defaults: tuple = ()
    keys: tuple[str, ...] | None = None
    exclude: tuple[str, ...] = ()
    target: type | None = None
    package: str | None = None  # a `# @package` header


# veRL 0.9.1's layout for the FSDP engine (model_engine: dp); Megatron's and the other engines' files
# are not written (their configs are refused by name)
PARTS: tuple[Part, ...] = (
    Part(
        "ppo_trainer.yaml",
        "",
        defaults=(
            {"model_engine": "dp"},
            {"actor@actor_rollout_ref.actor": "${model_engine}_actor"},
            {"data@data": "legacy_data"},
            {"ref@actor_rollout_ref.ref": "${model_engine}_ref"},
            {"rollout@actor_rollout_ref.rollout": "rollout"},
            {"model@actor_rollout_ref.model": "hf_model"},
            {"critic@critic": "${model_engine}_critic"},
            {"model@critic.model": "hf_model"},
            "legacy_reward_impl",
            {"reward@reward": "reward"},
            {"algorithm@algorithm.rollout_correction": "rollout_correction"},
            {"distillation@distillation": "distillation"},
            {"transfer_queue@transfer_queue": "transfer_queue"},
        ),
    ),
    Part("model_engine/dp.yaml", "", keys=("model_engine",), package="_global_"),
    Part(
        "actor/dp_actor.yaml",
        "actor_rollout_ref.actor",
        defaults=({"../optim@optim": "fsdp"}, {"../engine@fsdp_config": "fsdp"}, "actor"),
    ),
    Part("actor/actor.yaml", "actor_rollout_ref.actor", keys=_keys(ActorConfig, "optim"), target=ActorConfig),
    Part("ref/dp_ref.yaml", "actor_rollout_ref.ref", defaults=("ref", {"../engine@fsdp_config": "fsdp"})),
    Part(
        "ref/ref.yaml",
        "actor_rollout_ref.ref",
        keys=(
            "rollout_n",
            "strategy",
            "use_torch_compile",
            "log_prob_micro_batch_size",
            "log_prob_micro_batch_size_per_gpu",
            "log_prob_use_dynamic_bsz",
            "log_prob_max_token_len_per_gpu",
            "profiler",
        ),
    ),
    Part(
        "critic/dp_critic.yaml",
        "critic",
        defaults=({"../optim@optim": "fsdp"}, {"../engine@fsdp": "fsdp"}, "critic"),
        exclude=("model",),
    ),
    Part("critic/critic.yaml", "critic", keys=_keys(CriticConfig, "optim", "model"), target=CriticConfig),
    Part("optim/fsdp.yaml", "actor_rollout_ref.actor.optim"),
    Part("engine/fsdp.yaml", "critic.fsdp"),  # the copy without the actor's interpolations
    Part("model/hf_model.yaml", "actor_rollout_ref.model"),
    Part("rollout/rollout.yaml", "actor_rollout_ref.rollout"),
    Part("data/legacy_data.yaml", "data"),
    Part("legacy_reward_impl.yaml", "", keys=("custom_reward_function", "reward_model", "sandbox_fusion")),
    Part("reward/reward.yaml", "reward"),
    Part("algorithm/rollout_correction.yaml", "algorithm.rollout_correction"),
    Part("distillation/distillation.yaml", "distillation"),
    Part("transfer_queue/transfer_queue.yaml", "transfer_queue"),
)
_BY_FILE = {p.file: p for p in PARTS}


class TreeError(ValueError):
    """The parts cannot compose back to configs/ppo_trainer.yaml."""


def _at(tree: dict, path: str) -> Any:
    for part in filter(None, path.split(".")):
        tree = tree[part]
    return tree


def _merge(base: dict, top: dict) -> dict:
    """OmegaConf's merge of plain trees: mappings merge key by key, anything else replaces."""
    for key, value in top.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            _merge(base[key], value)
        else:
            base[key] = copy.deepcopy(value)
    return base


def _mount(tree: dict, rel: str, value: dict) -> None:
    """Merge ``value`` at the relative dotted path ``rel`` of ``tree`` (the root for '')."""
    node = tree
    for part in filter(None, rel.split(".")):
        node = node.setdefault(part, {})
    _merge(node, value)


def _diff(want: dict, have: dict, missing: bool) -> dict:
    """What must be written over ``have`` to get ``want``: changed values, and (``missing``) keys
    ``have`` lacks. A key ``have`` has and ``want`` lacks cannot be removed by a merge: an error."""
    out = {}
    for key in have:
        if key not in want:
            raise TreeError(f"a part produces {key!r}, which configs/ppo_trainer.yaml does not have there")
    for key, value in want.items():
        if key not in have:
            if missing:
                out[key] = copy.deepcopy(value)
        elif isinstance(value, dict) and isinstance(have[key], dict):
            sub = _diff(value, have[key], missing=True)
            if sub or (not value and have[key]):
                out[key] = sub
        elif value != have[key] or type(value) is not type(have[key]):
            out[key] = copy.deepcopy(value)
    return out


def _child(part: Part, entry: Any) -> tuple[Part, str]:
    """The part a defaults entry of ``part`` names, and where it lands relative to ``part``'s subtree."""
    group_dir = part.file.rsplit("/", 1)[0] if "/" in part.file else ""
    if isinstance(entry, str):  # a config of the same group (or of the root)
        return _BY_FILE[f"{group_dir}/{entry}.yaml" if group_dir else f"{entry}.yaml"], ""
    ((spec, choice),) = entry.items()
    group, _, package = spec.partition("@")
    group = group.removeprefix("../")
    choice = choice.replace("${model_engine}", "dp")
    child = _BY_FILE[f"{group}/{choice}.yaml"]
    if child.package == "_global_":
        return child, ""
    return child, package or group


def build(tree: dict | None = None) -> dict[str, dict]:
    """Every file's body (without its defaults list), checked to compose back to ``tree`` (configs/
    ppo_trainer.yaml's raw defaults unless given)."""
    tree = copy.deepcopy(raw_default_config("ppo_trainer") if tree is None else tree)
    bodies: dict[str, dict] = {}

    def produced(part: Part) -> dict:
        """The subtree ``part`` contributes where it is mounted (its defaults, then its body)."""
        out: dict = {}
        for entry in part.defaults:
            child, rel = _child(part, entry)
            _mount(out, rel, produced(child))
        return _merge(out, body(part, out))

    def body(part: Part, from_defaults: dict) -> dict:
        if part.file in bodies:
            return bodies[part.file]
        source = _at(tree, part.source)
        if part.keys is not None and set(part.keys) - set(source):
            raise TreeError(
                f"{part.file}: {sorted(set(part.keys) - set(source))} are not keys of {part.source or 'the root'}"
            )
        selected = part.keys if part.keys is not None else ([] if part.defaults else list(source))
        own = {k: copy.deepcopy(source[k]) for k in selected}
        if part.target is not None:
            own["_target_"] = next(f.default for f in dataclasses.fields(part.target) if f.name == "_target_")
        if part.defaults:
            want = {k: v for k, v in source.items() if k not in part.exclude}
            own = _merge(own, _diff(want, _merge(copy.deepcopy(from_defaults), own), missing=True))
        bodies[part.file] = own
        return own

    composed = produced(_BY_FILE["ppo_trainer.yaml"])
    if composed != tree:
        raise TreeError(
            f"the parts do not compose back to configs/ppo_trainer.yaml: {sorted(_diff(tree, composed, missing=True))}"
        )
    unused = set(_BY_FILE) - set(bodies)
    if unused:
        raise TreeError(f"parts no defaults list includes: {sorted(unused)}")
    return bodies


def render(bodies: dict[str, dict] | None = None) -> dict[str, str]:
    """File name -> yaml text."""
    bodies = build() if bodies is None else bodies
    out = {}
    for part in PARTS:
        head = (f"# @package {part.package}\n" if part.package else "") + HEADER
        doc: dict = {}
        if part.defaults:
            doc["defaults"] = [*part.defaults, "_self_"]
        doc.update(bodies[part.file])
        out[part.file] = head + yaml.safe_dump(doc, sort_keys=False, default_flow_style=False, width=120)
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when a file differs from what would be written")
    parser.add_argument("--out", type=Path, default=TREE_DIR)
    args = parser.parse_args(argv)
    files = render()
    stale = [
        name for name, text in files.items() if not (args.out / name).is_file() or (args.out / name).read_text() != text
    ]
    if args.check:
        if stale:
            sys.stderr.write(f"stale in {args.out}: {', '.join(stale)}; run python -m devtools.config_tree\n")
            return 1
        return 0
    for name in stale:
        (args.out / name).parent.mkdir(parents=True, exist_ok=True)
        (args.out / name).write_text(files[name])
    sys.stdout.write(f"{args.out}: {len(stale)} of {len(files)} files written\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
