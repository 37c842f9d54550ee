"""Finished trajectories -> the rollout's DataProto layout (pure tensor building, no engine).

    prompts            (B, P)    left-padded with the pad id
    responses          (B, R)    right-padded with the pad id: model tokens and appended tool/user tokens
    response_mask      (B, R)    1 = a token the model sampled, 0 = tool / interaction / padding
    input_ids          (B, P+R)  prompts ++ responses
    attention_mask     (B, P+R)  1 on every real token (prompt, model, tool, user), 0 on padding
    position_ids       (B, P+R)  prompt positions from its mask; the response continues from the last one
    rollout_log_probs  (B, R)    the engine's log-probs of the model's tokens (0 elsewhere), when it gave them

``response_mask`` is the one the loss uses; the driver never rebuilds it from ``attention_mask``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from hybridflow.agent_loop.base import AgentLoopOutput


def pad_outputs(
    outputs: Sequence[AgentLoopOutput], prompt_length: int, response_length: int, pad_token_id: int
) -> dict[str, torch.Tensor]:
    """The tensors of the layout above for ``outputs``. A prompt longer than ``prompt_length`` is an
    error (the dataset bounds prompts); a response longer than ``response_length`` is cut."""
    n = len(outputs)
    prompts = torch.full((n, prompt_length), pad_token_id, dtype=torch.long)
    prompt_mask = torch.zeros((n, prompt_length), dtype=torch.long)
    responses = torch.full((n, response_length), pad_token_id, dtype=torch.long)
    response_attention = torch.zeros((n, response_length), dtype=torch.long)
    response_mask = torch.zeros((n, response_length), dtype=torch.long)
    with_logprobs = n > 0 and all(o.response_logprobs is not None for o in outputs)
    log_probs = torch.zeros((n, response_length), dtype=torch.float32)
    for i, out in enumerate(outputs):
        p = len(out.prompt_ids)
        if p > prompt_length:
            raise ValueError(f"sample {i}: prompt of {p} tokens exceeds the rollout prompt length {prompt_length}")
        if p:
            prompts[i, prompt_length - p :] = torch.tensor(out.prompt_ids)
            prompt_mask[i, prompt_length - p :] = 1
        r = min(len(out.response_ids), response_length)
        if r:
            responses[i, :r] = torch.tensor(out.response_ids[:r])
            response_attention[i, :r] = 1
            response_mask[i, :r] = torch.tensor(out.response_mask[:r])
            if with_logprobs:
                log_probs[i, :r] = torch.tensor(out.response_logprobs[:r], dtype=torch.float32)
    log_probs *= response_mask  # nothing but the model's own tokens carries a log-prob
    prompt_positions = (prompt_mask.cumsum(-1) - 1).clamp(min=0)  # (B, P)
    response_positions = prompt_positions[:, -1:] + torch.arange(1, response_length + 1)  # (B, R)
    tensors = {
        "prompts": prompts,
        "responses": responses,
        "response_mask": response_mask,
        "input_ids": torch.cat([prompts, responses], dim=1),
        "attention_mask": torch.cat([prompt_mask, response_attention], dim=1),
        "position_ids": torch.cat([prompt_positions, response_positions], dim=1),
    }
    if with_logprobs:
        tensors["rollout_log_probs"] = log_probs
    return tensors


def non_tensor_fields(outputs: Sequence[AgentLoopOutput]) -> dict[str, np.ndarray]:
    """Per-sample values for ``non_tensor_batch``: ``num_turns``, ``reward_score`` (when any loop gave
    one), every key of ``extra_fields`` (None where a sample lacks it) and, when any loop returned extra
    fields, ``tool_extra_fields`` (each sample's dict of them, veRL's column: the reward manager passes
    it to the reward function inside ``extra_info``)."""
    fields: dict[str, np.ndarray] = {"num_turns": np.array([o.num_turns for o in outputs], dtype=np.int32)}
    if any(o.reward_score is not None for o in outputs):
        fields["reward_score"] = _objects([o.reward_score for o in outputs])
    keys = sorted({k for o in outputs for k in o.extra_fields})
    for key in keys:
        fields[key] = _objects([o.extra_fields.get(key) for o in outputs])
    if keys:
        fields["tool_extra_fields"] = _objects([dict(o.extra_fields) for o in outputs])
    return fields


def _objects(values: list) -> np.ndarray:
    arr = np.empty(len(values), dtype=object)
    arr[:] = values
    return arr


def mean_metrics(outputs: Sequence[AgentLoopOutput], prefix: str = "agent/") -> dict[str, float]:
    """Step-level means of the per-trajectory metrics, plus turn statistics."""
    if not outputs:
        return {}
    turns = np.array([o.num_turns for o in outputs], dtype=np.float64)
    out = {
        f"{prefix}num_turns/mean": float(turns.mean()),
        f"{prefix}num_turns/min": float(turns.min()),
        f"{prefix}num_turns/max": float(turns.max()),
    }
    for key in sorted({k for o in outputs for k in o.metrics}):
        values = [o.metrics[key] for o in outputs if key in o.metrics]
        out[f"{prefix}{key}"] = float(np.mean(values))
    return out
