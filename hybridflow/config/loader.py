"""Load hybridflow's Hydra configs from veRL-style command lines (``key=val``, ``+key=val``, ``~key``,
``++key=val``, ``key=[a,b]``), checked before composing: an unknown key fails at once naming the closest
valid keys, a value of the wrong type names the key, the expected type and the value. Hydra's compose API
is used (no ``hydra.main``: the working directory and logging stay untouched); the result is resolved,
read-only and struct."""

from __future__ import annotations

import copy
import functools
import importlib.resources
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override, OverrideType
from hydra.errors import HydraException
from omegaconf import DictConfig, ListConfig, OmegaConf, open_dict
from omegaconf.errors import OmegaConfBaseException

from hybridflow.config.convert import omega_conf_to_dataclass  # veRL's verl.utils.config API
from hybridflow.config.errors import ConfigError
from hybridflow.config.key_suggestions import suggest_keys
from hybridflow.config.keys import KINDS, TABLES
from hybridflow.config.support import SupportError, apply_aliases, check_support, mirror_aliases
from hybridflow.config.tree import SCALAR_KINDS

__all__ = [
    "ConfigError",
    "config_dir",
    "available_configs",
    "default_config",
    "raw_default_config",
    "check_overrides",
    "suggest_keys",
    "load_config",
    "parse_cli",
    "main_entry",
    "omega_conf_to_dataclass",
]

logger = logging.getLogger(__name__)


_PACKAGE = "hybridflow.configs"


# --------------------------------------------------------------------------- locating the yaml files


def config_dir() -> Path:
    """The directory holding the yaml files: ``configs/`` at the top of the source checkout this
    module was imported from (an editable install, a worktree or a checkout on PYTHONPATH reads its
    own yaml), else the installed package data ``hybridflow.configs`` (setup.py ships ``configs/``
    there for a plain install)."""
    source_tree = Path(__file__).resolve().parents[2] / "configs"
    if (source_tree / "ppo_trainer.yaml").is_file():
        return source_tree
    try:
        candidate = importlib.resources.files(_PACKAGE).joinpath("ppo_trainer.yaml")
        if isinstance(candidate, Path) and candidate.is_file():
            return candidate.parent
    except (ModuleNotFoundError, TypeError, ValueError):
        pass
    raise ConfigError(f"cannot find hybridflow's yaml configs (neither {source_tree} nor package data {_PACKAGE})")


def available_configs(directory: str | os.PathLike | None = None) -> list[str]:
    """Names (without .yaml) of the configs that ``load_config`` can load."""
    return sorted(p.stem for p in Path(directory or config_dir()).glob("*.yaml"))


# veRL's config groups in a config's defaults list: {config: {group: the option hybridflow's yaml holds}}. A
# command line that picks that option (every veRL 0.9 SFT example writes engine=fsdp) changes nothing; another
# option is refused by name.
CONFIG_GROUPS = {
    "sft_trainer": {"engine": "fsdp", "optim": "fsdp", "model": "hf_model", "profiler": "profiler"},
    # ppo_trainer's role configs (``actor@actor_rollout_ref.actor=dp_actor``; megatron_actor, ... are other engines')
    "ppo_trainer": {"actor": "dp_actor", "ref": "dp_ref", "critic": "dp_critic"},
}
# training engines of veRL that hybridflow does not have (its own: FSDP2/DDP), by the names veRL's configs use
_OTHER_ENGINES = {
    "megatron": "Megatron",
    "mlite": "Megatron-Lite",
    "veomni": "VeOmni",
    "automodel": "AutoModel",
    "torchtitan": "TorchTitan",
}

# veRL configs hybridflow does not ship: the answer when a command line or a defaults list names one.
VERL_ONLY_CONFIGS = {
    **{
        f"ppo_{name}_trainer": f"{engine} is not a hybridflow training engine (FSDP2/DDP only); use ppo_trainer"
        for name, engine in _OTHER_ENGINES.items()
        if name in ("megatron", "torchtitan", "veomni")  # veRL 0.9.1's ppo_<engine>_trainer configs
    },
    "sft_trainer_engine": "hybridflow's SFT config is sft_trainer (it holds veRL 0.9.1's sft_trainer_engine keys)",
}


