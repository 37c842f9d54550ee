"""Reward managers: the score lands on the last valid response token and nowhere else."""

import logging
import math

import numpy as np
import pytest
import torch

from hybridflow.models.tiny import build_tiny_tokenizer
from hybridflow.protocol import DataProto
from hybridflow.rewards import (
    BatchRewardManager,
    NaiveRewardManager,
    RewardComputationError,
    load_reward_manager,
    reward_metrics,
)

TOK = build_tiny_tokenizer()  # the shared character tokenizer (hybridflow/models/tiny.py)
PAD, EOS = TOK.pad_token_id, TOK.eos_token_id  # specials, dropped by skip_special_tokens
P, R = 4, 10


def ids(text: str) -> list[int]:
    return TOK.encode(text, add_special_tokens=False)  # one id per character


def make_batch(rows, extra_info=None):
    """rows: (prompt, response_ids, data_source, ground_truth). Prompts left-padded, responses right-padded."""
    prompts, responses, masks = [], [], []
    for prompt, response, _, _ in rows:
        p = ids(prompt)
        prompts.append([PAD] * (P - len(p)) + p)
        responses.append(response + [PAD] * (R - len(response)))
        # response mask: 1 up to and including the first EOS (or all of a response without EOS)
        valid = response.index(EOS) + 1 if EOS in response else len(response)
        masks.append([0] * (P - len(p)) + [1] * len(p) + [1] * valid + [0] * (R - valid))
    non_tensors = {
        "data_source": np.array([r[2] for r in rows], dtype=object),
        "reward_model": np.array([{"style": "rule", "ground_truth": r[3]} for r in rows], dtype=object),
    }
    if extra_info is not None:
        non_tensors["extra_info"] = np.array(extra_info, dtype=object)
    return DataProto.from_dict(
        tensors={
            "prompts": torch.tensor(prompts),
            "responses": torch.tensor(responses),
            "attention_mask": torch.tensor(masks),
        },
        non_tensors=non_tensors,
    )


ROWS = [
    ("Q1", ids("#### 4") + [EOS], "openai/gsm8k", "4"),  # right; 7 valid tokens -> index 6
    ("Q2+", ids("#### 12345"), "openai/gsm8k", "12345"),  # right; fills R, no EOS -> index 9
    ("Q3", ids("#### 3") + [EOS, PAD], "openai/gsm8k", "4"),  # wrong -> all zeros
    ("Q4", ids("\\boxed{2}") + [EOS], "lighteval/MATH", "2"),  # right; 10 valid -> index 9
    ("Q5", [EOS], "lighteval/MATH", "2"),  # empty answer: wrong, EOS only
]


def expected_dense():
    expected = torch.zeros(len(ROWS), R)
    expected[0, 6] = 1.0
    expected[1, 9] = 1.0
    expected[3, 9] = 1.0
    return expected


def test_score_on_last_valid_token_only():
    reward = NaiveRewardManager(TOK, num_examine=0)(make_batch(ROWS))
    assert reward.dtype == torch.float32 and reward.shape == (len(ROWS), R)
    torch.testing.assert_close(reward, expected_dense(), rtol=0, atol=0)


def test_position_follows_the_mask_not_the_text():
    # A constant scorer makes the position visible for every row: index = valid response length - 1.
    reward = NaiveRewardManager(TOK, 0, compute_score=lambda **kw: 0.5)(make_batch(ROWS))
    positions = [6, 9, 6, 9, 0]  # row 2: "#### 3"+EOS = 7 valid (trailing PAD excluded); row 4: EOS only
    expected = torch.zeros(len(ROWS), R)
    expected[torch.arange(len(ROWS)), torch.tensor(positions)] = 0.5
    torch.testing.assert_close(reward, expected, rtol=0, atol=0)


def test_empty_response_keeps_score_at_position_zero():
    rows = [("Q", [PAD] * 3, "openai/gsm8k", "1")]
    batch = make_batch(rows)
    batch.batch["attention_mask"][:, P:] = 0  # nothing valid
    reward = NaiveRewardManager(TOK, 0, compute_score=lambda **kw: 2.0)(batch)
    assert reward[0, 0] == 2.0 and reward.sum() == 2.0


