"""``omega_conf_to_dataclass``: a config section (DictConfig or dict) read into its dataclass, with
veRL's signature and behaviour, checking every key and value (an unknown key or a wrong type names the key
path and, for a typo, the closest keys; an int is a valid float and a number a valid string, as in
OmegaConf). The class comes from ``dataclass_type`` or the section's ``_target_``: under ``verl.`` or
``hybridflow.`` one of hybridflow's classes by its class name (Megatron's and other engines' are refused),
else an imported dotted path. Nested sections start from the field's default instance, so a partial
section keeps its per-place defaults."""

from __future__ import annotations

import dataclasses
import difflib
import functools
import importlib
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any, Union

from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import InterpolationKeyError, MissingMandatoryValue

from hybridflow.config import (
    actor,
    algorithm,
    checkpoint,
    critic,
    data,
    distillation,
    engine,
    evaluation,
    generation,
    legacy,
    model,
    module,
    optimizer,
    ppo_trainer,
    profiler,
    ray,
    reward,
    rollout,
    rollout_correction,
    sft_trainer,
    skip,
    trainer,
    transfer_queue,
)
from hybridflow.config.base import BaseConfig, part_of_tree
from hybridflow.config.errors import ConfigError
from hybridflow.config.refused import REFUSED_CLASSES, refusal

__all__ = [
    "CONFIG_CLASSES",
    "resolve_target",
    "omega_conf_to_dataclass",
    "as_section",
    "as_dictconfig",
    "read_yaml_file",
]

_MODULES = (
    algorithm,
    rollout_correction,
    optimizer,
    engine,
    profiler,
    checkpoint,
    model,
    actor,
    critic,
    rollout,
    module,
    data,
    trainer,
    reward,
    distillation,
    ray,
    skip,
    transfer_queue,
    legacy,
    ppo_trainer,
    evaluation,
    generation,
    sft_trainer,
)
# hybridflow's config classes by name: what a verl./hybridflow. _target_ resolves to
CONFIG_CLASSES: dict[str, type] = {
    "BaseConfig": BaseConfig,
    **{
        name: obj
        for module in _MODULES
        for name in module.__all__
        if isinstance(obj := getattr(module, name), type) and issubclass(obj, BaseConfig)
    },
}

_MISSING = object()


def resolve_target(target: str, where: str = "_target_") -> type:
    """The dataclass a ``_target_`` names; ConfigError (naming ``where``) when there is none."""
    if not isinstance(target, str) or not target.strip():
        raise ConfigError(f"{where} must be a dotted class path, got {target!r}")
    name = target.rsplit(".", 1)[-1]
    if name in REFUSED_CLASSES:
        raise refusal(name)
    if target.startswith(("verl.", "hybridflow.")):
        if name in CONFIG_CLASSES:
            return CONFIG_CLASSES[name]
        close = difflib.get_close_matches(name, CONFIG_CLASSES, n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else f"; known: {', '.join(sorted(CONFIG_CLASSES))}"
        raise ConfigError(f"{where}={target!r}: hybridflow has no config class {name!r}{hint}")
    module_name, _, attr = target.rpartition(".")
    try:
        obj = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError, ValueError) as e:
        raise ConfigError(f"{where}={target!r} cannot be imported: {e}") from e
    if not (isinstance(obj, type) and dataclasses.is_dataclass(obj)):
        raise ConfigError(f"{where}={target!r} is not a dataclass")
    return obj


