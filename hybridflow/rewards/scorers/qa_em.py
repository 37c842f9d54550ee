"""Search-R1's exact-match scorer (veRL's ``search_r1_like_qa_em``; data sources ``searchR1_nq``, ``_triviaqa``,
``_popqa``, ``_hotpotqa``, ``_2wikimultihopqa``, ``_musique``, ``_bamboogle``): the last ``<answer>...</answer>``
of the response against ``ground_truth["target"]`` (one answer or a list), both lower-cased without punctuation,
articles (a, an, the) and extra spaces. 1.0 for a match (0.25 when the response writes more than ten answer tags),
else 0.0."""

from __future__ import annotations

import re
import string

__all__ = ["normalize_qa_answer", "compute_score"]

_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = str.maketrans("", "", string.punctuation)


def normalize_qa_answer(text: str) -> str:
    return " ".join(_ARTICLES.sub(" ", str(text).lower().translate(_PUNCTUATION)).split())


def compute_score(solution_str: str, ground_truth, extra_info=None, **kwargs) -> float:
    answers = _ANSWER.findall(str(solution_str))
    if not answers:
        return 0.0
    targets = ground_truth.get("target") if isinstance(ground_truth, dict) else ground_truth
    targets = [targets] if isinstance(targets, str) else list(targets if targets is not None else [])
    predicted = normalize_qa_answer(answers[-1].strip())
    if predicted not in {normalize_qa_answer(t) for t in targets}:
        return 0.0
    too_many_tags = str(solution_str).count("<answer>") > 10 or str(solution_str).count("</answer>") > 10
    return 0.25 if too_many_tags else 1.0
