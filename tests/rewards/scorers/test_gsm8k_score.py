"""GSM8K scorer: veRL 0.9.1's rules by default (strict: '#### ' + [-]digits/./, ; flexible: the last
such run; string equality with the ground truth), the forgiving parser only with lenient=True."""

import pytest

from hybridflow.data import tiny_task
from hybridflow.rewards.scorers import default_compute_score, gsm8k

# (text, expected) under veRL's strict rule: '#### ' then one space then [-][0-9.,]+, commas removed.
STRICT_EXTRACT = [
    ("so the total is 18.\n#### 18", "18"),
    ("#### 1,000", "1000"),  # thousands comma removed
    ("#### -7", "-7"),  # leading minus kept
    ("#### 3.5", "3.5"),
    ("#### 4 then later #### 5", "5"),  # the last one wins
    ("#### 72.", "72."),  # the character class holds '.', so a trailing period stays
    ("#### 4.00", "4.00"),
    ("#### $42", None),  # '$' is not in the class
    ("####42", None),  # no space
    ("####  42", None),  # two spaces
    ("the answer is 18", None),  # no marker: strict finds nothing
    ("#### ", None),
    ("####  abc", None),
]

# flexible: the last run of [-][0-9.,]+ that is not a lone '.'; commas are kept.
FLEXIBLE_EXTRACT = [
    ("the answer is 18", "18"),
    ("3 apples and 4 pears, 7 total.", "7"),  # the lone '.' after 'total' is skipped
    ("so in total: 7.", "7."),  # the run is '7.' (veRL keeps the period)
    ("it is 7, right", "7,"),  # ... and a trailing comma
    ("we owe -12 dollars", "-12"),
    ("1,234,567 grains", "1,234,567"),  # commas kept in flexible mode
    ("#### 9", "9"),
    ("no numbers here", None),
    ("dots . only .", "."),  # every run is '.': veRL's loop ends on the first one
]


@pytest.mark.parametrize("text,expected", STRICT_EXTRACT)
def test_extract_strict(text, expected):
    assert gsm8k.extract_solution(text, method="strict") == expected


@pytest.mark.parametrize("text,expected", FLEXIBLE_EXTRACT)
def test_extract_flexible(text, expected):
    assert gsm8k.extract_solution(text, method="flexible") == expected


SCORES = [
    # (solution, ground_truth, method, expected) -- veRL: string equality with the ground truth
    ("#### 18", "18", "strict", 1.0),
    ("#### 1,800", "1800", "strict", 1.0),
    ("#### 18.0", "18", "strict", 0.0),  # '18.0' != '18'
    ("#### 4.00", "4", "strict", 0.0),
    ("#### $4", "4", "strict", 0.0),  # nothing extracted
    ("####4", "4", "strict", 0.0),
    ("#### 72.", "72", "strict", 0.0),  # '72.' != '72'
    ("#### 17", "18", "strict", 0.0),
    ("answer: 18", "18", "strict", 0.0),  # right number, no marker
    ("answer: 18", "18", "flexible", 1.0),
    ("the answer is 1,000", "1000", "flexible", 0.0),  # commas kept in flexible mode
    ("the answer is 18.", "18", "flexible", 0.0),  # trailing period kept
    ("18 is wrong, it is 19", "18", "flexible", 0.0),  # the last number counts
    ("#### -3", "-3", "strict", 1.0),
    ("#### 3", "-3", "strict", 0.0),
    ("#### 18", 18, "strict", 0.0),  # a non-string ground truth never equals the extracted string
]


@pytest.mark.parametrize("solution,truth,method,expected", SCORES)
def test_compute_score_table(solution, truth, method, expected):
    assert gsm8k.compute_score(solution, truth, method=method) == expected


LENIENT_SCORES = [
    # the forgiving parser, only on request
    ("#### $4", "4", "strict", 1.0),
    ("####4", "4", "strict", 1.0),
    ("#### 4.00", "4", "strict", 1.0),
    ("#### 72.", "72", "strict", 1.0),
    ("the answer is 1,000", "1000", "flexible", 1.0),
    ("the answer is 18.", "18", "flexible", 1.0),
    ("#### 17", "18", "strict", 0.0),
]


@pytest.mark.parametrize("solution,truth,method,expected", LENIENT_SCORES)
def test_lenient_is_an_explicit_opt_in(solution, truth, method, expected):
    assert gsm8k.compute_score(solution, truth, method=method, lenient=True) == expected
    # the same keyword reaches the scorer through default_compute_score (reward_kwargs)
    assert default_compute_score("openai/gsm8k", solution, truth, method=method, lenient=True) == expected


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
    # veRL asserts; ours is both a ValueError and an AssertionError
    with pytest.raises(ValueError, match="strict"):
        gsm8k.extract_solution("#### 1", method="loose")
    with pytest.raises(AssertionError):
        gsm8k.extract_solution("#### 1", method="loose")


@pytest.mark.parametrize("style", ["direct", "steps"])
def test_tiny_task_answers_score_right_by_default(style):
    # The quickstart's own data: every worked solution scores 1 against its ground truth with the
    # default (veRL) scorer; a wrong number scores 0.
    train, test = tiny_task.generate_splits(seed=3, train_size=64, test_size=16, style=style)
    rows = train + test
    for row in rows:
        solution, truth = row["extra_info"]["answer"], row["reward_model"]["ground_truth"]
        assert default_compute_score(row["data_source"], solution, truth) == 1.0, solution
        assert default_compute_score(row["data_source"], solution, str(int(truth) + 1)) == 0.0
