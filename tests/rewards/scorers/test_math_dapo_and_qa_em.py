"""veRL's DAPO math scorer (data sources math, math_dapo, math_dapo_reasoning, aime*) and Search-R1's exact match
(searchR1_*): the expected scores are worked out by hand from the rules in each module's docstring."""

import pytest

from hybridflow.rewards.scorers import default_compute_score, get_scorer
from hybridflow.rewards.scorers.math_dapo import compute_score, minerva_normalize
from hybridflow.rewards.scorers.qa_em import normalize_qa_answer


@pytest.mark.parametrize(
    "raw, normalized",
    [
        ("x = 3", "3"),  # the part after the last '='
        ("5 dollars", "5"),  # units removed
        ("1,000", "1000"),  # thousands separators of a plain number
        ("\\frac12", "\\frac{1}{2}"),  # shorthand written out
        ("\\sqrt2", "\\sqrt{2}"),
        ("$\\text{(B)}$", "(B)"),  # the dollar span, \text unwrapped
        ("\\boxed{7}", "7"),
        ("90^\\circ", "90"),
    ],
)
def test_minerva_normalisation_by_hand(raw, normalized):
    assert minerva_normalize(raw) == normalized


def test_dapo_scores_plus_one_or_minus_one_from_the_answer_line_or_the_last_box():
    assert compute_score("Work...\nAnswer: 1,000", "1000") == {"score": 1.0, "acc": True, "pred": "1000"}
    assert compute_score("Answer: 12\nno wait\nAnswer: 13", "13")["score"] == 1.0  # the last answer line
    assert compute_score("Answer: 12", "13") == {"score": -1.0, "acc": False, "pred": "12"}
    # no answer line: the last box of the tail, compared as written
    assert compute_score("so the result is \\boxed{\\frac{1}{2}}", "\\frac{1}{2}")["score"] == 1.0
    assert compute_score("nothing to read", "4") == {"score": -1.0, "acc": False, "pred": "[INVALID]"}
    # only the last 300 characters are read
    assert compute_score("Answer: 4\n" + "x" * 300, "4")["score"] == -1.0
    # strict: the box only, even with an answer line
    assert compute_score("Answer: 4 \\boxed{5}", "5", strict_box_verify=True)["score"] == 1.0


@pytest.mark.parametrize("source", ["math", "math_dapo", "math_dapo_reasoning", "aime2024", "aime_2025"])
def test_veRLs_dapo_sources_use_the_dapo_scorer(source):
    # the MATH scorer (boxed, 0/1) would give 1.0 here; DAPO reads the answer line and gives -1.0
    assert default_compute_score(source, "Answer: 3 \\boxed{4}", "4")["score"] == -1.0
    assert default_compute_score(source, "Answer: 4", "4")["score"] == 1.0
    assert get_scorer("lighteval/MATH") is not get_scorer(source)


def test_search_r1_exact_match():
    truth = {"target": ["Eiffel Tower", "la tour Eiffel"]}
    assert normalize_qa_answer("  The Eiffel-Tower! ") == "eiffeltower"
    assert normalize_qa_answer("the  Eiffel Tower.") == "eiffel tower"
    last_wins = "<answer>wrong</answer><answer>The Eiffel Tower.</answer>"
    assert default_compute_score("searchR1_nq", last_wins, truth) == 1.0
    assert default_compute_score("searchR1_hotpotqa", "<answer>Louvre</answer>", truth) == 0.0
    assert default_compute_score("searchR1_triviaqa", "The Eiffel Tower", truth) == 0.0  # no answer tags
    spam = "<answer>x</answer>" * 11 + "<answer>Eiffel Tower</answer>"
    assert default_compute_score("searchR1_bamboogle", spam, truth) == 0.25


def test_veRLs_module_paths_serve_these_scorers(tmp_path):
    # a reward file written for veRL (its imports) loads with hybridflow's scorers behind veRL's module names
    from hybridflow.rewards.custom import get_custom_reward_fn

    path = tmp_path / "mine.py"
    path.write_text(
        "from verl.utils.reward_score import math_dapo\n"
        "from verl.utils.reward_score.search_r1_like_qa_em import compute_score_subem\n"
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    if data_source == 'qa':\n"
        "        return compute_score_subem(solution_str, {'target': ground_truth})\n"
        "    return math_dapo.compute_score(solution_str, ground_truth)['score']\n"
    )
    score = get_custom_reward_fn(str(path))
    assert score("qa", "<answer>it is Paris, France</answer>", "paris") == 1.0  # the target inside the answer
    assert score("math", "Answer: 7", "7") == 1.0 and score("math", "Answer: 8", "7") == -1.0