def test_compute_score_receives_decoded_text_and_fields():
    calls = []

    def record(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
        calls.append((data_source, solution_str, ground_truth, extra_info, kwargs))
        return 0.0

    batch = make_batch(ROWS[:3], extra_info=[{"i": 0}, {"i": 1}, {"i": 2}])
    NaiveRewardManager(TOK, 0, compute_score=record, method="flexible")(batch)
    assert calls == [
        ("openai/gsm8k", "#### 4", "4", {"i": 0}, {"method": "flexible"}),  # EOS dropped
        ("openai/gsm8k", "#### 12345", "12345", {"i": 1}, {"method": "flexible"}),
        ("openai/gsm8k", "#### 3", "4", {"i": 2}, {"method": "flexible"}),  # padding dropped
    ]


def test_reward_fn_key_selects_the_column():
    batch = make_batch(ROWS[:2])
    batch.non_tensor_batch["task"] = np.array(["lighteval/MATH"] * 2, dtype=object)
    # Under MATH the '####' answers are not boxed, so both score 0 instead of 1.
    reward = NaiveRewardManager(TOK, 0, reward_fn_key="task")(batch)
    assert reward.sum() == 0.0
    with pytest.raises(KeyError, match="'nope'"):
        NaiveRewardManager(TOK, 0, reward_fn_key="nope")(batch)


def test_return_dict_and_extra_info_alignment():
    def scorer(data_source, solution_str, ground_truth, extra_info=None):
        if "12345" in solution_str:
            return 0.25  # a plain float row among dict rows
        return {"score": 1.0, "acc": True, "pred": solution_str}

    out = NaiveRewardManager(TOK, 0, compute_score=scorer)(make_batch(ROWS[:3]), return_dict=True)
    assert set(out) == {"reward_tensor", "reward_extra_info"}
    assert out["reward_tensor"][1, 9] == 0.25 and out["reward_tensor"][0, 6] == 1.0
    info = out["reward_extra_info"]
    assert info["score"] == [1.0, None, 1.0]
    assert info["acc"] == [True, None, True]
    assert info["pred"] == ["#### 4", None, "#### 3"]


def test_rm_scores_are_returned_unchanged():
    batch = make_batch(ROWS[:2])
    rm = torch.arange(2 * R, dtype=torch.float32).reshape(2, R)
    batch.batch["rm_scores"] = rm
    manager = NaiveRewardManager(TOK, 0, compute_score=lambda **kw: 1 / 0)  # would raise if called
    assert manager(batch) is rm
    assert manager(batch, return_dict=True)["reward_tensor"] is rm


def test_scorer_error_names_sample_and_source():
    def failing(data_source, solution_str, ground_truth, extra_info=None):
        if ground_truth == "12345":
            raise KeyError("boom")
        return 0.0

    with pytest.raises(RewardComputationError) as info:
        NaiveRewardManager(TOK, 0, compute_score=failing)(make_batch(ROWS[:3]))
    msg = str(info.value)
    assert "sample 1" in msg and "openai/gsm8k" in msg and "KeyError" in msg and "boom" in msg
    assert isinstance(info.value.__cause__, KeyError)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), "1.0", None, {"acc": 1}])
def test_bad_scores_are_rejected(bad):
    def scorer(data_source, solution_str, ground_truth, extra_info=None):
        return bad if ground_truth == "12345" else 1.0

    with pytest.raises(ValueError) as info:
        NaiveRewardManager(TOK, 0, compute_score=scorer)(make_batch(ROWS[:3]))
    assert "sample 1" in str(info.value)
    assert repr(bad) in str(info.value)


def test_numpy_and_tensor_scores_accepted():
    values = iter([np.float32(0.5), torch.tensor(2.0), True])
    reward = NaiveRewardManager(TOK, 0, compute_score=lambda **kw: next(values))(make_batch(ROWS[:3]))
    assert reward.sum(-1).tolist() == [0.5, 2.0, 1.0]


def test_num_examine_logs_per_data_source(caplog):
    caplog.set_level(logging.INFO, logger="hybridflow")
    NaiveRewardManager(TOK, num_examine=1)(make_batch(ROWS))
    out = "\n".join(caplog.messages)
    # 3 gsm8k rows and 2 MATH rows -> one shown of each
    assert out.count("[response]") == 2
    assert "[prompt] Q1" in out and "[prompt] Q4" in out and "Q2+" not in out
    caplog.clear()
    NaiveRewardManager(TOK, num_examine=0)(make_batch(ROWS))
    assert caplog.messages == []


