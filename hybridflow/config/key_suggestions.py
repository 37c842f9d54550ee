"""Keys near a key that is not in a config tree: the "Did you mean" of an unknown or an added (+) key."""

from __future__ import annotations

import difflib
from typing import Any

__all__ = ["suggest_keys"]


def _all_paths(tree: Any, prefix: str = "") -> list[str]:
    """Every dotted path of the tree: inner nodes and leaves."""
    out = []
    if isinstance(tree, dict):
        for key, value in tree.items():
            path = f"{prefix}.{key}" if prefix else str(key)
            out.append(path)
            out.extend(_all_paths(value, path))
    return out


def suggest_keys(key: str, tree: dict, limit: int = 3) -> list[str]:
    """Valid paths close to ``key``: paths that end with it, then those with its last component (the key
    under another parent, as an added ``+a.b.leaf`` that veRL reads at ``a.leaf``), then near spellings."""
    paths = [p for p in _all_paths(tree) if not p.endswith("._target_")]  # a class path is no one's typo
    parts = key.split(".")
    suffix = [p for p in paths if p.endswith("." + key)]
    spelled = difflib.get_close_matches(key, paths, n=limit, cutoff=0.75)
    same_leaf = [p for p in paths if p.split(".")[-1] == parts[-1]]
    # among same-leaf paths prefer those sharing more components with the key (actor.lr -> actor...lr)
    same_leaf.sort(key=lambda p: (-len(set(parts) & set(p.split("."))), -difflib.SequenceMatcher(None, key, p).ratio()))
    near_leaf = []
    if not same_leaf:  # a typo in the last component: compare leaf names only
        leaves = {p.split(".")[-1] for p in paths}
        for leaf in difflib.get_close_matches(parts[-1], leaves, n=2, cutoff=0.8):
            near_leaf += [p for p in paths if p.split(".")[-1] == leaf]
    ranked = [p for p in dict.fromkeys(suffix + same_leaf + spelled + near_leaf) if not key.startswith(p + ".")]
    return ranked[:limit]
