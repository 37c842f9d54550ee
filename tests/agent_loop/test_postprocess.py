"""Finished trajectories -> the rollout tensors: padding, masks, positions, log-probs, extra fields."""

from __future__ import annotations

import numpy as np
import pytest

from hybridflow.agent_loop.base import AgentLoopOutput
from hybridflow.agent_loop.postprocess import mean_metrics, non_tensor_fields, pad_outputs

PAD = 0


def test_layout_by_hand():
    # sample 0: prompt [5, 6], model says 7, a tool answers 8 9, the model says 10 (then padding)
    # sample 1: prompt [4], model says 11 12 13 and is cut at R = 4 (the 4th token 14 is dropped)
    outs = [
        AgentLoopOutput([5, 6], [7, 8, 9, 10], [1, 0, 0, 1], [-0.5, 0.0, 0.0, -0.25], num_turns=4),
        AgentLoopOutput([4], [11, 12, 13, 14, 15], [1, 1, 1, 1, 1], [-1.0, -2.0, -3.0, -4.0, -5.0], num_turns=2),
    ]
    t = pad_outputs(outs, prompt_length=3, response_length=4, pad_token_id=PAD)
    assert t["prompts"].tolist() == [[0, 5, 6], [0, 0, 4]]  # left padding
    assert t["responses"].tolist() == [[7, 8, 9, 10], [11, 12, 13, 14]]
    assert t["response_mask"].tolist() == [[1, 0, 0, 1], [1, 1, 1, 1]]
    assert t["attention_mask"].tolist() == [[0, 1, 1, 1, 1, 1, 1], [0, 0, 1, 1, 1, 1, 1]]  # tool tokens are attended
    # positions: prompt 0,1 (pad 0) then 2..5; sample 1: prompt 0 then 1..4
    assert t["position_ids"].tolist() == [[0, 0, 1, 2, 3, 4, 5], [0, 0, 0, 1, 2, 3, 4]]
    assert t["input_ids"].tolist() == [[0, 5, 6, 7, 8, 9, 10], [0, 0, 4, 11, 12, 13, 14]]
    # log-probs only on the model's tokens
    assert t["rollout_log_probs"].tolist() == [[-0.5, 0.0, 0.0, -0.25], [-1.0, -2.0, -3.0, -4.0]]


def test_short_response_is_padded_and_masked():
    t = pad_outputs([AgentLoopOutput([1, 2], [3], [1], None)], 2, 3, PAD)
    assert t["responses"].tolist() == [[3, 0, 0]] and t["response_mask"].tolist() == [[1, 0, 0]]
    assert t["attention_mask"].tolist() == [[1, 1, 1, 0, 0]]
    assert "rollout_log_probs" not in t  # the engine gave none


def test_a_log_prob_on_a_tool_token_is_dropped():
    t = pad_outputs([AgentLoopOutput([1], [3, 4], [1, 0], [-1.0, -9.0])], 1, 2, PAD)
    assert t["rollout_log_probs"].tolist() == [[-1.0, 0.0]]


def test_too_long_prompt_names_the_sample():
    with pytest.raises(ValueError, match="sample 1: prompt of 3 tokens exceeds the rollout prompt length 2"):
        pad_outputs([AgentLoopOutput([1], [], []), AgentLoopOutput([1, 2, 3], [], [])], 2, 2, PAD)


def test_mismatched_mask_is_refused():
    with pytest.raises(ValueError, match="response_mask has 1 entries for 2"):
        AgentLoopOutput([1], [2, 3], [1])


def test_non_tensor_fields_and_metrics():
    outs = [
        AgentLoopOutput(
            [1],
            [2],
            [1],
            num_turns=2,
            reward_score=1.0,
            metrics={"tool_calls": 2.0},
            extra_fields={"turn_scores": [0.5]},
        ),
        AgentLoopOutput([1], [2], [1], num_turns=4, metrics={"tool_calls": 0.0}),
    ]
    f = non_tensor_fields(outs)
    assert f["num_turns"].tolist() == [2, 4]
    assert list(f["reward_score"]) == [1.0, None]
    assert list(f["turn_scores"]) == [[0.5], None]
    m = mean_metrics(outs)
    assert m == {
        "agent/num_turns/mean": 3.0,
        "agent/num_turns/min": 2.0,
        "agent/num_turns/max": 4.0,
        "agent/tool_calls": 1.0,
    }
    assert "reward_score" not in non_tensor_fields(outs[1:])
    assert isinstance(f["reward_score"], np.ndarray) and f["reward_score"].dtype == object