def test_batch_manager_matches_naive_and_gets_lists():
    batch = make_batch(ROWS)
    torch.testing.assert_close(BatchRewardManager(TOK, 0)(batch), expected_dense(), rtol=0, atol=0)

    seen = {}

    def batched(data_sources, solution_strs, ground_truths, extra_infos, scale):
        seen.update(n=len(solution_strs), sources=list(data_sources))
        return [scale * float(s.endswith(g)) for s, g in zip(solution_strs, ground_truths)]

    reward = BatchRewardManager(TOK, 0, compute_score=batched, scale=3.0)(batch)
    assert seen == {"n": 5, "sources": [r[2] for r in ROWS]}
    # ends with the ground truth: rows 0 ("#### 4"/"4") and 1 ("#### 12345"/"12345")
    assert reward.sum(-1).tolist() == [3.0, 3.0, 0.0, 0.0, 0.0]
    with pytest.raises(ValueError, match="returned 1 scores for a batch of 5"):
        BatchRewardManager(TOK, 0, compute_score=lambda **kw: [0.0])(batch)


def test_load_reward_manager():
    manager = load_reward_manager("naive", TOK, 2, reward_fn_key="data_source")
    assert isinstance(manager, NaiveRewardManager) and manager.num_examine == 2
    assert isinstance(load_reward_manager("batch", TOK, 0), BatchRewardManager)
    with pytest.raises(KeyError, match="batch, dapo, gdpo, genrm, naive, remote"):
        load_reward_manager("prime", TOK, 0)


def test_reward_metrics():
    # gsm8k rows score 1, 1, 0 -> 2/3; MATH rows 1, 0 -> 1/2
    metrics = reward_metrics(expected_dense(), [r[2] for r in ROWS])
    assert metrics.keys() == {"reward/openai/gsm8k/mean", "reward/lighteval/MATH/mean"}
    assert math.isclose(metrics["reward/openai/gsm8k/mean"], 2 / 3)
    assert metrics["reward/lighteval/MATH/mean"] == 0.5
    assert reward_metrics([1.0, 3.0], ["a", "a"]) == {"reward/a/mean": 2.0}
    with pytest.raises(ValueError):
        reward_metrics([1.0], ["a", "b"])


@pytest.mark.parametrize("manager", ["naive", "batch"])
def test_agent_loop_scores_and_turn_level_fields_reach_the_reward_function(manager):
    """A loop's reward_score is used as is (the function is not called for that row); turn-level scores
    (tool_extra_fields) and num_turns reach the function in a copy of extra_info (veRL's contract)."""
    seen = []

    def naive(data_source, solution_str, ground_truth, extra_info=None):
        seen.append(extra_info)
        return 0.25 + sum(extra_info.get("turn_scores") or [])

    def batched(data_sources, solution_strs, ground_truths, extra_infos):
        return [naive(*args) for args in zip(data_sources, solution_strs, ground_truths, extra_infos)]

    batch = make_batch(ROWS[:3], extra_info=[{"i": 0}, {"i": 1}, {"i": 2}])
    batch.non_tensor_batch["reward_score"] = np.array([None, 0.75, None], dtype=object)
    batch.non_tensor_batch["tool_extra_fields"] = np.array(
        [{"turn_scores": [0.5], "tool_rewards": [-0.05]}, {"turn_scores": [9.0]}, {"turn_scores": []}], dtype=object
    )
    batch.non_tensor_batch["num_turns"] = np.array([4, 2, 2], dtype=np.int32)
    fn = naive if manager == "naive" else batched
    out = load_reward_manager(manager, TOK, num_examine=0, compute_score=fn)(batch)
    # row 0: 0.25 + 0.5 on its last valid token (index 6); row 1: the loop's 0.75 (index 9); row 2: 0.25 (index 6: "#### 3" + EOS)  # noqa: E501
    assert out.sum(-1).tolist() == [0.75, 0.75, 0.25]
    assert out[0, 6] == 0.75 and out[1, 9] == 0.75 and out[2, 6] == 0.25
    assert seen == [
        {"i": 0, "turn_scores": [0.5], "tool_rewards": [-0.05], "num_turns": 4},
        {"i": 2, "turn_scores": [], "num_turns": 2},
    ]
    assert batch.non_tensor_batch["extra_info"][0] == {"i": 0}  # the dataset's dicts are untouched
