"""GSM8K scorer: extraction tables for strict (after '####') and flexible (last number) modes."""

import pytest

from hybridflow.utils.reward_score import gsm8k

STRICT_EXTRACT = [
    ("so the total is 18.\n#### 18", "18"),
    ("#### 1,000", "1000"),  # thousands comma removed
    ("#### -7", "-7"),  # leading minus kept
    ("#### 3.5", "3.5"),
    ("#### $42", "42"),  # dollar sign before the number
    ("####42", "42"),  # no space
    ("#### 4 then later #### 5", "5"),  # the last one wins
    ("#### 72.", "72"),  # trailing period is not part of the number
    ("the answer is 18", None),  # no marker: strict finds nothing
    ("#### ", None),
    ("####  abc", None),
]

FLEXIBLE_EXTRACT = [
    ("the answer is 18", "18"),
    ("3 apples and 4 pears, 7 total.", "7"),  # last number, trailing '.' dropped
    ("we owe -12 dollars", "-12"),
    ("1,234,567 grains", "1234567"),
    ("#### 9", "9"),
    ("no numbers here", None),
]


@pytest.mark.parametrize("text,expected", STRICT_EXTRACT)
def test_extract_strict(text, expected):
    assert gsm8k.extract_solution(text, method="strict") == expected


@pytest.mark.parametrize("text,expected", FLEXIBLE_EXTRACT)
def test_extract_flexible(text, expected):
    assert gsm8k.extract_solution(text, method="flexible") == expected


SCORES = [
    # (solution, ground_truth, method, expected)
    ("#### 18", "18", "strict", 1.0),
    ("#### 18.0", "18", "strict", 1.0),  # same decimal value
    ("#### 1,800", "1800", "strict", 1.0),
    ("#### 17", "18", "strict", 0.0),
    ("answer: 18", "18", "strict", 0.0),  # right number, no marker
    ("answer: 18", "18", "flexible", 1.0),
    ("18 is wrong, it is 19", "18", "flexible", 0.0),  # the last number counts
    ("#### -3", "-3", "strict", 1.0),
    ("#### 3", "-3", "strict", 0.0),
]


@pytest.mark.parametrize("solution,truth,method,expected", SCORES)
def test_compute_score_table(solution, truth, method, expected):
    assert gsm8k.compute_score(solution, truth, method=method) == expected


def test_format_score_and_score_values():
    # wrong answer but well formatted -> format_score; right -> score; none found -> 0
    assert gsm8k.compute_score("#### 5", "6", format_score=0.1, score=2.0) == 0.1
    assert gsm8k.compute_score("#### 6", "6", format_score=0.1, score=2.0) == 2.0
    assert gsm8k.compute_score("six", "6", format_score=0.1, score=2.0) == 0.0


def test_only_the_tail_is_searched():
    # An answer more than 300 characters before the end is out of reach (veRL's behaviour).
    far = "#### 18" + " filler" * 60
    assert len(far) - len("#### 18") > 300
    assert gsm8k.extract_solution(far) is None
    assert gsm8k.extract_solution("x" * 1000 + "#### 18") == "18"


def test_unknown_method_rejected():
    with pytest.raises(ValueError, match="strict"):
        gsm8k.extract_solution("#### 1", method="loose")
