"""Parsers that read a judge's verdict (its generated text) into a score.

A parser takes the text and returns a finite float, or None when it finds no verdict; the reward
manager then gives the sample ``unparsable_score`` (0.0 by default, as veRL's GenRM example does when
its parse fails) and counts it in ``genrm/unparsable``. Register your own with
``@register_verdict_parser("name")`` and select it with ``reward.reward_kwargs.parser=name``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable

from hybridflow.utils.registry import Registry

VerdictParser = Callable[[str], float | None]
VERDICT_PARSERS: Registry[VerdictParser] = Registry("verdict parser")

_NUMBER = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"
_BOXED = re.compile(r"\\boxed\{\s*(" + _NUMBER + r")\s*\}")
_SCORE = re.compile(r"\bscore\s*[:=]\s*(" + _NUMBER + r")", re.IGNORECASE)
_ANY_NUMBER = re.compile(_NUMBER)
_YES_NO = re.compile(r"\b(yes|no)\b", re.IGNORECASE)


def register_verdict_parser(name: str):
    """Decorator: make ``fn(text) -> float | None`` selectable as ``reward.reward_kwargs.parser=<name>``."""
    return VERDICT_PARSERS.register(name)


def _finite(text: str | None) -> float | None:
    if text is None:
        return None
    value = float(text)
    return value if math.isfinite(value) else None


def _last(pattern: re.Pattern, text: str) -> str | None:
    found = pattern.findall(text)
    return found[-1] if found else None


@register_verdict_parser("boxed")
def boxed(text: str) -> float | None:
    """The number in the last ``\\boxed{...}`` that holds only a number."""
    return _finite(_last(_BOXED, text))


@register_verdict_parser("score")
def score(text: str) -> float | None:
    """The number after the last ``score:`` or ``score =`` (any case)."""
    return _finite(_last(_SCORE, text))


@register_verdict_parser("last_number")
def last_number(text: str) -> float | None:
    """The last number anywhere in the text."""
    return _finite(_last(_ANY_NUMBER, text))


@register_verdict_parser("yes_no")
def yes_no(text: str) -> float | None:
    """1.0 for a first standalone "yes", 0.0 for a first "no" (any case)."""
    match = _YES_NO.search(text)
    return None if match is None else float(match.group(1).lower() == "yes")


def get_verdict_parser(name: str) -> VerdictParser:
    """The parser registered as ``name``; an unknown name raises listing the known ones."""
    return VERDICT_PARSERS[name]