def omega_conf_to_dataclass(
    config: DictConfig | dict | Any, dataclass_type: type | None = None, *, path: str | None = None
) -> Any:
    """``config`` (a DictConfig or dict; interpolations resolved) as an instance of ``dataclass_type``,
    or of the class its ``_target_`` names. An empty config gives ``dataclass_type()`` (None without a
    type); anything that is not a mapping (an already built config object) is returned as it is.
    ``path``: where the section sits, for messages (a DictConfig node knows it; a plain dict does not)."""
    if not config:
        if dataclass_type is None:
            return None
        with part_of_tree():
            return _checked(dataclass_type())
    if not isinstance(config, (DictConfig, ListConfig, dict, list)):
        return config
    data = _plain(config)
    where = path if path is not None else _full_key(config)
    if dataclass_type is None:
        if not isinstance(data, Mapping) or "_target_" not in data:
            raise ConfigError(
                f"{where or 'the config'} has no _target_: pass the dataclass type "
                f"(omega_conf_to_dataclass(cfg, FSDPActorConfig)) or add _target_"
            )
        dataclass_type = resolve_target(data["_target_"], f"{where}._target_" if where else "_target_")
    if not dataclasses.is_dataclass(dataclass_type):
        raise ConfigError(f"{dataclass_type} must be a dataclass")
    with part_of_tree():  # rules that need the whole run wait for its validation (see part_of_tree)
        return _build(dataclass_type, data, where, None)


def _checked(obj: Any) -> Any:
    """``obj`` after the checks veRL makes when it uses the section (``BaseConfig.check_values``)."""
    if isinstance(obj, BaseConfig):
        obj.check_values()
    return obj


def as_section(value: Any, cls: type, path: str | None = None, placed: Callable[[], Any] | None = None) -> Any:
    """A door of veRL's surface that takes a DictConfig: ``value`` (a ``cls``, a DictConfig, a dict or
    nothing) as ``cls``, so the code behind the door reads attributes only (and imports no omegaconf).
    ``placed``: the section as the yaml holds it at this place (``rollout_as_in_yaml``); the keys
    ``value`` leaves out come from it, as they would from the yaml, not from the dataclass defaults."""
    if isinstance(value, cls) or placed is None:
        return value if isinstance(value, cls) else omega_conf_to_dataclass(value or None, cls, path=path)
    with part_of_tree():
        return _build(cls, _plain(value or {}), path or "", placed())


def as_dictconfig(tree: dict) -> Any:
    """A plain tree (``to_dict`` of a config) as the OmegaConf ``DictConfig`` that user code written for veRL
    reads (a veRL reward-loop manager's ``config.reward.reward_kwargs``); omegaconf stays in config/."""
    return OmegaConf.create(tree)


def read_yaml_file(path: str) -> Any:
    """A user's yaml file (tool, interaction, agent-loop configs) as plain data, read as veRL reads it
    (OmegaConf: interpolations resolved)."""
    return OmegaConf.to_container(OmegaConf.load(path), resolve=True)


def _plain(value: Any) -> Any:
    """``value`` with the OmegaConf nodes in it, at any depth, as plain dicts and lists (resolved): a dict
    made by ``dict(cfg.section)`` still holds DictConfig / ListConfig values. A component of veRL's config
    tree composed on its own (``actor/dp_actor.yaml``) follows keys of the whole tree that it does not
    hold; those keys take their defaults at this place (veRL writes them as ``${oc.select:key,default}``)."""
    if isinstance(value, (DictConfig, ListConfig)):
        if value._get_root() is value:
            return _resolved_alone(value)
        return OmegaConf.to_container(value, resolve=True)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def _resolved_alone(node: Any) -> Any:
    """A config composed on its own as plain containers: an interpolation of a key it does not hold is
    left out (the field's default applies)."""
    if isinstance(node, DictConfig):
        out = {}
        for key in node.keys():
            try:
                out[key] = _resolved_alone(node[key])
            except InterpolationKeyError:
                continue
            except MissingMandatoryValue:
                out[key] = "???"
        return out
    if isinstance(node, ListConfig):
        return [_resolved_alone(node[i]) for i in range(len(node))]
    return node


