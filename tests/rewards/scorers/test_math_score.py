"""MATH scorer: boxed extraction and the answer normaliser, checked on tables of pairs."""

import pytest

from hybridflow.rewards.scorers import math as math_score

BOXED = [
    ("so \\boxed{5}.", "5"),
    ("first \\boxed{1} then \\boxed{2}", "2"),  # the last box
    ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),  # nested braces kept whole
    ("\\boxed{\\{1,2\\}}", "\\{1,2\\}"),  # escaped braces do not close the box
    ("$\\boxed 5$", "5"),  # "\boxed 5" form, ends at '$'
    ("answer \\boxed 12", "12"),
    ("\\fbox{7}", "7"),
    ("\\boxed{3} and \\fbox{4}", "4"),  # whichever command comes last
    ("\\boxed{unclosed", None),  # truncated response
    ("no box, 5", None),
]


@pytest.mark.parametrize("text,expected", BOXED)
def test_extract_boxed(text, expected):
    assert math_score.extract_boxed_answer(text) == expected


EQUIVALENT = [
    ("0.5", "\\frac{1}{2}"),
    ("\\frac12", "\\frac{1}{2}"),
    ("1/2", "\\frac{1}{2}"),
    ("\\dfrac{1}{2}", "0.5"),
    ("\\tfrac{3}{4}", "0.75"),
    (".5", "0.5"),
    ("0.50", "1/2"),
    ("-\\frac{1}{2}", "\\frac{-1}{2}"),  # same value, different sign placement
    ("10\\text{ cm}", "10"),  # unit dropped
    ("10 \\mbox{inches}", "10"),
    ("5\\text{ cm}^2", "5"),
    ("\\$5.00", "5"),  # escaped dollar, trailing zeros
    ("$7$", "7"),
    ("x = 3", "3"),  # leading assignment
    ("x=\\frac{1}{3}", "\\frac13"),
    ("90^\\circ", "90"),
    ("90^{\\circ}", "90"),
    ("50\\%", "50"),
    ("\\left( 1, 2 \\right)", "(1,2)"),
    ("\\left[0,1\\right)", "[0,1)"),
    ("3.", "3"),  # trailing period
    ("1,000", "1000"),  # thousands separator
    ("1\\,000", "1000"),  # thin space as separator
    ("\\sqrt2", "\\sqrt{2}"),
    ("\\frac{\\sqrt{3}}{2}", "\\dfrac{\\sqrt3}{2}"),
    ("2 \\! x", "2x"),
    ("\\text{(A)}", "(A)"),
]

NOT_EQUIVALENT = [
    ("0.33", "\\frac{1}{3}"),  # exact values differ
    ("\\frac{1}{2}", "\\frac{1}{3}"),
    ("1,2", "12"),  # a pair is not a thousands number
    ("5", "-5"),
    ("\\sqrt{2}", "2"),
    ("x+1", "x-1"),
    ("(1,2)", "[1,2]"),
    ("10\\text{ cm}", "100"),
]


@pytest.mark.parametrize("a,b", EQUIVALENT)
def test_equivalent_pairs(a, b):
    assert math_score.is_equiv(a, b), (math_score.normalize_answer(a), math_score.normalize_answer(b))
    assert math_score.is_equiv(b, a)


@pytest.mark.parametrize("a,b", NOT_EQUIVALENT)
def test_non_equivalent_pairs(a, b):
    assert not math_score.is_equiv(a, b), (math_score.normalize_answer(a), math_score.normalize_answer(b))


NORMALISED = [
    ("\\dfrac{1}{2}", "\\frac{1}{2}"),
    ("\\frac12", "\\frac{1}{2}"),
    ("\\frac1{22}", "\\frac{1}{22}"),
    ("3/4", "\\frac{3}{4}"),
    ("-.25", "-0.25"),
    ("k = 4", "4"),
    ("\\sqrt[3]{8}", "\\sqrt[3]{8}"),  # not mistaken for \sqrt shorthand
]


@pytest.mark.parametrize("raw,expected", NORMALISED)
def test_normalize_answer(raw, expected):
    assert math_score.normalize_answer(raw) == expected


def test_compute_score():
    assert math_score.compute_score("thus $\\boxed{\\dfrac{1}{2}}$.", "0.5") == 1.0
    assert math_score.compute_score("thus $\\boxed{\\dfrac{1}{3}}$.", "0.5") == 0.0
    assert math_score.compute_score("the answer is 0.5", "0.5") == 0.0  # nothing boxed
    # a reference given as a full solution is reduced to its box
    assert math_score.compute_score("\\boxed{4}", "2+2 = \\boxed{4}") == 1.0
    assert math_score.is_equiv(None, "1") is False
