"""Nested dicts (a config tree as plain containers) seen as their leaves."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any


def leaf_items(tree: Any, prefix: str = "", sep: str = ".") -> Iterator[tuple[str, Any]]:
    """(dotted path, value) of every leaf; an empty dict is a leaf, a list is a value."""
    if isinstance(tree, dict) and tree:
        for key, value in tree.items():
            yield from leaf_items(value, f"{prefix}{sep}{key}" if prefix else str(key), sep)
    else:
        yield prefix, tree