def _full_key(config: Any) -> str:
    """The node's dotted path in its whole config, for messages ('' for a root or a plain dict)."""
    try:
        return config._get_full_key(None) if isinstance(config, DictConfig) else ""
    except Exception:  # an OmegaConf internal; messages fall back to relative paths
        return ""


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _build(cls: type, data: Any, path: str, base: Any) -> Any:
    """An instance of ``cls`` from mapping ``data``; missing keys come from ``base`` (a default instance
    with per-place defaults) or the class defaults."""
    if isinstance(data, cls):
        return data
    if not isinstance(data, Mapping):
        raise ConfigError(f"{path or cls.__name__} must be a mapping of {cls.__name__}'s keys, got {data!r}")
    if "_target_" in data and data["_target_"]:
        target = resolve_target(data["_target_"], _join(path, "_target_"))
        if target is not cls and issubclass(target, cls):
            cls, base = target, None
    known = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = [k for k in data if k not in known]
    if unknown:
        key = unknown[0]
        close = difflib.get_close_matches(str(key), known, n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else f"; its keys: {', '.join(known)}"
        raise ConfigError(f"{_join(path, str(key))} is not a key of {cls.__name__}{hint}")
    hints = _hints(cls)
    kwargs = {}
    for name, f in known.items():
        default = getattr(base, name, _MISSING) if base is not None else _MISSING
        if default is _MISSING and f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        if name in data:
            kwargs[name] = _convert(hints[name], data[name], _join(path, name), default)
        elif default is not _MISSING:
            kwargs[name] = default
    try:
        return _checked(cls(**kwargs))
    except ConfigError:
        raise
    except (TypeError, ValueError, AssertionError) as e:
        raise ConfigError(f"{path or cls.__name__}: {e}") from e


def _convert(tp: Any, value: Any, path: str, default: Any = _MISSING) -> Any:
    """``value`` checked (and where OmegaConf would, converted) against type ``tp``."""
    if tp is Any:
        return value
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        choices = [a for a in args if a is not type(None)]
        if len(choices) == 1:  # Optional[X]: X's own, precise error
            return _convert(choices[0], value, path, default)
        for arg in choices:
            try:
                return _convert(arg, value, path, default)
            except ConfigError:
                continue
        raise ConfigError(f"{path}: {value!r} is none of {_name(tp)}")
    if value is None:
        raise ConfigError(f"{path} must not be null (expected {_name(tp)})")
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        base = default if isinstance(default, tp) else None
        return _build(tp, value, path, base)
    if origin in (list, tuple) or tp in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{path} must be a list, got {value!r}")
        item = args[0] if args else Any
        items = [_convert(item, v, f"{path}[{i}]") for i, v in enumerate(value)]
        return tuple(items) if tuple in (origin, tp) else items
    if origin is dict or tp is dict:
        if not isinstance(value, Mapping):
            raise ConfigError(f"{path} must be a mapping, got {value!r}")
        item = args[1] if len(args) == 2 else Any
        return {k: _convert(item, v, _join(path, str(k))) for k, v in value.items()}
    return _scalar(tp, value, path)


_KINDS = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}


def _scalar(tp: type, value: Any, path: str) -> Any:
    if tp is bool:
        if isinstance(value, bool):
            return value
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str) and "_" not in value:  # not Python's 1_000 (nor IcePop's '0.5_5.0')
            try:
                return float(value)  # YAML 1.1 reads 1e-6 as a string; OmegaConf accepts it as a float
            except ValueError:
                pass
    elif tp is str:
        if isinstance(value, str):
            return value
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return str(value)
    elif isinstance(value, tp):
        return value
    raise ConfigError(f"{path} must be {_KINDS.get(tp, _name(tp))}, got {type(value).__name__} {value!r}")


def _name(tp: Any) -> str:
    if typing.get_origin(tp) in (Union, types.UnionType):
        return " or ".join(_name(a) for a in typing.get_args(tp) if a is not type(None)) + (
            " or null" if type(None) in typing.get_args(tp) else ""
        )
    return getattr(tp, "__name__", str(tp))
