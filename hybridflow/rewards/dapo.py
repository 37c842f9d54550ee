"""DAPO's reward manager (``reward.reward_manager.name=dapo``): the rule score plus the overlong penalty.

veRL's keys: ``reward.reward_kwargs.max_resp_len`` and ``reward.reward_kwargs.overlong_buffer_cfg``
(``enable``, ``len``, ``penalty_factor``, ``log``). A response longer than ``max_resp_len - len`` tokens
loses ``penalty_factor`` × (how far into the buffer it reaches) / ``len``, linearly up to
``penalty_factor`` at ``max_resp_len``, so the policy learns to finish before truncation.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from hybridflow.rewards.manager import NaiveRewardManager


def overlong_penalty(
    response_lengths: torch.Tensor, max_resp_len: int, buffer_len: int, penalty_factor: float
) -> torch.Tensor:
    """min(-(L - (max_resp_len - buffer_len)) / buffer_len × penalty_factor, 0) per response length L."""
    exceed = response_lengths.to(torch.float32) - (max_resp_len - buffer_len)
    return torch.clamp(-exceed / buffer_len * penalty_factor, max=0.0)


class DAPORewardManager(NaiveRewardManager):
    """``NaiveRewardManager`` plus the overlong penalty on each response's score token."""

    def __init__(
        self,
        tokenizer,
        num_examine: int,
        compute_score=None,
        reward_fn_key: str = "data_source",
        max_resp_len: int | None = None,
        overlong_buffer_cfg: Mapping | None = None,
        **reward_kwargs,
    ):
        super().__init__(tokenizer, num_examine, compute_score, reward_fn_key, **reward_kwargs)
        cfg = dict(overlong_buffer_cfg or {})
        self.overlong = bool(cfg.get("enable", False))
        if self.overlong:
            if max_resp_len is None:
                raise ValueError(
                    "reward.reward_kwargs.overlong_buffer_cfg.enable=True needs reward.reward_kwargs."
                    "max_resp_len (usually data.max_response_length)"
                )
            self.buffer_len = int(cfg.get("len", 0))
            if self.buffer_len <= 0:
                raise ValueError(
                    f"reward.reward_kwargs.overlong_buffer_cfg.len={self.buffer_len} must be > 0 while "
                    "the overlong penalty is on (overlong_buffer_cfg.enable=False turns it off)"
                )
            if int(max_resp_len) < self.buffer_len:
                raise ValueError(
                    f"reward.reward_kwargs.max_resp_len={max_resp_len} must be at least "
                    f"overlong_buffer_cfg.len={self.buffer_len}"
                )
            self.max_resp_len = int(max_resp_len)
            self.penalty_factor = float(cfg.get("penalty_factor", 1.0))
            self.log = bool(cfg.get("log", False))

    def __call__(self, data, return_dict: bool = False):
        out = super().__call__(data, return_dict=True)
        if "rm_scores" in data.batch.keys() or not self.overlong:
            return out if return_dict else out["reward_tensor"]
        prompt_len = data.batch["prompts"].shape[-1]
        lengths = data.batch["attention_mask"][:, prompt_len:].sum(-1)
        penalty = overlong_penalty(lengths, self.max_resp_len, self.buffer_len, self.penalty_factor)
        rows = torch.arange(len(lengths))
        last = torch.clamp(lengths - 1, min=0)
        reward = out["reward_tensor"]
        reward[rows, last] += penalty.to(reward.device)
        if self.log:
            out["reward_extra_info"]["overlong_reward"] = penalty.tolist()
            out["reward_extra_info"]["overlong"] = (penalty < 0).tolist()
        return out if return_dict else reward
