"""The rule-based reward manager's shared part: decode each response, place its score on the last valid
response token, check the scores and log the examined samples. Subclasses (``NaiveRewardManager``,
``BatchRewardManager``, DAPO's, the generative judge's) produce the raw scores. The layout it reads is
described in ``hybridflow.rewards.manager``."""

from __future__ import annotations

import logging
import math
import numbers
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from hybridflow.rewards.bad_samples import (
    BAD_SAMPLES_METRIC,
    SampleScoreError,
    ScoreFailure,
    check_bad_sample_settings,
    scorer_failed_message,
)
from hybridflow.rewards.scorers import default_compute_score

logger = logging.getLogger(__name__)


class RewardComputationError(RuntimeError):
    """A scorer raised; the message names the sample and its data_source."""


# non_tensor_batch column of what ``compute_score`` gave each trajectory scored as it finished
# (``hybridflow.rewards.streaming``): ``(result,)``, or None for a row left to the manager's batch call
STREAMED_SCORES = "streamed_reward_scores"


class DecodedResponses(Sequence):
    """Each row's response text, decoded when first read: rows the reward pool already scored
    (``reward.num_workers``) are not decoded again on the driver."""

    def __init__(self, tokenizer, rows: list, lengths: list):
        self.tokenizer, self.rows, self.lengths = tokenizer, rows, lengths
        self.texts: list[str | None] = [None] * len(rows)

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        if self.texts[i] is None:
            self.texts[i] = self.tokenizer.decode(self.rows[i][: self.lengths[i]], skip_special_tokens=True)
        return self.texts[i]


def _as_score(index: int, data_source: Any, value: Any) -> float:
    """A finite float, or ValueError naming the sample and the offending value."""
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        value = value.item()
    if isinstance(value, np.generic) and value.shape == ():
        value = value.item()
    if not isinstance(value, numbers.Real):
        raise ValueError(
            f"sample {index} (data_source={data_source!r}): score {value!r} of type "
            f"{type(value).__name__} is not a number"
        )
    if not math.isfinite(float(value)):
        raise ValueError(f"sample {index} (data_source={data_source!r}): score {value!r} is not finite")
    return float(value)


def _column(data, key: str, what: str) -> np.ndarray:
    if key not in data.non_tensor_batch:
        known = ", ".join(sorted(data.non_tensor_batch)) or "(none)"
        raise KeyError(f"reward manager needs non_tensor_batch[{key!r}] ({what}); present: {known}")
    return data.non_tensor_batch[key]


_MAX_BAD_SAMPLE_WARNINGS = 10  # per call; the rest are counted in one line


