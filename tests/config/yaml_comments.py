"""The comments attached to each key of a yaml file: its inline comment and the comment block right
above it. The config-key tests use it to check that a default differing from veRL's is documented."""

from __future__ import annotations

import re
from pathlib import Path

_KEY = re.compile(r"^(\s*)(['\"]?)([^'\":#\s][^'\":#]*?)\2\s*:(\s|$)")


def _inline_comment(line: str) -> str:
    quote = None
    for i, c in enumerate(line):
        if quote:
            quote = None if c == quote else quote
        elif c in "'\"":
            quote = c
        elif c == "#" and (i == 0 or line[i - 1] in " \t"):
            return line[i + 1 :].strip()
    return ""


def key_comments(path: str | Path) -> dict[str, list[str]]:
    """``{dotted key: [comment texts]}`` for every mapping key of a block-style yaml file."""
    out: dict[str, list[str]] = {}
    stack: list[tuple[int, str]] = []  # (indent, key)
    pending: list[str] = []
    for line in Path(path).read_text().splitlines():
        stripped = line.strip()
        if not stripped:
            pending = []
            continue
        if stripped.startswith("#"):
            pending.append(stripped.lstrip("#").strip())
            continue
        m = _KEY.match(line)
        if not m:
            pending = []
            continue
        indent, key = len(m.group(1)), m.group(3).strip()
        while stack and stack[-1][0] >= indent:
            stack.pop()
        stack.append((indent, key))
        dotted = ".".join(k for _, k in stack)
        out[dotted] = pending + [c for c in [_inline_comment(line)] if c]
        pending = []
    return out
