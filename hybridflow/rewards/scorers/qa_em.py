"""Search-R1's exact-match scorer (veRL's ``search_r1_like_qa_em``; data sources ``searchR1_nq``, ``_triviaqa``,
``_popqa``, ``_hotpotqa``, ``_2wikimultihopqa``, ``_musique``, ``_bamboogle``): the last ``<answer>...</answer>``
of the response against ``ground_truth["target"]`` (one answer or a list), both lower-cased without punctuation,
articles (a, an, the) and extra spaces. 1.0 for a match (0.25 when the response writes more than ten answer tags),
else 0.0. ``compute_score_subem``: a target contained in the answer is enough."""

from __future__ import annotations

import re
import string

__all__ = ["normalize_qa_answer", "extract_solution", "em_check", "subem_check", "compute_score", "compute_score_subem"]

_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = str.maketrans("", "", string.punctuation)


def normalize_qa_answer(text: str) -> str:
    return " ".join(_ARTICLES.sub(" ", str(text).lower().translate(_PUNCTUATION)).split())


normalize_answer = normalize_qa_answer  # veRL's name


def extract_solution(solution_str: str) -> str | None:
    """The last ``<answer>`` of the response, stripped (None without one)."""
    answers = _ANSWER.findall(str(solution_str))
    return answers[-1].strip() if answers else None


def _targets(golden) -> list[str]:
    golden = golden.get("target") if isinstance(golden, dict) else golden
    return [golden] if isinstance(golden, str) else list(golden if golden is not None else [])


def em_check(prediction: str, golden_answers) -> bool:
    return normalize_qa_answer(prediction) in {normalize_qa_answer(t) for t in _targets(golden_answers)}


def subem_check(prediction: str, golden_answers) -> bool:
    predicted = normalize_qa_answer(prediction)
    return any(normalize_qa_answer(t) in predicted for t in _targets(golden_answers))


def compute_score(
    solution_str: str, ground_truth, extra_info=None, format_score: float = 0.0, score: float = 1.0, **kw
):
    answer = extract_solution(solution_str)
    if answer is None:
        return 0.0
    if not em_check(answer, ground_truth):
        return float(format_score)
    text = str(solution_str)
    too_many_tags = text.count("<answer>") > 10 or text.count("</answer>") > 10
    return float(score) / 4 if too_many_tags else float(score)


def compute_score_subem(solution_str: str, ground_truth, format_score: float = 0.0, score: float = 1.0, **kw):
    answer = extract_solution(solution_str)
    if answer is None:
        return 0.0
    return float(score) if subem_check(answer, ground_truth) else float(format_score)