def _choose_config_groups(overrides: Sequence[str], name: str) -> list[str]:
    """``overrides`` without the group choices of config ``name`` that its yaml already holds; ConfigError for
    a choice of another option (``engine=megatron``)."""
    groups = CONFIG_GROUPS.get(name)
    if not groups:
        return list(overrides)
    try:
        parsed = OverridesParser.create().parse_overrides(list(overrides))
    except HydraException:
        return list(overrides)  # check_overrides reports it
    kept, errors = [], []
    for override in parsed:
        group = override.key_or_group
        if group not in groups or override.type != OverrideType.CHANGE or not isinstance(override.value(), str):
            kept.append(override.input_line)
            continue
        choice, held = override.value(), groups[group]
        if choice == held:
            continue
        engine = _OTHER_ENGINES.get(choice.split("_")[0])  # megatron, megatron_actor, ...
        why = (
            f"{engine} is not a hybridflow training engine (FSDP2/DDP only: {held})"
            if engine
            else f"hybridflow's option of this group is {held!r}"
        )
        errors.append(f"{override.input_line!r} is not supported by hybridflow: {why}")
    if errors:
        raise ConfigError("invalid overrides:\n  " + "\n  ".join(errors))
    return kept


def _refuse_verl_only(name: str) -> None:
    if name in VERL_ONLY_CONFIGS:
        raise ConfigError(f"config {name!r} (veRL's) is not supported by hybridflow: {VERL_ONLY_CONFIGS[name]}")


def _yaml_path(name: str, directory: str | os.PathLike | None) -> tuple[Path, str]:
    name = name[: -len(".yaml")] if name.endswith(".yaml") else name
    folder = Path(directory).expanduser().resolve() if directory is not None else config_dir()
    if not (folder / f"{name}.yaml").is_file():
        _refuse_verl_only(name)
        known = ", ".join(available_configs(folder)) or "(none)"
        raise ConfigError(f"no config named {name!r} in {folder}; known: {known}")
    return folder, name


# --------------------------------------------------------------------------- composing


def _compose(folder: Path, name: str, overrides: list[str]) -> DictConfig:
    """Hydra compose, leaving any GlobalHydra of the caller as it was."""
    outer = GlobalHydra.instance().hydra if GlobalHydra.instance().is_initialized() else None
    if outer is not None:
        GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(folder), version_base=None):
            return compose(config_name=name, overrides=overrides)
    except (HydraException, OmegaConfBaseException) as e:
        raise ConfigError(f"cannot compose config {name!r} with overrides {overrides}: {e}") from e
    finally:
        if outer is not None:
            GlobalHydra.instance().clear()
            GlobalHydra.instance().initialize(outer)


@functools.lru_cache(maxsize=16)
def _cached_trees(folder: str, name: str, mtime_ns: int) -> tuple[Any, Any]:
    """(resolved, unresolved) defaults of one yaml."""
    cfg = _extending_config(Path(folder), name) or _compose(Path(folder), name, [])
    try:
        return OmegaConf.to_container(cfg, resolve=True), OmegaConf.to_container(cfg, resolve=False)
    except OmegaConfBaseException as e:
        raise ConfigError(f"config {name!r} does not resolve: {e}") from e


def _extending_config(folder: Path, name: str) -> DictConfig | None:
    """A user's yaml that extends one of hybridflow's configs the veRL way (``defaults: [ppo_trainer,
    _self_]``, with a ``hydra.searchpath`` to veRL's config directory): hybridflow's config with the
    file's own keys merged on top, as Hydra would compose it. None for any other yaml."""
    path = folder / f"{name}.yaml"
    if folder == config_dir():
        return None
    try:
        body = OmegaConf.load(path)
    except (OmegaConfBaseException, OSError, ValueError) as e:
        raise ConfigError(f"cannot read config {path}: {e}") from e
    defaults = body.get("defaults") if isinstance(body, DictConfig) else None
    entries = [str(d).removesuffix(".yaml") for d in defaults] if isinstance(defaults, (list, ListConfig)) else []
    bases = [d for d in entries if d != "_self_"]
    if len(bases) != 1 or entries[-1] != "_self_" or "@" in bases[0] or ":" in bases[0]:
        return None
    _refuse_verl_only(bases[0])
    if not (config_dir() / f"{bases[0]}.yaml").is_file():
        return None
    own = OmegaConf.to_container(body, resolve=False)
    own.pop("defaults", None)
    own.pop("hydra", None)
    try:
        return OmegaConf.merge(OmegaConf.create(copy.deepcopy(raw_default_config(bases[0]))), own)
    except OmegaConfBaseException as e:
        raise ConfigError(f"cannot merge {path} onto hybridflow's {bases[0]}: {e}") from e


