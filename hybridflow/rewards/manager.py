"""Reward managers: decode each response, score it with a rule function, and place the score on the
response's last valid token (veRL's ``token_level_scores`` layout).

Layout read from the DataProto (see the contracts): batch['prompts'] (B, P) left-padded,
batch['responses'] (B, R) right-padded, batch['attention_mask'] (B, P+R) whose response part is 1 on
every real response token (a multi-turn response includes its tool / user turns, decoded with it, as
in veRL). non_tensor_batch: ``reward_fn_key`` (data_source), reward_model ({"ground_truth": ...}),
optionally extra_info.

The registry of the managers by name (``load_reward_manager``) is ``hybridflow.rewards.registry``; the shared
part of these rule-based managers is ``hybridflow.rewards.rule_manager``.

Scores an agent loop produced (veRL's contract): a sample whose ``reward_score`` is set keeps that
score as is (the reward function is not called for it); turn-level scores travel in
``tool_extra_fields`` (``turn_scores``, ``tool_rewards``, ...) and, with ``num_turns``, are merged
into a copy of the sample's ``extra_info`` that the reward function receives.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from hybridflow.rewards.bad_samples import DeadlineCaller, ScoreFailure
from hybridflow.rewards.rule_manager import RewardComputationError, RuleRewardManager
from hybridflow.rewards.scorers import default_compute_score


class NaiveRewardManager(RuleRewardManager):
    """One ``compute_score(data_source=, solution_str=, ground_truth=, extra_info=)`` call per row."""

    streams = True

    def _score(self, data_sources, solution_strs, ground_truths, extra_infos) -> list:
        call, out = DeadlineCaller(self.score_timeout_s), []
        try:
            for i, (source, text, truth, extra) in enumerate(
                zip(data_sources, solution_strs, ground_truths, extra_infos)
            ):
                try:
                    out.append(
                        call(
                            self.compute_score,
                            data_source=source,
                            solution_str=text,
                            ground_truth=truth,
                            extra_info=extra,
                            **self.reward_kwargs,
                        )
                    )
                except Exception as err:
                    out.append(self._scorer_failed(i, err))
        finally:
            call.close()
        return out


def _default_batch_score(data_sources, solution_strs, ground_truths, extra_infos, **kwargs) -> list:
    return [
        default_compute_score(s, t, g, e, **kwargs)
        for s, t, g, e in zip(data_sources, solution_strs, ground_truths, extra_infos)
    ]


class BatchRewardManager(RuleRewardManager):
    """One ``compute_score(data_sources=, solution_strs=, ground_truths=, extra_infos=)`` call per
    batch, for scorers that batch (an LLM judge, a remote sandbox); returns one result per row."""

    default_score = staticmethod(_default_batch_score)

    def __init__(
        self,
        tokenizer,
        num_examine: int,
        compute_score: Callable | None = None,
        reward_fn_key: str = "data_source",
        **reward_kwargs,
    ):
        super().__init__(tokenizer, num_examine, compute_score, reward_fn_key, **reward_kwargs)

    def _score(self, data_sources, solution_strs, ground_truths, extra_infos) -> list:
        """One call for the batch, under a deadline of ``score_timeout_s`` per sample; when it raises or
        runs past it, no sample has a score: each is a bad sample (or the call raises, by default)."""
        timeout = None if self.score_timeout_s is None else self.score_timeout_s * max(len(data_sources), 1)
        call = DeadlineCaller(timeout, what="batch compute_score")
        try:
            return list(
                call(
                    self.compute_score,
                    data_sources=data_sources,
                    solution_strs=solution_strs,
                    ground_truths=ground_truths,
                    extra_infos=extra_infos,
                    **self.reward_kwargs,
                )
            )
        except Exception as err:
            if self.bad_sample_score is not None:
                return [ScoreFailure(err)] * len(data_sources)
            sources = sorted(set(map(str, data_sources)))
            raise RewardComputationError(
                f"batch compute_score failed on {len(data_sources)} samples (data_sources={sources}): "
                f"{type(err).__name__}: {err}"
            ) from err
        finally:
            call.close()


def reward_metrics(rewards: torch.Tensor | Sequence[float], data_sources: Sequence[Any]) -> dict[str, float]:
    """Mean sequence score per data_source: {"reward/<data_source>/mean": float}.

    ``rewards`` is a token-level (B, R) tensor (summed over tokens) or one score per row.
    """
    if isinstance(rewards, torch.Tensor):
        rewards = rewards.sum(-1) if rewards.dim() == 2 else rewards
        values = np.asarray(rewards.detach().float().cpu().tolist(), dtype=np.float64)
    else:
        values = np.asarray(rewards, dtype=np.float64)
    sources = np.asarray([str(s) for s in data_sources], dtype=object)
    if values.shape != sources.shape:
        raise ValueError(f"{values.shape[0]} rewards but {sources.shape[0]} data_sources")
    return {f"reward/{s}/mean": float(values[sources == s].mean()) for s in sorted(set(sources))}


class RemoteRewardManager(NaiveRewardManager):
    """veRL 0.9's ``remote`` manager: the naive manager's calls, made in separate processes so that a scorer
    that misbehaves in threads (math-verify) or loads the CPU does not stall the loop. hybridflow's reward pool
    (``reward.num_workers`` processes, each trajectory scored as it finishes) is that; this name requires it
    (the config check refuses reward.num_workers=0 with it)."""
