"""veRL's ``BaseConfig`` and the three ways a config key is declared.

A section is a dataclass whose fields are its keys; ``BaseConfig`` makes it read like the DictConfig it
replaces (``cfg["key"]``, ``cfg.get``, iteration, ``len``) and read-only once built (only
``_mutable_fields`` may be assigned), so library code cannot change config at run time by accident.
Every field is declared with its default and a one-line doc: ``doc`` (a key), ``section`` (a nested
section, built by its class or a per-place factory such as ``placed``) or ``undeclared`` (a sub-tree kept
as a plain dict). ``follows`` records the OmegaConf interpolation the yaml writes for a key (a dict: for
keys below it), ``absent`` the nested keys the yaml does not hold at a place. The status keywords
(``refused=``, ``note=``, ``values=``/``reason=``, ``keys=`` for keys below a place) are explained in
``hybridflow.config.status``; on a section or dict-valued key a status covers everything below it.
"""

from __future__ import annotations

import collections.abc
import contextlib
import contextvars
import copy
import dataclasses
from collections.abc import Callable
from dataclasses import FrozenInstanceError, dataclass, field, fields
from typing import Any

from hybridflow.config.status import KeyStatus, status_from

__all__ = [
    "BaseConfig",
    "doc",
    "section",
    "undeclared",
    "field_doc",
    "field_follows",
    "field_absent",
    "field_status",
    "field_keys",
    "is_section",
    "is_undeclared",
    "to_dict",
    "placed",
    "unset",
    "part_of_tree",
    "built_alone",
]

Follows = None | str | dict
Keys = dict | None


def _meta(text: str, follows: Follows, status: KeyStatus | None = None, keys: Keys = None, **extra: Any) -> dict:
    meta = {"doc": text, **extra}
    if follows is not None:
        meta["follows"] = follows
    if status is not None:
        meta["status"] = status
    if keys:
        for key, value in keys.items():
            if not isinstance(value, KeyStatus):
                raise TypeError(f"keys={{{key!r}: ...}}: a KeyStatus (honoured/refused/noted), not {value!r}")
        meta["keys"] = dict(keys)
    return meta


def doc(
    default: Any,
    text: str,
    *,
    follows: Follows = None,
    refused: str | None = None,
    note: str | None = None,
    values: tuple | None = None,
    reason: str = "",
    keys: Keys = None,
) -> Any:
    """A key with its default, a one-line doc and its status (see the module doc). Mutable defaults
    (lists, dicts) are copied per instance."""
    meta = _meta(text, follows, status_from(refused, note, values, reason), keys)
    if isinstance(default, (list, dict, set)):
        return field(default_factory=lambda: copy.deepcopy(default), metadata=meta)
    return field(default=default, metadata=meta)


_PART_OF_TREE = contextvars.ContextVar("hybridflow_config_part_of_tree", default=False)


@contextlib.contextmanager
def part_of_tree():
    """Build sections as parts of a bigger config (a parent's default section, a converted yaml).

    veRL checks some keys when a section is built on its own (``ActorConfig(...)`` without a micro-batch
    size fails); a config tree holds such a section before the user has filled it in (the critic of a GRPO
    run is never set), so inside this block those checks wait for the tree's validation, which names the
    full keys."""
    token = _PART_OF_TREE.set(True)
    try:
        yield
    finally:
        _PART_OF_TREE.reset(token)


def built_alone() -> bool:
    """True when a section is built by a direct constructor call, outside ``part_of_tree``."""
    return not _PART_OF_TREE.get()


def _as_part_of_tree(factory: Callable[[], Any]) -> Callable[[], Any]:
    def build() -> Any:
        with part_of_tree():
            return factory()

    return build


def placed(cls: Callable[..., Any], **values: Any) -> Callable[[], Any]:
    """A ``section`` factory: ``cls`` (a config class or a factory such as ``engine_as_in_yaml``) with this
    place's defaults, copied for every instance. A config class keeps veRL's dataclass defaults (what
    ``cls()`` gives a user); where veRL's yaml holds other values at a place, the place says so here
    (``section(placed(FSDPOptimizerConfig, lr=1e-6), ...)``)."""
    return lambda: cls(**copy.deepcopy(values))


