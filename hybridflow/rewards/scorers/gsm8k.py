"""GSM8K scorer: the final answer is the number after ``#### `` (strict) or the last number (flexible).

By default this scores exactly as veRL 0.9.1 does, so the same responses get the same rewards:

- only the last 300 characters are searched (the answer comes last; a regex over a long runaway
  response is wasted time);
- strict: the last ``#### <number>`` with exactly one space, the number made of digits, ``.`` and
  ``,``, optionally after ``-``; commas are removed. ``####4``, ``#### $4`` find nothing;
- flexible: the last run of digits/``.``/``,`` (optionally after ``-``) that is not just ``.``;
  commas are kept;
- the answer must equal the ground truth *as a string*: ``4.00``, ``4.`` and ``1,000`` (flexible)
  do not equal ``4`` / ``1000``.

``lenient=True`` opts in to a forgiving parser instead: a ``$`` and any spacing after ``####``,
thousands separators in both modes, a trailing period, and numeric equality (``4.00 == 4``).
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

__all__ = ["extract_solution", "answers_match", "compute_score"]

# Only the last characters are searched (veRL's _SOLUTION_CLIP_CHARS).
_TAIL_CHARS = 300

_VERL_STRICT = re.compile(r"#### (\-?[0-9\.\,]+)")
_VERL_FLEXIBLE = re.compile(r"(\-?[0-9\.\,]+)")

# lenient: optional minus, digits with optional thousands commas, optional decimal part; or ".5".
_NUMBER = r"-?(?:\d[\d,]*(?:\.\d+)?|\.\d+)"
_LENIENT_STRICT = re.compile(r"####\s*\$?\s*(" + _NUMBER + r")")
_LENIENT_ANY_NUMBER = re.compile(_NUMBER)


class InvalidMethodError(ValueError, AssertionError):
    """``method`` is neither 'strict' nor 'flexible' (veRL asserts; both handlers catch this)."""


def _check_method(method: str) -> None:
    if method not in ("strict", "flexible"):
        raise InvalidMethodError(f"method must be 'strict' or 'flexible', got {method!r}")


def extract_solution(solution_str: str, method: str = "strict", lenient: bool = False) -> str | None:
    """The answer string, or None when there is none (veRL's rules unless ``lenient``)."""
    _check_method(method)
    tail = solution_str[-_TAIL_CHARS:]
    if lenient:
        found = (_LENIENT_STRICT if method == "strict" else _LENIENT_ANY_NUMBER).findall(tail)
        return found[-1].replace(",", "") if found else None
    if method == "strict":
        found = _VERL_STRICT.findall(tail)
        return found[-1].replace(",", "").replace("$", "") if found else None
    found = _VERL_FLEXIBLE.findall(tail)
    if not found:
        return None
    # the last candidate that is not a lone '.'; if every one is, veRL's loop ends on the first
    for candidate in reversed(found):
        if candidate not in ("", "."):
            return candidate
    return found[0]


def _as_decimal(text: str) -> Decimal | None:
    try:
        return Decimal(str(text).replace(",", "").strip().lstrip("$").rstrip("."))
    except InvalidOperation:
        return None


def answers_match(answer: str, ground_truth, lenient: bool = False) -> bool:
    """veRL: string equality with the ground truth. ``lenient``: exact decimal equality, falling
    back to comma-free string equality when either side is not a number."""
    if not lenient:
        return answer == ground_truth
    a, b = _as_decimal(answer), _as_decimal(ground_truth)
    if a is not None and b is not None:
        return a == b
    return answer.replace(",", "").strip() == str(ground_truth).replace(",", "").strip()


def compute_score(
    solution_str: str,
    ground_truth: str,
    method: str = "strict",
    format_score: float = 0.0,
    score: float = 1.0,
    lenient: bool = False,
) -> float:
    """``score`` for the right answer, ``format_score`` for a wrong one, 0 when none is found."""
    answer = extract_solution(solution_str, method=method, lenient=lenient)
    if answer is None:
        return 0.0
    return float(score) if answers_match(answer, ground_truth, lenient=lenient) else float(format_score)
