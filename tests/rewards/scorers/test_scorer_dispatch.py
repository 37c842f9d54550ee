"""default_compute_score: data_source -> scorer dispatch, user registration, result types."""

import json

import pytest

from hybridflow.rewards import scorers
from hybridflow.rewards.scorers import default_compute_score, get_scorer, register_scorer

ROUTES = [
    # (data_source, solution, ground_truth, expected) - the solution only scores 1 under the right scorer
    ("openai/gsm8k", "#### 4", "4", 1.0),
    ("my_gsm8k_copy", "#### 4", "4", 1.0),  # name containing gsm8k
    ("lighteval/MATH", "\\boxed{4}", "4", 1.0),
    ("DigitalLearningGmbH/MATH-lighteval", "\\boxed{4}", "4", 1.0),
    ("HuggingFaceH4/MATH-500", "\\boxed{4}", "4", 1.0),
    ("my-math-set", "\\boxed{4}", "4", 1.0),  # name containing math
    ("openai/gsm8k", "\\boxed{4}", "4", 0.0),  # gsm8k does not read boxes
    ("lighteval/MATH", "#### 4", "4", 0.0),  # MATH does not read '####'
]


@pytest.mark.parametrize("source,solution,truth,expected", ROUTES)
def test_routes(source, solution, truth, expected):
    assert default_compute_score(source, solution, truth) == expected


@pytest.mark.parametrize("source", ["codecontests", "apps", "taco", "deepmind/code_contests", "my_code_set"])
def test_code_sources_use_the_sandbox(source):
    assert get_scorer(source) is scorers.SCORERS["codecontests"]


def test_code_route_runs_code():
    truth = json.dumps({"inputs": ["2\n"], "outputs": ["4\n"]})
    result = default_compute_score("codecontests", "```python\nprint(int(input())*2)\n```", truth, timeout_s=2.0)
    assert isinstance(result, dict) and result["score"] == 1.0 and result["passed"] == 1


def test_unknown_source_names_it_and_the_known_ones():
    with pytest.raises(NotImplementedError) as info:
        default_compute_score("acme/riddles", "x", "y")
    msg = str(info.value)
    assert "acme/riddles" in msg and "openai/gsm8k" in msg and "lighteval/MATH" in msg


def test_register_scorer_and_duplicate():
    name = "tests/exact_match_scorer"

    @register_scorer(name)
    def exact(solution_str, ground_truth, extra_info=None, bonus=0):
        return {"score": float(solution_str == ground_truth) + bonus, "extra": extra_info}

    try:
        assert default_compute_score(name, "a", "a") == {"score": 1.0, "extra": None}
        assert default_compute_score(name, "a", "b", extra_info={"k": 1}, bonus=2) == {"score": 2.0, "extra": {"k": 1}}
        register_scorer(name)(exact)  # the same function again is fine (veRL's registries allow it)
        with pytest.raises(ValueError, match="has already been registered"):
            register_scorer(name)(lambda solution_str, ground_truth, extra_info=None: 0.0)
    finally:
        scorers.SCORERS._entries.pop(name)


def test_bool_and_int_results_become_float():
    name = "tests/bool_scorer"
    register_scorer(name)(lambda solution_str, ground_truth, extra_info=None: solution_str == ground_truth)
    try:
        out = default_compute_score(name, "a", "a")
        assert out == 1.0 and type(out) is float
    finally:
        scorers.SCORERS._entries.pop(name)
