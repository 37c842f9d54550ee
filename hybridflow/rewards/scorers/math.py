"""MATH scorer: the last ``\\boxed{...}`` answer against the reference, after normalisation.

Two answers are equal when their normalised strings are equal, or when both are plain numbers
(integers, decimals, fractions such as ``\\frac{1}{2}``, ``\\frac12`` or ``1/2``) with the same
exact value. Normalisation removes what does not change the answer: spacing commands,
``\\left``/``\\right``, dollar signs, units in ``\\text{}``, degree and percent signs, a trailing
period, a leading ``x =``, and writes ``\\dfrac``/``\\tfrac`` as ``\\frac``.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from fractions import Fraction

__all__ = [
    "last_boxed_only_string",
    "remove_boxed",
    "extract_boxed_answer",
    "normalize_answer",
    "numeric_value",
    "is_equiv",
    "compute_score",
]

_BOX_COMMANDS = ("\\boxed", "\\fbox")


def _balanced_end(text: str, open_index: int) -> int | None:
    """Index just past the brace matching ``text[open_index] == '{'``; escaped braces don't count."""
    depth, i = 0, open_index
    while i < len(text):
        ch = text[i]
        if ch == "\\":
            i += 2  # skip an escaped character such as \{ or \}
            continue
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    return None


def last_boxed_only_string(text: str) -> str | None:
    """The last ``\\boxed{...}`` / ``\\boxed x`` / ``\\fbox{...}`` including the command, or None."""
    start = max(text.rfind(cmd) for cmd in _BOX_COMMANDS)
    if start < 0:
        return None
    cmd = next(c for c in _BOX_COMMANDS if text.startswith(c, start))
    rest = start + len(cmd)
    if rest < len(text) and text[rest] == "{":
        end = _balanced_end(text, rest)
        return None if end is None else text[start:end]
    if rest < len(text) and text[rest] == " ":
        # "\boxed 5": the argument runs to the next dollar sign or the end of the text.
        argument = text[rest:].split("$", 1)[0].strip()
        return f"{cmd} {argument}" if argument else None
    return None


def remove_boxed(boxed: str) -> str:
    """``\\boxed{x}`` -> ``x``; ``\\boxed x`` -> ``x``."""
    for cmd in _BOX_COMMANDS:
        if boxed.startswith(cmd + "{") and boxed.endswith("}"):
            return boxed[len(cmd) + 1 : -1]
        if boxed.startswith(cmd + " "):
            return boxed[len(cmd) + 1 :]
    raise ValueError(f"not a boxed expression: {boxed!r}")


def extract_boxed_answer(text: str) -> str | None:
    boxed = last_boxed_only_string(text)
    return None if boxed is None else remove_boxed(boxed)


_TEXT_CMD = r"\\(?:text|textbf|textrm|mbox|mathrm|operatorname)"
# A unit written as text after the value, optionally squared/cubed: "10\text{ cm}^2".
_TRAILING_UNIT = re.compile(_TEXT_CMD + r"\{\s*[a-zA-Z][a-zA-Z .]*\}(?:\^\{?\d\}?)?\s*$")
_FRAC_SHORTHAND = re.compile(r"\\frac(\{[^{}]*\}|[^{}\\])(\{[^{}]*\}|[^{}\\])")
_ASSIGNMENT = re.compile(r"(?:[a-zA-Z]|\\[a-zA-Z]+)(?:_\{?\w+\}?)?=([^=]+)")
_THOUSANDS = re.compile(r"-?\d{1,3}(?:,\d{3})+(?:\.\d+)?")


def _braced(arg: str) -> str:
    return arg if arg.startswith("{") else "{" + arg + "}"


def normalize_answer(answer: str) -> str:
    """Canonical string form of a MATH answer (see the module docstring for what is removed)."""
    s = str(answer).strip().replace("\n", "")
    s = re.sub(r"\\(?:left|right)\.", "", s)  # null delimiters
    s = re.sub(r"\\(?:left|right|big|Big|bigg|Bigg)(?![a-zA-Z])", "", s)
    s = re.sub(r"\\(?:displaystyle|qquad|quad)(?![a-zA-Z])", "", s)
    s = re.sub(r"\\[!,;: ]", "", s)  # \! \, \; \: and "\ " are spacing
    s = re.sub(r"\\[dt]frac(?![a-zA-Z])", r"\\frac", s)
    s = s.replace("\\$", "").replace("$", "")
    s = re.sub(r"\^\s*\{?\s*\\circ\s*\}?", "", s).replace("°", "").replace("\\degree", "")
    s = s.replace("\\%", "").replace("%", "")
    unit = _TRAILING_UNIT.search(s)
    if unit and s[: unit.start()].strip():  # a unit after a value, not the whole answer
        s = s[: unit.start()]
    s = re.sub(_TEXT_CMD + r"\{([^{}]*)\}", r"\1", s)
    s = re.sub(r"\s+", "", s)
    s = s.rstrip(".")
    assignment = _ASSIGNMENT.fullmatch(s)
    if assignment:
        s = assignment.group(1)
    s = _FRAC_SHORTHAND.sub(lambda m: "\\frac" + _braced(m.group(1)) + _braced(m.group(2)), s)
    s = re.sub(r"\\sqrt([^{\\\[])", r"\\sqrt{\1}", s)  # \sqrt2 -> \sqrt{2}, not \sqrt[3]
    slash = re.fullmatch(r"(-?)(\d+)/(\d+)", s)
    if slash:
        s = f"{slash.group(1)}\\frac{{{slash.group(2)}}}{{{slash.group(3)}}}"
    s = re.sub(r"(?<!\d)\.(\d)", r"0.\1", s)  # ".5" -> "0.5"
    if _THOUSANDS.fullmatch(s):
        s = s.replace(",", "")
    return s


# veRL's name for the normaliser.
strip_string = normalize_answer

_NUM = r"-?\d+(?:\.\d+)?"
_FRAC_VALUE = re.compile(r"(-?)\\frac\{(" + _NUM + r")\}\{(" + _NUM + r")\}")


def numeric_value(normalized: str) -> Fraction | None:
    """Exact value of a normalised plain number or numeric fraction; None for anything else."""
    try:
        if re.fullmatch(_NUM, normalized):
            return Fraction(Decimal(normalized))
        frac = _FRAC_VALUE.fullmatch(normalized)
        if frac:
            denominator = Fraction(Decimal(frac.group(3)))
            if denominator == 0:
                return None
            value = Fraction(Decimal(frac.group(2))) / denominator
            return -value if frac.group(1) else value
    except (InvalidOperation, ValueError):
        return None
    return None


def is_equiv(answer: str | None, reference: str | None) -> bool:
    if answer is None or reference is None:
        return False
    a, b = normalize_answer(answer), normalize_answer(reference)
    if a == b:
        return True
    va, vb = numeric_value(a), numeric_value(b)
    return va is not None and va == vb


def compute_score(solution_str: str, ground_truth: str) -> float:
    """1.0 when the last boxed answer equals the reference, else 0.0 (also when nothing is boxed).

    A reference that itself contains ``\\boxed{}`` (a full MATH solution) is reduced to its box.
    """
    reference = str(ground_truth)
    if any(cmd in reference for cmd in _BOX_COMMANDS):
        reference = extract_boxed_answer(reference) or reference
    return 1.0 if is_equiv(extract_boxed_answer(solution_str), reference) else 0.0