def _trees(folder: Path, name: str) -> tuple[Any, Any]:
    return _cached_trees(str(folder), name, (folder / f"{name}.yaml").stat().st_mtime_ns)


def default_config(name: str = "ppo_trainer", directory: str | os.PathLike | None = None) -> dict:
    """The yaml's defaults as a plain resolved dict (cached; treat as read-only)."""
    folder, name = _yaml_path(name, directory)
    return _trees(folder, name)[0]


def raw_default_config(name: str = "ppo_trainer", directory: str | os.PathLike | None = None) -> dict:
    """The yaml's defaults with interpolations left as written (cached; treat as read-only)."""
    folder, name = _yaml_path(name, directory)
    return _trees(folder, name)[1]


# --------------------------------------------------------------------------- checking overrides


def _lookup(tree: Any, key: str) -> tuple[bool, Any]:
    node = tree
    for part in key.split("."):
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return False, None
    return True, node


def _kind(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return "list"
    if isinstance(value, dict):
        return "dict"
    return SCALAR_KINDS.get(type(value), type(value).__name__)


def _value_text(override: Override) -> str:
    return override.input_line.split("=", 1)[1] if "=" in override.input_line else ""


def _check_value(override: Override, key: str, default: Any, kinds: dict | None = None) -> str | None:
    """None when the override is fine as written, a rewritten override when it is fine after a
    normalisation, ConfigError when its type contradicts the key's declared type (``kinds``, from
    the declarations: ``Union[str, list]`` allows both) or, for an undeclared key, its default's."""
    value, text, lhs = override.value(), _value_text(override), override.get_key_element()
    if text == "None":  # Python spelling of null, common in veRL scripts
        return f"{lhs}=null"
    if default is None or value is None:
        return None
    if isinstance(value, str) and "${" in value:  # an interpolation: its type is known only later
        return None
    expected, got = _kind(default), _kind(value)
    allowed = (kinds or {}).get(key, (expected,))
    if expected == "list" and got in ("str", "int", "float", "bool"):
        return f"{lhs}=[{text}]"  # trainer.logger=console means ['console'] (the default's shape wins)
    if got in allowed or (got == "int" and "float" in allowed):
        return None
    if expected == "str" and got in ("int", "float") and "'" not in text:
        return f"{lhs}='{text}'"  # experiment_name=2024 stays the string '2024'
    raise ConfigError(
        f"config key {key!r} expects {' or '.join(allowed)} (default: {default!r}), "
        f"got {got} {value!r} from {override.input_line!r}"
    )


def _under_free_form_dict(defaults: dict, key: str) -> bool:
    """True when a section above ``key`` is an empty mapping in the yaml (override_config: {}, ...)."""
    parts = key.split(".")
    for i in range(len(parts) - 1, 0, -1):
        found, node = _lookup(defaults, ".".join(parts[:i]))
        if found:
            return node == {}
    return False


def _refuse_other_engine(parsed: list) -> None:
    """veRL's ``model_engine=megatron`` (or veomni, torchtitan) brings that engine's sections
    (``actor.megatron.*``, ...): name the engine, not each of its keys as unknown."""
    for override in parsed:
        engine = override.value() if override.key_or_group == "model_engine" else None
        if isinstance(engine, str) and f"ppo_{engine}_trainer" in VERL_ONLY_CONFIGS:
            raise ConfigError(
                f"model_engine={engine!r} is not supported by hybridflow: {VERL_ONLY_CONFIGS[f'ppo_{engine}_trainer']}"
            )


def check_overrides(overrides: Sequence[str], defaults: dict, kinds: dict | None = None) -> list[str]:
    """Command-line overrides checked against the defaults tree, ready for Hydra (a scalar for a list key
    becomes a one-element list, ``None`` becomes ``null``); ConfigError names every unknown key (with the
    closest valid keys) and every value whose type contradicts its default."""
    try:
        parsed = OverridesParser.create().parse_overrides(list(overrides))
    except HydraException as e:
        raise ConfigError(f"cannot parse overrides {list(overrides)}: {e}") from e
    _refuse_other_engine(parsed)
    errors, out = [], []
    for override in parsed:
        key = override.key_or_group
        if key.startswith("hydra.") or key == "hydra":
            out.append(override.input_line)  # Hydra's own settings; dropped from the result
            continue
        if override.is_sweep_override():
            errors.append(
                f"{override.input_line!r}: sweeps (a,b) are not supported; write a list as {key}=[a,b] "
                f"or quote a string that contains a comma"
            )
            continue
        found, default = _lookup(defaults, key)
        if override.type == OverrideType.ADD and not found:
            out.append(override.input_line)
            continue
        if override.type == OverrideType.ADD:
            # veRL users add keys its tree lacks but hybridflow's has (fsdp_config.mixed_precision, ...):
            # +key for an existing key sets it, after the usual checks
            override = OverridesParser.create().parse_overrides([override.input_line[1:]])[0]
        if not found and override.type == OverrideType.FORCE_ADD:
            out.append(override.input_line)
            continue
        if not found and override.type == OverrideType.CHANGE and _under_free_form_dict(defaults, key):
            out.append("+" + override.input_line)  # e.g. engine_kwargs.vllm.swap_space=4: vllm is a free-form {}
            continue
        if not found:
            close = suggest_keys(key, defaults)
            hint = f" Did you mean: {', '.join(close)}?" if close else ""
            errors.append(f"unknown config key {key!r}.{hint} (to add a new key on purpose write +{key}=...)")
            continue
        if override.type == OverrideType.DEL:
            out.append(override.input_line)
            continue
        try:
            rewritten = _check_value(override, key, default, kinds)
        except ConfigError as e:
            errors.append(str(e))
            continue
        out.append(rewritten or override.input_line)
    if errors:
        raise ConfigError("invalid overrides:\n  " + "\n  ".join(errors))
    return out


# --------------------------------------------------------------------------- public entry points


def load_config(
    name: str = "ppo_trainer",
    overrides: Sequence[str] = (),
    config_path: str | os.PathLike | None = None,
    kind: str | None = None,
    notes: list[str] | None = None,
) -> DictConfig:
    """Compose ``<config_path or config_dir()>/<name>.yaml`` with veRL-style overrides; for a config with a
    key table (``kind``, default ``name``) map legacy spellings onto their canonical keys and check every
    key's status (``hybridflow.config.support``). Notes go to ``notes`` when given, else to the log.
    Returns a resolved, read-only, struct DictConfig; raises ConfigError for anything that cannot be right."""
    folder, name = _yaml_path(name, config_path)
    defaults, raw_defaults = _trees(folder, name)
    checked = check_overrides(_choose_config_groups(overrides, kind or name), defaults, KINDS.get(kind or name))
    cfg = _apply_overrides(raw_defaults, checked, name)
    table = _key_table(kind or name)
    found: list[str] = []
    origins: dict[str, str] = {}
    try:
        if table is not None:
            # statuses are judged against hybridflow's own yaml, also for a config file of the user's
            reference = raw_default_config(kind or name)
            raw = OmegaConf.to_container(cfg, resolve=False)
            try:
                moved = apply_aliases(table, raw, reference, explicit=_written_keys(checked), origins=origins)
            except SupportError as e:
                raise ConfigError(f"conflicting config keys:\n  {e}") from None
            _update(cfg, moved)
        OmegaConf.resolve(cfg)
        if table is not None:
            resolved = OmegaConf.to_container(cfg, resolve=False)
            try:
                found = check_support(table, raw, reference, resolved, origins)
            except SupportError as e:
                raise ConfigError(f"config keys that hybridflow does not support:\n  {e}") from None
            _update(cfg, mirror_aliases(table, resolved))
    except OmegaConfBaseException as e:
        raise ConfigError(f"config {name!r} does not resolve with overrides {list(overrides)}: {e}") from e
    if notes is not None:
        notes.extend(found)
    else:
        for line in found:
            logger.warning("[config] %s", line)
    OmegaConf.set_struct(cfg, True)
    OmegaConf.set_readonly(cfg, True)
    return cfg


def _apply_overrides(raw_defaults: dict, overrides: Sequence[str], name: str) -> DictConfig:
    """The defaults with checked overrides applied, as Hydra's compose applies them (struct: only
    ``+``/``++`` add keys). The yaml is parsed once (``_trees``); this only copies and updates it."""
    cfg = OmegaConf.create(copy.deepcopy(raw_defaults))
    OmegaConf.set_struct(cfg, True)
    try:
        for o in OverridesParser.create().parse_overrides(list(overrides)):
            key = o.key_or_group
            if key == "hydra" or key.startswith("hydra."):
                continue  # Hydra's own settings: nothing to compose here
            if o.is_delete():
                parent, _, leaf = key.rpartition(".")
                node = OmegaConf.select(cfg, parent) if parent else cfg
                with open_dict(cfg):
                    del node[leaf]
            else:
                OmegaConf.update(cfg, key, o.value(), merge=True, force_add=o.is_add() or o.is_force_add())
    except (HydraException, OmegaConfBaseException) as e:
        raise ConfigError(f"cannot compose config {name!r} with overrides {list(overrides)}: {e}") from e
    return cfg


def _update(cfg: DictConfig, values: dict[str, Any]) -> None:
    with open_dict(cfg):
        for key, value in values.items():
            OmegaConf.update(cfg, key, value, merge=False, force_add=True)


def _written_keys(overrides: Sequence[str]) -> list[str]:
    """The keys the command line sets (``key=v``, ``+key=v``, ``++key=v``; not ``~key``)."""
    parsed = OverridesParser.create().parse_overrides(list(overrides))
    return [o.key_or_group for o in parsed if o.type != OverrideType.DEL]


def _key_table(kind: str):
    return TABLES.get(kind)


_USAGE = """usage: python -m {prog} [--config-path DIR] [--config-name NAME] [--cfg job] [key=value ...]

Overrides follow veRL/Hydra syntax: key=value changes a key, +key=value adds one, ~key deletes one,
lists as key=[a,b]. --cfg job prints the composed config and exits. Known configs: {known}
"""


def parse_cli(name: str, argv: Sequence[str]) -> DictConfig:
    """Command-line front end of ``load_config``: also takes Hydra's ``--config-path``,
    ``--config-name`` (``-cp``/``-cn``), ``--cfg job`` and ``--help``. A ConfigError is printed
    and exits with status 2 instead of a traceback. ``--cfg job`` prints the composed config after
    every check (unknown keys, types, unsupported values) and exits: a dry run of the command line."""
    config_path, overrides, print_cfg = None, [], False
    kind = name  # the entry point's config: its key statuses apply whatever file --config-name picks
    args = list(argv)
    while args:
        arg = args.pop(0)
        flag, _, inline = arg.partition("=") if arg.startswith("-") else (arg, "", "")
        if flag in ("-h", "--help"):
            print(_USAGE.format(prog=Path(sys.argv[0]).stem or "hybridflow", known=", ".join(available_configs())))
            raise SystemExit(0)
        if flag in ("--config-path", "-cp", "--config-name", "-cn", "--cfg", "-c"):
            if not inline and not args:
                print(f"error: {flag} needs a value", file=sys.stderr)
                raise SystemExit(2)
            value = inline or args.pop(0)
            if flag in ("--config-path", "-cp"):
                config_path = Path(value).expanduser().resolve()
            elif flag in ("--config-name", "-cn"):
                name = value
            else:
                print_cfg = True
            continue
        if arg.startswith("--"):
            print(f"error: unknown option {arg}; overrides are written key=value", file=sys.stderr)
            raise SystemExit(2)
        overrides.append(arg)
    try:
        cfg = load_config(name, overrides, config_path=config_path, kind=kind)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    if print_cfg:
        print(OmegaConf.to_yaml(cfg))
        raise SystemExit(0)
    return cfg


def main_entry(name: str) -> DictConfig:
    """``cfg = main_entry("ppo_trainer")`` in an entry point's ``if __name__ == "__main__":``."""
    return parse_cli(name, sys.argv[1:])