def unset() -> None:
    """A ``section`` factory: a nested section that stays unset (None) unless configured, as veRL's
    dataclass leaves it; the places whose yaml holds it build it there."""
    return None


def section(
    factory: Callable[[], Any],
    text: str,
    *,
    follows: Follows = None,
    absent: tuple[str, ...] = (),
    refused: str | None = None,
    note: str | None = None,
    reason: str = "",
    keys: Keys = None,
) -> Any:
    """A nested section built by ``factory`` (a config class, or a function returning an instance). A
    status here is that of every key below at this place, whatever the nested class declares."""
    return field(
        default_factory=_as_part_of_tree(factory),
        metadata=_meta(
            text, follows, status_from(refused, note, None, reason), keys, section=True, absent=tuple(absent)
        ),
    )


def undeclared(
    text: str, *, refused: str | None = None, note: str | None = None, reason: str = "", keys: Keys = None
) -> Any:
    """A free-form sub-tree (a plain dict): its keys are not declared one by one (yet)."""
    return field(
        default_factory=dict,
        metadata=_meta(text, None, status_from(refused, note, None, reason), keys, undeclared=True),
    )


def field_status(f: dataclasses.Field) -> KeyStatus | None:
    """The status a field declares (None: honoured, unless a place above says otherwise)."""
    return f.metadata.get("status")


def field_keys(f: dataclasses.Field) -> dict:
    """Statuses of keys below a field at this place (relative dotted keys or patterns)."""
    return f.metadata.get("keys", {})


def field_doc(cls_or_obj: Any, name: str) -> str:
    """The one-line doc of field ``name``."""
    for f in fields(cls_or_obj):
        if f.name == name:
            return f.metadata.get("doc", "")
    raise AttributeError(f"{getattr(cls_or_obj, '__name__', type(cls_or_obj).__name__)} has no config key {name!r}")


def field_follows(f: dataclasses.Field) -> Follows:
    """The interpolation(s) a field's yaml value follows (see the module doc)."""
    return f.metadata.get("follows")


def field_absent(f: dataclasses.Field) -> tuple[str, ...]:
    """Nested keys of a section field that the yaml does not hold at this place."""
    return f.metadata.get("absent", ())


def is_section(f: dataclasses.Field) -> bool:
    return bool(f.metadata.get("section"))


def is_undeclared(f: dataclasses.Field) -> bool:
    return bool(f.metadata.get("undeclared"))


@dataclass
class BaseConfig(collections.abc.Mapping):
    """A dataclass config that reads like a read-only mapping of its fields (veRL's BaseConfig)."""

    # fields that may be assigned after construction (veRL's spelling: a set, extended by subclasses)
    _mutable_fields = set()

    _target_: str = doc("", "the class this section is read into (veRL's dotted path; hybridflow resolves it)")

    def __setattr__(self, name: str, value: Any) -> None:
        if name in self.__dict__ and name not in getattr(self, "_mutable_fields", set()):
            raise FrozenInstanceError(f"Field '{name}' of {type(self).__name__} is frozen and cannot be modified")
        super().__setattr__(name, value)

    def check_values(self) -> None:
        """Checks of this section's own keys that veRL makes when it uses the section, not when it builds
        it: a constructor call accepts what veRL's accepts, and the conversion of a yaml
        (``omega_conf_to_dataclass``) runs these right after building the section."""

    def get(self, key: str, default: Any = None) -> Any:
        """``cfg.get(key, default)``: the field's value, or ``default`` for a key the class does not have."""
        try:
            return getattr(self, key)
        except AttributeError:
            return default

    def __getitem__(self, key: str) -> Any:
        """``cfg[key]``: AttributeError for an unknown key, TypeError for a key that is not a string."""
        return getattr(self, key)

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and any(f.name == key for f in fields(self))

    def __iter__(self):
        return (f.name for f in fields(self))

    def __len__(self) -> int:
        return len(fields(self))


def to_dict(obj: Any) -> Any:
    """A config (nested) as plain dicts and lists, as the yaml would hold it."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_dict(getattr(obj, f.name)) for f in fields(obj)}
    if isinstance(obj, (list, tuple)):
        return [to_dict(v) for v in obj]
    if isinstance(obj, dict):
        return {k: to_dict(v) for k, v in obj.items()}
    return obj
