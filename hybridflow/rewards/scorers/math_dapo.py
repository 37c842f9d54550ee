"""DAPO's math scorer (veRL's ``math_dapo``: data sources ``math_dapo``, ``math``, ``math_dapo_reasoning`` and
every ``aime*``): +1.0 for a right final answer, -1.0 otherwise, as ``{"score", "acc", "pred"}``.

Only the response's last 300 characters are read. The answer is the last ``Answer: ...`` line (Minerva's
convention), normalised with the rules of the Minerva paper (Lewkowycz et al. 2022, appendix: the part after the
last ``=``, no spaces, units and ``\\text{}`` wrappers, shorthand ``\\frac12`` / ``\\sqrt2`` written out,
thousands separators of a plain number dropped) and compared as text with the equally normalised reference.
Without an ``Answer:`` line the last ``\\boxed{}`` of the last 100 characters is compared, unnormalised;
``strict_box_verify`` uses only that.
"""

from __future__ import annotations

import re

from hybridflow.rewards.scorers.math import last_boxed_only_string, remove_boxed

__all__ = ["minerva_normalize", "compute_score"]

INVALID = "[INVALID]"
_ANSWER_LINE = re.compile(r"(?i)Answer\s*:\s*([^\n]+)")

# Minerva's normalisation, in its order: text replaced, then words and symbols removed
_REPLACED = (
    ("an ", ""), ("a ", ""), (".$", "$"), ("\\$", ""), ("\\ ", ""), (" ", ""), ("mbox", "text"),
    (",\\text{and}", ","), ("\\text{and}", ","), ("\\text{m}", "\\text{}"),
)  # fmt: skip
_REMOVED = (
    "square ways integers dollars mph inches hours km units \\ldots sue points feet minutes digits cents degrees "
    "cm gm pounds meters meals edges students childrentickets multiples"
).split() + [
    "\\text{s}", "\\text{.}", "\\text{\ns}", "\\text{}^2", "\\text{}^3", "\\text{\n}", "\\text{}", "\\mathrm{th}",
    "^\\circ", "^{\\circ}", "\\;", ",\\!", "{,}", '"', "\\dots",
]  # fmt: skip
_UNWRAPPED = ("text", "textbf", "overline")


def minerva_normalize(answer: str) -> str:
    """A final answer in Minerva's canonical text form (the rules in the module docstring)."""
    text = answer.split("=")[-1]
    for old, new in _REPLACED:
        text = text.replace(old, new)
    for word in _REMOVED:
        text = text.replace(word, "")
    text = re.sub(r"(.*?)(\$)(.*?)(\$)(.*)", r"$\3$", text)  # the first $...$ span only
    for command in _UNWRAPPED:
        text = re.sub(rf"(\\{command}\{{)(.*?)(\}})", r"\2", text)
    text = re.sub(r"(\\boxed\{)(.*)(\})", r"\2", text)
    text = re.sub(r"(frac)([^{])(.)", r"frac{\2}{\3}", text)  # \frac12 -> \frac{1}{2}
    text = re.sub(r"(sqrt)([^{])", r"sqrt{\2}", text)  # \sqrt2 -> \sqrt{2}
    text = text.replace("$", "")
    if text.replace(",", "").isdigit():
        text = text.replace(",", "")
    return text.strip()


def _answer_line(solution: str) -> str:
    found = _ANSWER_LINE.findall(solution)
    return minerva_normalize(found[-1] if found else INVALID)


def _boxed_tail(solution: str) -> str | None:
    boxed = last_boxed_only_string(solution[-100:])
    return None if boxed is None else remove_boxed(boxed)


def compute_score(solution_str: str, ground_truth: str, strict_box_verify: bool = False, **kwargs) -> dict:
    tail = str(solution_str)[-300:]
    if strict_box_verify:
        pred = _boxed_tail(tail)
        correct = pred == ground_truth
    else:
        pred = _answer_line(tail)
        correct = pred == minerva_normalize(str(ground_truth))
        if pred == INVALID and (boxed := _boxed_tail(tail)) is not None:
            pred, correct = boxed, boxed == ground_truth
    return {"score": 1.0 if correct else -1.0, "acc": bool(correct), "pred": pred}
