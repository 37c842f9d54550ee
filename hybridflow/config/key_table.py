"""The status table of a config (``support.KeyTable``), derived from its declaration.

A walk over the config's tree (the top-level class instance, its sections, dict values) gives every key
its status: what its place says (``keys=`` of a ``doc``/``section`` above it; the outermost place
wins), else what its field declares (``doc(..., refused=...)``), else honoured. A key with a status
of its own covers everything below it: below a section or dict that has one, only ``keys=`` of the
places above name other statuses (the nested classes' declarations do not apply there). Each key
becomes one rule: its dotted path (``path.**`` for a section or dict, so keys added below with ``+``
have its status too). ``keys=`` patterns (``"megatron.**"``) and literal keys that the tree does not
hold become rules for keys users add with ``+``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

from hybridflow.config.base import field_absent, field_keys, field_status
from hybridflow.config.errors import ConfigError
from hybridflow.config.status import KeyStatus
from hybridflow.config.support import KeyRule, KeyTable
from hybridflow.config.tree import below, children

__all__ = ["derive_rules", "derive_table"]


def _is_container(value: Any) -> bool:
    return dataclasses.is_dataclass(value) or (isinstance(value, dict) and bool(value))


class _Rules:
    def __init__(self):
        self.rules: dict[str, KeyRule] = {}

    def add(self, pattern: str, status: KeyStatus, shared: bool = False) -> None:
        rule = KeyRule(pattern, status.status, status.reason, status.values, shared)
        old = self.rules.get(pattern)
        if old is not None and old != rule:
            raise ConfigError(f"{pattern}: two statuses are declared for this key ({old.status} and {rule.status})")
        self.rules[pattern] = rule


def _walk(obj: Any, path: str, places: dict, absent: tuple, declared: bool, out: _Rules) -> None:
    """``places``: {relative key or pattern: status} from the places above; ``declared``: whether the
    fields' own declarations apply (False below a key with a status of its own)."""
    names = set()
    for name, value, f in children(obj):
        if name in absent:
            continue
        names.add(name)
        key = f"{path}.{name}" if path else name
        own_keys = field_keys(f) if (f is not None and declared) else {}
        # this place's statuses of the keys below (a place further out wins)
        inner = {**own_keys, **below(places, name)}
        if name in places:
            status = places[name]
        elif f is not None and declared:
            status = field_status(f)
        else:
            status = None
        container = _is_container(value)
        if status is not None:
            out.add(f"{key}.**" if container or isinstance(value, dict) else key, status)
        elif declared and not container and name != "_target_":
            out.add(f"{key}.**" if isinstance(value, dict) else key, KeyStatus())
        if container:
            sub_absent = (field_absent(f) if f is not None else ()) + tuple(below({a: 0 for a in absent}, name))
            _walk(value, key, inner, sub_absent, declared and status is None, out)
        else:
            _extra(key, inner, out)
    _extra(path, {k: v for k, v in places.items() if k.split(".")[0] not in names}, out)


def _extra(path: str, table: dict, out: _Rules) -> None:
    """Rules for keys the tree does not hold at ``path`` (keys users add with +)."""
    for rel, status in table.items():
        out.add(f"{path}.{rel}" if path else rel, status, shared=True)


def derive_rules(root: Any, keys: dict | None = None) -> tuple[KeyRule, ...]:
    """Every rule of the config whose top-level instance is ``root``; ``keys``: the root place's own."""
    out = _Rules()
    _walk(root, "", dict(keys or {}), (), True, out)
    return tuple(out.rules.values())


def derive_table(name: str, root: Any, keys: dict | None = None, aliases: Iterable[tuple[str, str]] = ()) -> KeyTable:
    """The table of a config; a legacy spelling (``aliases``) has no rule (its canonical key's applies)."""
    aliases = tuple(aliases)
    probe = KeyTable(name, (), aliases)
    rules = tuple(r for r in derive_rules(root, keys) if probe.alias_of(r.pattern.removesuffix(".**")) is None)
    return KeyTable(name, rules, aliases)
