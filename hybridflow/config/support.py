"""What hybridflow does with each config key, checked once when a config is loaded. The statuses are
declared with the keys (``hybridflow.config.keys`` derives one ``KeyTable`` per config); this module
applies them:

- ``apply_aliases``: a key veRL moved may be written under either spelling; a legacy key set to another
  value than its default is copied onto the canonical key (two different values are an error naming
  both); ``mirror_aliases`` copies the resolved canonical values back, so both spellings read the same.
- ``check_support``: a "not supported" key set, or an honoured key outside its ``values``, is refused
  naming why; an "accepted with note" key set gives a note; a ``+`` key no rule covers is refused. "Set"
  means its unresolved value differs from the yaml's (a key that only follows an interpolation is not set).

Rule patterns are dotted keys: ``*`` matches one component, a trailing ``.**`` the key and everything
below, a leading ``**.`` any depth; the most specific match wins (literal components, then length).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from hybridflow.config.key_suggestions import suggest_keys
from hybridflow.config.status import HONOURED, NOT_SUPPORTED, NOTE, KeyStatus
from hybridflow.utils.nested_dict import leaf_items

__all__ = [
    "HONOURED",
    "NOT_SUPPORTED",
    "NOTE",
    "ALIAS",
    "STATUSES",
    "KeyRule",
    "KeyTable",
    "apply_aliases",
    "mirror_aliases",
    "check_support",
    "SupportError",
]

ALIAS = "alias"
STATUSES = (HONOURED, NOT_SUPPORTED, NOTE, ALIAS)

_MISSING = object()


class SupportError(ValueError):
    """Raised with every refused key of a config (config.loader turns it into a ConfigError)."""


@dataclass(frozen=True)
class KeyRule:
    """``pattern`` has ``status``. ``values``: for an honoured key, the only values hybridflow
    implements (others are refused as not supported); ``reason``: why, shown in messages and the table."""

    pattern: str
    status: str
    reason: str = ""
    values: tuple | None = None
    shared: bool = False  # for keys users add with + (the tree does not hold the key)

    def __post_init__(self):
        KeyStatus(self.status, self.reason, self.values)  # a declared status's checks

    @functools.cached_property
    def regex(self) -> re.Pattern:
        return _compile(self.pattern)

    @property
    def specificity(self) -> tuple[int, int]:
        return (sum(1 for part in self.pattern.split(".") if "*" not in part), len(self.pattern))


def _compile(pattern: str) -> re.Pattern:
    head = tail = ""
    if pattern.startswith("**."):
        pattern, head = pattern[3:], r"(?:.+\.)?"
    if pattern.endswith(".**"):
        pattern, tail = pattern[:-3], r"(?:\..+)?"
    if "**" in pattern:
        raise ValueError(f"pattern {pattern!r}: '**' is only allowed as the first or last component")
    body = r"\.".join(
        "[^.]+" if part == "*" else re.escape(part).replace(r"\*", "[^.]*") for part in pattern.split(".")
    )
    return re.compile(f"^{head}{body}{tail}$")


@dataclass(frozen=True)
class KeyTable:
    """The status data of one config: rules (``hybridflow.config.key_table`` derives them from the
    declarations) and legacy aliases (``(legacy prefix, canonical prefix)``; the longest legacy
    prefix that matches a key wins)."""

    name: str
    rules: tuple[KeyRule, ...]
    aliases: tuple[tuple[str, str], ...] = field(default=())
    _cache: dict = field(default_factory=dict, compare=False, hash=False, repr=False)

    def alias_of(self, key: str) -> str | None:
        """The canonical key a legacy ``key`` maps onto, or None when ``key`` is not a legacy spelling."""
        best = None
        for legacy, canonical in self.aliases:
            if (key == legacy or key.startswith(legacy + ".")) and (best is None or len(legacy) > len(best[0])):
                best = (legacy, canonical)
        return None if best is None else best[1] + key[len(best[0]) :]

    def rule_for(self, key: str) -> KeyRule | None:
        """The most specific rule whose pattern matches ``key`` (None: the key has no status)."""
        if key not in self._cache:
            matches = self.matching_rules(key)
            self._cache[key] = max(matches, key=lambda r: r.specificity) if matches else None
        return self._cache[key]

    def matching_rules(self, key: str) -> list[KeyRule]:
        """Every rule that matches ``key`` (the tests use it to find ambiguous rules)."""
        return [rule for rule in self.rules if rule.regex.match(key)]


# --------------------------------------------------------------------------- trees


def _get(tree: Any, key: str) -> Any:
    node = tree
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return _MISSING
        node = node[part]
    return node


def _set(tree: dict, key: str, value: Any) -> None:
    parts = key.split(".")
    node = tree
    for part in parts[:-1]:
        if not isinstance(node.get(part), dict):
            node[part] = {}
        node = node[part]
    node[parts[-1]] = value


def _show(value: Any) -> str:
    return "null" if value is None else repr(value)


# --------------------------------------------------------------------------- aliases


def apply_aliases(
    table: KeyTable, raw: dict, defaults: dict, explicit: Iterable[str] = (), origins: dict[str, str] | None = None
) -> dict[str, Any]:
    """Copy every set legacy key of ``raw`` (unresolved tree, changed in place) onto its canonical key.

    A key is set when its value differs from its default, or when it (or a section above it) was
    written on the command line (``explicit``: the override keys), so ``reward_model.enable=True
    reward.reward_model.enable=False`` is a conflict although False is the default. Returns
    ``{canonical key: value}`` for the keys set this way (``origins`` receives ``{canonical key: the
    legacy key it came from}``, so messages can name what the user wrote); raises SupportError naming
    every conflict.
    """
    written = tuple(explicit)

    def is_set(key: str, value: Any) -> bool:
        return value != _get(defaults, key) or any(key == w or key.startswith(w + ".") for w in written)

    errors, moved = [], {}
    for key, value in list(leaf_items(raw)):
        target = table.alias_of(key)
        if target is None or not is_set(key, value):
            continue
        current = _get(raw, target)
        if current is not _MISSING and is_set(target, current) and current != value:
            errors.append(
                f"{key}={_show(value)} and {target}={_show(current)} set the same thing to different "
                f"values ({key} is the earlier spelling of {target}); set only one of them"
            )
            continue
        _set(raw, target, value)
        moved[target] = value
        if origins is not None:
            origins[target] = key
    if errors:
        raise SupportError("\n  ".join(errors))
    return moved


def mirror_aliases(table: KeyTable, resolved: dict) -> dict[str, Any]:
    """``{legacy key: value of its canonical key}`` for every legacy key of ``resolved`` whose value
    differs from it: the updates that make both spellings read the same."""
    updates = {}
    for key, value in leaf_items(resolved):
        target = table.alias_of(key)
        if target is not None:
            canonical = _get(resolved, target)
            if canonical is not _MISSING and canonical != value:
                updates[key] = canonical
    return updates


# --------------------------------------------------------------------------- support


def check_support(
    table: KeyTable, raw: dict, defaults: dict, resolved: dict, origins: dict[str, str] | None = None
) -> list[str]:
    """Notes for the keys of ``raw`` that print one; raises SupportError listing every refused key.

    ``raw``: the composed tree after ``apply_aliases``, unresolved; ``defaults``: the yaml's tree,
    unresolved; ``resolved``: ``raw`` with interpolations resolved (values are judged there);
    ``origins``: from ``apply_aliases``.
    """
    errors, notes = [], []
    for key, value in leaf_items(raw):
        if table.alias_of(key) is not None:
            continue  # a legacy spelling: its canonical key is checked instead
        default = _get(defaults, key)
        is_set = value != default
        rule = table.rule_for(key)
        if rule is None:
            if default is _MISSING:
                close = suggest_keys(key, defaults)
                hint = f". Did you mean: {', '.join(close)}?" if close else ""
                errors.append(
                    f"{key} is not a {table.name} key (it was added with +): hybridflow would not read it{hint}"
                )
            else:  # every key of the yaml has a rule; the config-key tests keep it so
                errors.append(f"{key} has no status (its declaration in hybridflow/config/ gives none)")
            continue
        shown = _get(resolved, key)
        shown = value if shown is _MISSING else shown
        why = f": {rule.reason}" if rule.reason else ""
        if origins and key in origins:  # name the spelling the user wrote too
            why = f" (set as {origins[key]}){why}"
        if rule.status == HONOURED:
            if rule.values is not None and is_set and shown not in rule.values:
                supported = ", ".join(_show(v) for v in rule.values)
                errors.append(f"{key}={_show(shown)} is not supported by hybridflow (supported: {supported}){why}")
        elif rule.status == NOT_SUPPORTED and is_set:
            default_text = "" if default is _MISSING else f" (default: {_show(default)})"
            errors.append(f"{key}={_show(shown)} is not supported by hybridflow{default_text}{why}")
        elif rule.status == NOTE and is_set:
            notes.append(f"{key}={_show(shown)} is accepted but not applied: {rule.reason}")
    if errors:
        raise SupportError("\n  ".join(errors))
    return notes