class RuleRewardManager:
    """Shared decoding, score placement, validation and the examined samples; subclasses produce raw scores.

    ``bad_sample_score`` / ``score_timeout_s`` (``reward.*``, see ``hybridflow.rewards.bad_samples``): what a
    sample scores whose scorer raised, returned NaN/None or ran past the deadline (None: the call raises,
    naming the sample), and the deadline of one sample's scoring (None: none).

    ``streams``: a manager whose rows score independently (one ``compute_score`` call each) may have
    each trajectory scored as it finishes (``reward.num_workers``; ``score_rows`` there); ``__call__``
    then takes those results from the ``STREAMED_SCORES`` column and does the rest as for a batch."""

    streams = False
    default_score = staticmethod(default_compute_score)  # the scorer without reward.custom_reward_function

    def __init__(
        self,
        tokenizer,
        num_examine: int,
        compute_score: Callable | None = None,
        reward_fn_key: str = "data_source",
        bad_sample_score: float | None = None,
        score_timeout_s: float | None = 60.0,
        **reward_kwargs,
    ):
        check_bad_sample_settings(bad_sample_score, score_timeout_s)
        self.tokenizer = tokenizer
        self.num_examine = num_examine
        self.compute_score = compute_score or self.default_score
        self.reward_fn_key = reward_fn_key
        self.bad_sample_score = None if bad_sample_score is None else float(bad_sample_score)
        self.score_timeout_s = None if score_timeout_s is None else float(score_timeout_s)
        self.reward_kwargs = reward_kwargs

    def _scorer_failed(self, position: int, error: Exception) -> ScoreFailure:
        """A subclass's scorer failed on its ``position``-th sample: raise (the manager names the row),
        or, with ``bad_sample_score`` set, a marker that scores that."""
        if self.bad_sample_score is None:
            raise SampleScoreError(position, error) from error
        return ScoreFailure(error)

    def _score(self, data_sources, solution_strs, ground_truths, extra_infos) -> list:
        raise NotImplementedError

    def _score_rows(self, data, todo: list[int], data_sources, solution_strs, ground_truths, extra_infos) -> list:
        """The results of rows ``todo`` of ``data`` (a failure at position p raises ``SampleScoreError(p)`` or
        gives a ``ScoreFailure``); the rule managers score from the decoded fields."""
        pick = lambda values: [values[i] for i in todo]  # noqa: E731
        return self._score(pick(data_sources), pick(solution_strs), pick(ground_truths), pick(extra_infos))

    def __call__(self, data, return_dict: bool = False):
        streamed = data.non_tensor_batch.pop(STREAMED_SCORES, None)
        if "rm_scores" in data.batch.keys():  # a reward model already scored this batch
            scores = data.batch["rm_scores"]
            return {"reward_tensor": scores, "reward_extra_info": {}} if return_dict else scores

        prompts, responses = data.batch["prompts"], data.batch["responses"]  # (B, P), (B, R)
        prompt_lens, response_lens, data_sources, solution_strs, ground_truths, extra_infos = self._inputs(data)
        raw = self._score_missing(data, data_sources, solution_strs, ground_truths, extra_infos, streamed)
        batch_size = len(data)

        scores, extra_rows, bad = [], [], []
        for i, result in enumerate(raw):
            if isinstance(result, dict):
                if "score" not in result:
                    raise ValueError(
                        f"sample {i} (data_source={data_sources[i]!r}): dict result has no 'score': {result!r}"
                    )
                extra_rows.append(result)
                result = result["score"]
            else:
                extra_rows.append({})
            if isinstance(result, ScoreFailure):
                problem = scorer_failed_message(i, data_sources[i], result.error)
                if self.bad_sample_score is None:  # a streamed row's failure (a batch call raised already)
                    raise RewardComputationError(problem) from result.error
            else:
                try:
                    scores.append(_as_score(i, data_sources[i], result))
                    continue
                except ValueError as err:
                    if self.bad_sample_score is None:
                        raise
                    problem = str(err)
            scores.append(self.bad_sample_score)
            bad.append((i, problem))
        self._warn_bad(bad, solution_strs)

        # The score sits on the last valid response token; an empty response keeps it at position 0
        # so that sequence-level sums (GRPO) still see it.
        reward_tensor = torch.zeros(responses.shape, dtype=torch.float32)  # (B, R)
        last = torch.tensor([max(n - 1, 0) for n in response_lens], dtype=torch.long)
        reward_tensor[torch.arange(batch_size), last] = torch.tensor(scores, dtype=torch.float32)
        reward_tensor = reward_tensor.to(responses.device)

        self._examine(prompts, prompt_lens, solution_strs, ground_truths, data_sources, raw)
        if not return_dict:
            return reward_tensor
        keys = list(dict.fromkeys(k for row in extra_rows for k in row))
        extra = {k: [row.get(k) for row in extra_rows] for k in keys}
        out = {"reward_tensor": reward_tensor, "reward_extra_info": extra}
        if self.bad_sample_score is not None:
            out["reward_metrics"] = {BAD_SAMPLES_METRIC: float(len(bad))}
        return out

    def _warn_bad(self, bad: list, solution_strs: list) -> None:
        for i, problem in bad[:_MAX_BAD_SAMPLE_WARNINGS]:
            logger.warning(
                "bad sample: %s; response %r scores reward.bad_sample_score=%s",
                problem,
                solution_strs[i][:200],
                self.bad_sample_score,
            )
        if len(bad) > _MAX_BAD_SAMPLE_WARNINGS:
            logger.warning(
                "bad sample: %d more in this batch (samples %s) score reward.bad_sample_score=%s",
                len(bad) - _MAX_BAD_SAMPLE_WARNINGS,
                [i for i, _ in bad[_MAX_BAD_SAMPLE_WARNINGS:]],
                self.bad_sample_score,
            )

    def _inputs(self, data) -> tuple[list, list, list, list, list, list]:
        """Per row: prompt length, response length, data_source, decoded response, ground truth and the
        ``extra_info`` the reward function gets."""
        prompt_len = data.batch["prompts"].shape[-1]
        mask = data.batch["attention_mask"]  # (B, P+R)
        prompt_lens = mask[:, :prompt_len].sum(-1).tolist()
        response_lens = mask[:, prompt_len:].sum(-1).tolist()
        response_rows = data.batch["responses"].tolist()
        reward_models = _column(data, "reward_model", "holds ground_truth")
        solution_strs = DecodedResponses(self.tokenizer, response_rows, response_lens)
        ground_truths = [reward_models[i]["ground_truth"] for i in range(len(data))]
        extra_infos = rollout_extra_infos(data, data.non_tensor_batch.get("extra_info"))
        data_sources = list(_column(data, self.reward_fn_key, "the scorer key"))
        return prompt_lens, response_lens, data_sources, solution_strs, ground_truths, extra_infos

    def score_rows(self, data) -> list:
        """What the reward function gives each row (a failure as a ``ScoreFailure``, whatever
        ``bad_sample_score`` says: the manager that assembles the batch decides): the reward loop's call
        on one finished trajectory."""
        _, _, data_sources, solution_strs, ground_truths, extra_infos = self._inputs(data)
        try:
            return self._score_missing(data, data_sources, solution_strs, ground_truths, extra_infos)
        except RewardComputationError as err:  # one row: the scorer raised on it
            return [ScoreFailure(err.__cause__ or err)]

    def _score_missing(self, data, data_sources, solution_strs, ground_truths, extra_infos, streamed=None) -> list:
        """Scores for every row: the agent loop's ``reward_score`` where it gave one, the streamed result
        where the row was scored as it finished, the reward function's for the rest (called once, on
        those rows only)."""
        given = data.non_tensor_batch.get("reward_score")
        raw = [None if given is None else given[i] for i in range(len(data_sources))]
        todo = [i for i in range(len(data_sources)) if raw[i] is None and (streamed is None or streamed[i] is None)]
        for i, result in enumerate(streamed if streamed is not None else []):
            if result is not None:
                raw[i] = result[0]
        try:
            fields = (data_sources, solution_strs, ground_truths, extra_infos)
            scored = self._score_rows(data, todo, *fields) if todo else []
        except SampleScoreError as err:
            row = todo[err.position]
            raise RewardComputationError(scorer_failed_message(row, data_sources[row], err.cause)) from err.cause
        if len(scored) != len(todo):
            raise ValueError(f"compute_score returned {len(scored)} scores for a batch of {len(todo)}")
        for i, result in zip(todo, scored):
            raw[i] = result
        return raw

    def _examine(self, prompts, prompt_lens, solution_strs, ground_truths, data_sources, raw) -> None:
        """Log up to ``num_examine`` samples per data_source at INFO (veRL's console check)."""
        shown: dict = defaultdict(int)
        prompt_len = prompts.shape[-1]
        for i, source in enumerate(data_sources):
            if shown[source] >= self.num_examine:
                continue
            shown[source] += 1
            ids = prompts[i, prompt_len - prompt_lens[i] :].tolist()
            logger.info("[prompt] %s", self.tokenizer.decode(ids, skip_special_tokens=True))
            logger.info("[response] %s", solution_strs[i])
            logger.info("[ground_truth] %s", ground_truths[i])
            for key, value in raw[i].items() if isinstance(raw[i], dict) else [("score", raw[i])]:
                logger.info("[%s] %s", key, value)


def rollout_extra_infos(data, extra_col) -> list:
    """Each row's ``extra_info`` for the reward function: the dataset's, plus (as a new dict, the
    dataset's stays untouched) what the rollout recorded: ``tool_extra_fields`` and ``num_turns``."""
    tool_fields = data.non_tensor_batch.get("tool_extra_fields")
    turns = data.non_tensor_batch.get("num_turns")
    out = []
    for i in range(len(data)):
        info = None if extra_col is None else extra_col[i]
        if tool_fields is not None or turns is not None:
            info = dict(info or {})
            if tool_fields is not None and tool_fields[i]:
                info.update(tool_fields[i])
            if turns is not None:
                info["num_turns"] = int(turns[i])
        out.append(info)
    return out
