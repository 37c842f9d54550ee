"""Rule-based scorers, chosen by a sample's ``data_source``.

A scorer is a pure function ``fn(solution_str, ground_truth, extra_info=None, **kwargs)`` returning a
float or a dict with ``"score"`` (and any extra fields worth logging). Users add their own with::

    from hybridflow.rewards.scorers import register_scorer

    @register_scorer("my_org/my_dataset")
    def my_score(solution_str, ground_truth, extra_info=None):
        return float(solution_str.strip() == ground_truth)

Lookup: an exact registered name first (veRL's: ``math``, ``math_dapo`` and every ``aime*`` are DAPO's +1/-1
math scorer, ``searchR1_*`` Search-R1's exact match), then (for the built-in families) any name containing
"gsm8k", "math", or a code data set marker, case-insensitively.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hybridflow.rewards.scorers import code_sandbox, gsm8k, math_dapo, qa_em
from hybridflow.rewards.scorers import math as math_score
from hybridflow.utils.registry import Registry

Scorer = Callable[..., Any]

SCORERS: Registry[Scorer] = Registry("reward scorer")


def register_scorer(name: str, *, override: bool = False):
    """Decorator registering ``fn(solution_str, ground_truth, extra_info=None, **kwargs)``."""
    return SCORERS.register(name, override=override)


def _gsm8k(solution_str, ground_truth, extra_info=None, **kwargs):
    return gsm8k.compute_score(solution_str, ground_truth, **kwargs)


def _math(solution_str, ground_truth, extra_info=None, **kwargs):
    return math_score.compute_score(solution_str, ground_truth, **kwargs)


def _code(solution_str, ground_truth, extra_info=None, **kwargs):
    return code_sandbox.compute_score(solution_str, ground_truth, extra_info=extra_info, **kwargs)


def _math_dapo(solution_str, ground_truth, extra_info=None, **kwargs):
    return math_dapo.compute_score(solution_str, ground_truth, **kwargs)


def _qa_em(solution_str, ground_truth, extra_info=None, **kwargs):
    return qa_em.compute_score(solution_str, ground_truth, **kwargs)


GSM8K_SOURCES = ("openai/gsm8k",)
MATH_SOURCES = ("lighteval/MATH", "DigitalLearningGmbH/MATH-lighteval", "HuggingFaceH4/MATH-500")
CODE_SOURCES = ("codecontests", "apps", "taco", "codeforces")
# veRL's DAPO math (+1/-1, the "Answer:" line) for these names and every name starting with "aime"
DAPO_MATH_SOURCES = ("math_dapo", "math", "math_dapo_reasoning")
QA_SOURCES = tuple(
    f"searchR1_{name}" for name in ("nq", "triviaqa", "popqa", "hotpotqa", "2wikimultihopqa", "musique", "bamboogle")
)

for _name in GSM8K_SOURCES:
    SCORERS.register(_name, _gsm8k)
for _name in MATH_SOURCES:
    SCORERS.register(_name, _math)
for _name in CODE_SOURCES:
    SCORERS.register(_name, _code)
for _name in DAPO_MATH_SOURCES:
    SCORERS.register(_name, _math_dapo)
for _name in QA_SOURCES:
    SCORERS.register(_name, _qa_em)

# (substring, registered name) tried in order when no exact name matches.
_FAMILY_MARKERS = (
    ("gsm8k", "openai/gsm8k"),
    ("math", "lighteval/MATH"),
    ("codecontests", "codecontests"),
    ("apps", "apps"),
    ("taco", "taco"),
    ("codeforces", "codeforces"),
    ("code", "codecontests"),
)


def get_scorer(data_source: str) -> Scorer:
    """The scorer for ``data_source``; NotImplementedError naming the known ones otherwise."""
    if data_source in SCORERS:
        return SCORERS[data_source]
    if str(data_source).startswith("aime"):  # aime24, aime_2025, ...: veRL scores them as DAPO math
        return SCORERS["math_dapo"]
    lowered = str(data_source).lower()
    for marker, name in _FAMILY_MARKERS:
        if marker in lowered:
            return SCORERS[name]
    markers = ", ".join(marker for marker, _ in _FAMILY_MARKERS)
    raise NotImplementedError(
        f"no reward scorer for data_source {data_source!r}; known: {', '.join(SCORERS.names())} "
        f"(also any name containing: {markers}). Register one with @register_scorer(name) or set "
        "custom_reward_function.path"
    )


def default_compute_score(
    data_source,
    solution_str,
    ground_truth,
    extra_info=None,
    sandbox_fusion_url=None,
    concurrent_semaphore=None,
    memory_limit_mb=None,
    **kwargs,
):
    """veRL's entry point: score one response. Numbers come back as float, dicts unchanged.

    ``sandbox_fusion_url`` (with ``concurrent_semaphore`` and ``memory_limit_mb``: veRL's arguments, bound from
    ``reward.sandbox_fusion``) sends the built-in code scorer's tests to that SandboxFusion service; the other
    scorers do not run code and ignore them, as veRL's do."""
    scorer = get_scorer(data_source)
    if sandbox_fusion_url and scorer is _code:
        kwargs.update(sandbox_fusion_url=sandbox_fusion_url, concurrent_semaphore=concurrent_semaphore)
        if memory_limit_mb is not None:
            kwargs["memory_mb"] = int(memory_limit_mb)
    result = scorer(solution_str, ground_truth, extra_info=extra_info, **kwargs)
    if isinstance(result, (bool, int, float)):
        return float(result)
    return result


# veRL spells it `_default_compute_score` in older releases.
_default_compute_score = default_compute_score

__all__ = [
    "SCORERS",
    "default_compute_score",
    "get_scorer",
    "register_scorer",
    "GSM8K_SOURCES",
    "MATH_SOURCES",
    "CODE_SOURCES",
    "DAPO_MATH_SOURCES",
    "QA_SOURCES",
]
