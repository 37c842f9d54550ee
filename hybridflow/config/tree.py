"""The yaml tree a declaration stands for: every key of a config class (nested sections, dict values) at
its place, with its value as the yaml writes it (the default, or the interpolation it ``follows``) and
its doc. Keys a place lists as ``absent`` are left out. The yaml generator renders these entries; the
tests resolve the tree and compare it with the declared defaults."""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from hybridflow.config.base import field_absent, field_follows, to_dict
from hybridflow.config.errors import ConfigError

__all__ = ["Entry", "entries", "raw_tree", "value_kinds"]


@dataclass(frozen=True)
class Entry:
    """One key. ``value`` is the yaml value (an interpolation string where it follows another key);
    for a nested mapping ``nested`` is True and ``value`` is None (its keys are the next entries, one
    level deeper). ``empty``: a nested mapping without keys (written ``{}``)."""

    path: str
    depth: int
    doc: str
    value: Any = None
    nested: bool = False


def below(table: dict, name: str) -> dict:
    """The entries of a {dotted key: value} table under ``name``, keyed relative to it."""
    prefix = name + "."
    return {k[len(prefix) :]: v for k, v in table.items() if k.startswith(prefix)}


def children(obj: Any) -> list[tuple[str, Any, dataclasses.Field | None]]:
    """(name, value, field or None) of each key of a config instance or a dict."""
    if dataclasses.is_dataclass(obj):
        out = []
        for f in dataclasses.fields(obj):
            value = getattr(obj, f.name)
            if f.name == "_target_" and value == "":
                continue  # a class veRL reads without a _target_
            out.append((f.name, value, f))
        return out
    return [(str(k), v, None) for k, v in obj.items()]


def _check(obj: Any, table: dict, what: str, path: str) -> None:
    """Every key a follows/absent table names exists (a typo would silently do nothing)."""
    for key in table:
        node = obj
        for part in key.split("."):
            names = (
                {n for n, _, _ in children(node)}
                if (dataclasses.is_dataclass(node) or isinstance(node, dict))
                else set()
            )
            if dataclasses.is_dataclass(node) and part == "_target_":
                names.add("_target_")
            if part not in names:
                raise ConfigError(f"{path or 'the root'}: {what} names {key!r}, which is not a key there")
            node = getattr(node, part) if dataclasses.is_dataclass(node) else node[part]


def entries(
    obj: Any,
    follows: dict | None = None,
    absent: tuple[str, ...] = (),
    path: str = "",
    depth: int = 0,
    interpolate: bool = True,
) -> Iterator[Entry]:
    """The entries of ``obj`` (a config instance or a dict). ``follows``/``absent``: what the enclosing
    places say about its keys (relative dotted keys; they win over the fields' own). ``interpolate``
    False: every key holds its default, interpolations are left out (what they should resolve to)."""
    follows, absent = dict(follows or {}), tuple(absent)
    _check(obj, follows, "follows", path)
    _check(obj, {k: None for k in absent}, "absent", path)
    for name, value, f in children(obj):
        if name in absent:
            continue
        key = f"{path}.{name}" if path else name
        own = field_follows(f) if f is not None else None
        text = f.metadata.get("doc", "") if f is not None else ""
        inner = dict(own) if isinstance(own, dict) else {}
        inner.update(below(follows, name))
        here = follows[name] if name in follows else (own if isinstance(own, str) else None)
        if isinstance(here, str) and interpolate:
            yield Entry(key, depth, text, here)
            continue
        if dataclasses.is_dataclass(value) or (isinstance(value, dict) and value):
            sub_absent = (field_absent(f) if f is not None else ()) + tuple(below({k: None for k in absent}, name))
            yield Entry(key, depth, text, None, nested=True)
            yield from entries(value, inner, sub_absent, key, depth + 1, interpolate)
            continue
        if inner and interpolate:
            raise ConfigError(f"{key}: follows names keys inside {value!r}, which has none")
        yield Entry(key, depth, text, to_dict(value))


def raw_tree(obj: Any, follows: dict | None = None, absent: tuple[str, ...] = (), interpolate: bool = True) -> dict:
    """The yaml tree of ``obj`` as nested dicts, interpolations unresolved (``interpolate`` False:
    the defaults they stand for)."""
    root: dict = {}
    stack = [root]
    for e in entries(obj, follows, absent, interpolate=interpolate):
        del stack[e.depth + 1 :]
        leaf = e.path.rsplit(".", 1)[-1]
        if e.nested:
            stack[e.depth][leaf] = {}
            stack.append(stack[e.depth][leaf])
        else:
            stack[e.depth][leaf] = e.value
    return root


# the kind of a scalar value or type, as override checks and messages name it
SCALAR_KINDS = {bool: "bool", int: "int", float: "float", str: "str"}


def _kinds(annotation: Any) -> tuple[str, ...] | None:
    """The value kinds a field's annotation allows (``Optional`` drops None; a list/tuple is "list", a
    dict "dict"); None when it allows anything (``Any``, a class)."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        out: list[str] = []
        for arg in typing.get_args(annotation):
            if arg is type(None):
                continue
            inner = _kinds(arg)
            if inner is None:
                return None
            out += inner
        return tuple(dict.fromkeys(out))
    if annotation in (list, tuple) or origin in (list, tuple):
        return ("list",)
    if annotation is dict or origin is dict:
        return ("dict",)
    kind = SCALAR_KINDS.get(annotation)
    return (kind,) if kind else None


def value_kinds(obj: Any, path: str = "") -> dict[str, tuple[str, ...]]:
    """Dotted key -> the kinds of value its declared type allows (``"float", "str"`` for
    ``Union[float, str]``), for every typed leaf of a config instance: what the loader checks an
    override against, so a key that takes two shapes is declared as such once, on its field."""
    hints = typing.get_type_hints(type(obj))
    out: dict[str, tuple[str, ...]] = {}
    for f in dataclasses.fields(obj):
        value, key = getattr(obj, f.name), f"{path}.{f.name}" if path else f.name
        if dataclasses.is_dataclass(value):
            out.update(value_kinds(value, key))
            continue
        kinds = _kinds(hints.get(f.name, Any))
        if kinds is not None:
            out[key] = kinds
    return out
