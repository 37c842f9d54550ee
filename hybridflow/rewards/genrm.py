"""Generative reward model (``reward.reward_manager.name=genrm``): an LLM judge grades each response.

For every sample the manager fills the judge's prompt template with the question, the decoded
response and the ground truth (what veRL's reward loop passes a GenRM reward function), the judge
generates a verdict, and a registered parser reads it into the score. veRL leaves these three steps
to a user's reward function that posts to the reward model's HTTP router; here they are one manager
whose parts are chosen by ``reward.reward_kwargs``:

    template / template_path   the prompt (``judge_template.py``; default: a 0/1 grading prompt)
    parser                     a registered verdict parser (``verdict_parsers.py``; default: boxed)
    unparsable_score           the score of a verdict the parser cannot read (default 0.0, as veRL's
                               GenRM example scores a failed parse) and of a prompt too long for the judge
    chat_template              send the prompt as one user message in the judge tokenizer's chat
                               template (default true, as veRL's example sends a chat request) or as
                               raw text (false: a base model completing the template)

The judge itself is any ``judge(prompts: list[str], chat_template: bool) -> list[str | None]`` (None: the
prompt does not fit the judge's ``rollout.prompt_length``). The trainer serves ``reward.reward_model.model_path`` on a
rollout engine (hf or vllm) and attaches a judge that talks to it (``attach_judge``); the manager
never asks how. Each call's counts are in ``last_metrics`` (``genrm/*``), which the trainer logs.

The question is ``extra_info["question"]`` when the dataset has one (veRL's GSM8K/MATH preprocessing
writes it), else the last user message of ``raw_prompt``, else the decoded prompt.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from hybridflow.rewards.judge_template import load_template
from hybridflow.rewards.rule_manager import RuleRewardManager
from hybridflow.rewards.verdict_parsers import get_verdict_parser

logger = logging.getLogger(__name__)

Judge = Callable[..., Sequence[str | None]]  # judge(prompts, chat_template=bool)


class JudgeNotAttachedError(RuntimeError):
    """The genrm manager was asked to score before the trainer attached a judge."""


class GenRMRewardManager(RuleRewardManager):
    """Scores = parser(judge(template(question, response, ground_truth))); see the module docstring."""

    needs_judge = True  # the trainer serves reward.reward_model on a rollout engine for this manager

    def __init__(
        self,
        tokenizer,
        num_examine: int,
        compute_score: Callable | None = None,
        reward_fn_key: str = "data_source",
        template: str | None = None,
        template_path: str | None = None,
        parser: str = "boxed",
        unparsable_score: float = 0.0,
        chat_template: bool = True,
        judge: Judge | None = None,
        bad_sample_score: float | None = None,
        score_timeout_s: float | None = 60.0,
        **unknown,
    ):
        if compute_score is not None:
            raise ValueError(
                "reward.reward_manager.name=genrm scores with the judge; reward.custom_reward_function."
                "path must be null (use another reward manager for a rule-based custom function)"
            )
        if unknown:
            raise ValueError(
                f"reward.reward_kwargs.{sorted(unknown)[0]} is not a setting of the genrm reward manager "
                "(its settings: template, template_path, parser, unparsable_score, chat_template)"
            )
        super().__init__(  # the judge's own deadlines are the workers'; score_timeout_s does not reach it
            tokenizer,
            num_examine,
            compute_score=None,
            reward_fn_key=reward_fn_key,
            bad_sample_score=bad_sample_score,
            score_timeout_s=score_timeout_s,
        )
        self.template = load_template(template, template_path)
        self.parser_name = str(parser)
        self.parse = get_verdict_parser(self.parser_name)
        self.unparsable_score = float(unparsable_score)
        self.chat_template = bool(chat_template)
        self.judge = judge
        self.last_metrics: dict[str, float] = {}

    def attach_judge(self, judge: Judge) -> None:
        self.judge = judge

    def __call__(self, data, return_dict: bool = False):
        self.last_metrics = {}
        out = super().__call__(data, return_dict=True)
        if not return_dict:
            return out["reward_tensor"]
        out["reward_metrics"] = {**out.get("reward_metrics", {}), **self.last_metrics}
        return out

    def _score_missing(self, data, data_sources, solution_strs, ground_truths, extra_infos, streamed=None) -> list:
        questions = judge_questions(data, extra_infos, self.tokenizer)
        with_question = [{**(info or {}), "question": q} for info, q in zip(extra_infos, questions)]
        return super()._score_missing(data, data_sources, solution_strs, ground_truths, with_question, streamed)

    def _score(self, data_sources, solution_strs, ground_truths, extra_infos) -> list:
        if self.judge is None:
            raise JudgeNotAttachedError(
                "the genrm reward manager has no judge: it needs reward.reward_model.enable=True, "
                "reward.reward_model.model_path and reward.reward_model.rollout.name (hf or vllm), and the trainer "
                "attaches the judge when its workers start (outside the trainer, pass judge= or call attach_judge)"
            )
        prompts = [
            self.template.fill(info["question"], text, truth)
            for info, text, truth in zip(extra_infos, solution_strs, ground_truths)
        ]
        verdicts = list(self.judge(prompts, chat_template=self.chat_template))
        if len(verdicts) != len(prompts):
            raise ValueError(f"the judge returned {len(verdicts)} verdicts for {len(prompts)} prompts")
        results, unparsable, too_long = [], 0, 0
        for verdict in verdicts:
            value = None if verdict is None else self.parse(verdict)
            too_long += verdict is None
            unparsable += verdict is not None and value is None
            results.append(
                {
                    "score": self.unparsable_score if value is None else float(value),
                    "genrm_parsed": float(value is not None),
                    "genrm_verdict": "" if verdict is None else verdict,
                }
            )
        if unparsable or too_long:
            logger.warning(
                "genrm: %d of %d verdicts unparsable by parser %r, %d prompts too long for the judge; they score %s",
                unparsable,
                len(prompts),
                self.parser_name,
                too_long,
                self.unparsable_score,
            )
        n = max(len(prompts), 1)
        self.last_metrics = {
            "genrm/judged": float(len(prompts)),
            "genrm/unparsable": float(unparsable),
            "genrm/unparsable_ratio": unparsable / n,
            "genrm/prompt_too_long": float(too_long),
        }
        return results


def judge_questions(data, extra_infos, tokenizer) -> list[str]:
    """Per row: extra_info["question"], else the last user message of raw_prompt, else the decoded prompt."""
    raw = data.non_tensor_batch.get("raw_prompt")
    prompts = data.batch["prompts"]
    prompt_mask = data.batch["attention_mask"][:, : prompts.shape[-1]].bool()
    out = []
    for i, info in enumerate(extra_infos):
        if isinstance(info, dict) and info.get("question") is not None:
            out.append(str(info["question"]))
            continue
        messages = list(raw[i]) if raw is not None and raw[i] is not None else []
        user = [m.get("content") for m in messages if isinstance(m, dict) and m.get("role") == "user"]
        if user and isinstance(user[-1], str):
            out.append(user[-1])
            continue
        out.append(tokenizer.decode(prompts[i][prompt_mask[i]].tolist(), skip_special_tokens=True))
    return out
