"""GSM8K scorer: the final answer is the number after ``####`` (strict) or the last number (flexible).

Answers compare as exact decimals, so "1,000", "1000" and "1000.0" are the same answer but
"1000.5" is not. Like veRL, only the tail of the response is searched: the answer comes last, and
scanning a long runaway response with a regex is wasted time.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

# Only the last characters are searched (veRL does the same, with the same length).
_TAIL_CHARS = 300

# A number: optional minus, digits with optional thousands commas, optional decimal part; or ".5".
_NUMBER = r"-?(?:\d[\d,]*(?:\.\d+)?|\.\d+)"
_STRICT = re.compile(r"####\s*\$?\s*(" + _NUMBER + r")")
_ANY_NUMBER = re.compile(_NUMBER)


def _clean(number: str) -> str:
    return number.replace(",", "")


def extract_solution(solution_str: str, method: str = "strict") -> str | None:
    """Return the answer as a string without commas, or None when there is none."""
    if method not in ("strict", "flexible"):
        raise ValueError(f"method must be 'strict' or 'flexible', got {method!r}")
    tail = solution_str[-_TAIL_CHARS:]
    pattern = _STRICT if method == "strict" else _ANY_NUMBER
    found = pattern.findall(tail)
    return _clean(found[-1]) if found else None


def _as_decimal(text: str) -> Decimal | None:
    try:
        return Decimal(_clean(str(text)).strip().lstrip("$").rstrip("."))
    except InvalidOperation:
        return None


def answers_match(answer: str, ground_truth: str) -> bool:
    """Exact decimal equality; falls back to string equality when either side is not a number."""
    a, b = _as_decimal(answer), _as_decimal(ground_truth)
    if a is not None and b is not None:
        return a == b
    return _clean(answer).strip() == _clean(str(ground_truth)).strip()


def compute_score(
    solution_str: str,
    ground_truth: str,
    method: str = "strict",
    format_score: float = 0.0,
    score: float = 1.0,
) -> float:
    """``score`` for the right answer, ``format_score`` for a wrong one, 0 when none is found."""
    answer = extract_solution(solution_str, method=method)
    if answer is None:
        return 0.0
    return float(score) if answers_match(answer, ground_truth) else float(format_score)
