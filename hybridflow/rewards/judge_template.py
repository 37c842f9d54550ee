"""The prompt a generative reward model (an LLM judge) reads for one sample.

A template is plain text with up to three placeholders, ``{question}``, ``{response}`` and
``{ground_truth}`` (what veRL's reward loop hands a reward function: the question from the sample's
``extra_info``, the decoded response, ``reward_model.ground_truth``). Any other brace is literal text,
so a template can ask for ``\\boxed{}`` without escaping. Filling is one pass: a response that itself
contains ``{ground_truth}`` stays as written and never pulls the reference answer into the prompt.
"""

from __future__ import annotations

import re

PLACEHOLDERS = ("question", "response", "ground_truth")
_PLACEHOLDER = re.compile(r"\{(" + "|".join(PLACEHOLDERS) + r")\}")

DEFAULT_TEMPLATE = (
    "You are grading a student's answer.\n"
    "Question: {question}\n"
    "Reference answer: {ground_truth}\n"
    "Student answer: {response}\n"
    "Reply with 1 if the student answer is correct and 0 if it is not, as \\boxed{1} or \\boxed{0}."
)


class JudgeTemplate:
    """``fill(question, response, ground_truth)`` -> the judge's prompt text."""

    def __init__(self, text: str | None = None):
        text = DEFAULT_TEMPLATE if text is None else text
        if not isinstance(text, str) or not text.strip():
            raise ValueError(f"reward.reward_kwargs.template must be non-empty text, got {text!r}")
        if "{response}" not in text:
            raise ValueError(
                "reward.reward_kwargs.template has no {response} placeholder: the judge would never see "
                f"the response it grades (placeholders: {', '.join('{' + p + '}' for p in PLACEHOLDERS)})"
            )
        self.text = text

    def fill(self, question: str, response: str, ground_truth) -> str:
        values = {
            "question": str(question),
            "response": str(response),
            "ground_truth": "" if ground_truth is None else str(ground_truth),
        }
        return _PLACEHOLDER.sub(lambda m: values[m.group(1)], self.text)


def load_template(template: str | None = None, template_path: str | None = None) -> JudgeTemplate:
    """The template given as text, read from a file, or the default; both at once is an error."""
    if template is not None and template_path is not None:
        raise ValueError("set one of reward.reward_kwargs.template and reward.reward_kwargs.template_path")
    if template_path is not None:
        with open(template_path, encoding="utf-8") as f:
            return JudgeTemplate(f.read())
    return JudgeTemplate(template)
