"""A bad sample (issue 31, point 2): a scorer that raises, returns NaN / None or hangs on one sample fails the
call naming the sample's index, data_source and the error; ``bad_sample_score`` scores such samples that
value instead, warns naming each and counts them in ``reward/bad_samples``."""

from __future__ import annotations

import logging
import threading
import time

import pytest
import torch

from hybridflow.rewards import BatchRewardManager, NaiveRewardManager, RewardComputationError
from hybridflow.rewards.bad_samples import BAD_SAMPLES_METRIC
from hybridflow.rewards.dapo import DAPORewardManager
from tests.rewards.test_reward_manager import ROWS, TOK, make_batch

BAD_ROW = 3  # ROWS[3]: data_source lighteval/MATH, ground truth "2"; the other rows are openai/gsm8k
BATCH = ROWS[:4]
TIMEOUT = 0.5
RELEASE = threading.Event()  # lets the hung scorers' threads end once the test is over


@pytest.fixture(autouse=True)
def release_hung_threads():
    RELEASE.clear()
    yield
    RELEASE.set()


def _bad_result(kind: str):
    if kind == "raise":
        raise KeyError("scorer broke on this one")
    if kind == "hang":
        RELEASE.wait(30)
        return 1.0
    return {"nan": float("nan"), "none": None}[kind]


# what the error names besides the sample and its data_source
EXPECTED_TEXT = {"raise": "scorer broke on this one", "nan": "nan", "none": "None", "hang": "did not return within"}
KINDS = list(EXPECTED_TEXT)


def naive_scorer(kind):
    def compute_score(data_source, solution_str, ground_truth, extra_info=None):
        return _bad_result(kind) if data_source == "lighteval/MATH" else 0.25

    return compute_score


def batch_scorer(kind):
    def compute_score(data_sources, solution_strs, ground_truths, extra_infos):
        if kind in ("raise", "hang"):  # the batch's one call fails: no sample has a score
            _bad_result(kind)
        return [_bad_result(kind) if s == "lighteval/MATH" else 0.25 for s in data_sources]

    return compute_score


@pytest.mark.parametrize("kind", KINDS)
def test_a_bad_sample_fails_the_call_naming_it(kind):
    manager = NaiveRewardManager(TOK, 0, compute_score=naive_scorer(kind), score_timeout_s=TIMEOUT)
    start = time.monotonic()
    with pytest.raises((RewardComputationError, ValueError)) as info:
        manager(make_batch(BATCH), return_dict=True)
    message = str(info.value)
    assert f"sample {BAD_ROW} (data_source='lighteval/MATH')" in message
    assert EXPECTED_TEXT[kind] in message
    if kind == "hang":
        assert f"reward.score_timeout_s={TIMEOUT:g}" in message and time.monotonic() - start < 10 * TIMEOUT
        assert isinstance(info.value.__cause__, TimeoutError)
    if kind == "raise":
        assert isinstance(info.value.__cause__, KeyError)


@pytest.mark.parametrize("kind", KINDS)
def test_bad_sample_score_scores_and_counts_it(kind, caplog):
    manager = NaiveRewardManager(
        TOK, 0, compute_score=naive_scorer(kind), score_timeout_s=TIMEOUT, bad_sample_score=-1.5
    )
    with caplog.at_level(logging.WARNING, logger="hybridflow.rewards.rule_manager"):
        out = manager(make_batch(BATCH), return_dict=True)
    scores = out["reward_tensor"].sum(-1)
    assert scores.tolist() == [0.25, 0.25, 0.25, -1.5]
    assert out["reward_metrics"] == {BAD_SAMPLES_METRIC: 1.0}
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert f"sample {BAD_ROW} (data_source='lighteval/MATH')" in warnings[0] and EXPECTED_TEXT[kind] in warnings[0]
    assert "boxed{2}" in warnings[0]  # the sample's response


def test_a_hung_sample_does_not_stop_the_next_ones():
    """After a hang the remaining samples are scored on a fresh thread, each with its own deadline."""
    calls = []

    def scorer(data_source, solution_str, ground_truth, extra_info=None):
        calls.append(ground_truth)
        if ground_truth in ("4", "12345"):  # rows 0 and 1 (row 2's ground truth is "4" as well)
            RELEASE.wait(30)
        return 1.0

    manager = NaiveRewardManager(TOK, 0, compute_score=scorer, score_timeout_s=0.2, bad_sample_score=0.0)
    start = time.monotonic()
    out = manager(make_batch(BATCH), return_dict=True)
    assert time.monotonic() - start < 3.0
    assert out["reward_tensor"].sum(-1).tolist() == [0.0, 0.0, 0.0, 1.0]
    assert out["reward_metrics"][BAD_SAMPLES_METRIC] == 3.0 and calls == ["4", "12345", "4", "2"]


def test_without_a_deadline_the_scorer_runs_in_the_calling_thread():
    threads = []

    def scorer(data_source, solution_str, ground_truth, extra_info=None):
        threads.append(threading.current_thread())
        return 1.0

    NaiveRewardManager(TOK, 0, compute_score=scorer, score_timeout_s=None)(make_batch(BATCH))
    assert threads == [threading.current_thread()] * len(BATCH)
    NaiveRewardManager(TOK, 0, compute_score=scorer)(make_batch(BATCH))  # default: 60 s, on a daemon thread
    assert threads[-1] is not threading.current_thread() and threads[-1].daemon


def test_a_timeout_the_scorer_raises_itself_is_its_own_error():
    def scorer(data_source, solution_str, ground_truth, extra_info=None):
        raise TimeoutError("the remote judge timed out")

    with pytest.raises(RewardComputationError) as info:
        NaiveRewardManager(TOK, 0, compute_score=scorer, score_timeout_s=TIMEOUT)(make_batch(BATCH))
    assert "the remote judge timed out" in str(info.value) and "did not return within" not in str(info.value)
    assert "sample 0 (data_source='openai/gsm8k')" in str(info.value)


@pytest.mark.parametrize("kind", KINDS)
def test_batch_manager(kind):
    """NaN / None hit one sample; a batch call that raises or hangs leaves every sample of the batch bad."""
    with pytest.raises((RewardComputationError, ValueError)) as info:
        BatchRewardManager(TOK, 0, compute_score=batch_scorer(kind), score_timeout_s=TIMEOUT / len(BATCH))(
            make_batch(BATCH)
        )
    assert EXPECTED_TEXT[kind] in str(info.value) and "lighteval/MATH" in str(info.value)
    manager = BatchRewardManager(
        TOK, 0, compute_score=batch_scorer(kind), score_timeout_s=TIMEOUT / len(BATCH), bad_sample_score=-1.0
    )
    out = manager(make_batch(BATCH), return_dict=True)
    whole_batch = kind in ("raise", "hang")
    expected = [-1.0] * 4 if whole_batch else [0.25, 0.25, 0.25, -1.0]
    assert out["reward_tensor"].sum(-1).tolist() == expected
    assert out["reward_metrics"] == {BAD_SAMPLES_METRIC: 4.0 if whole_batch else 1.0}


def test_dapo_passes_the_settings_on_and_keeps_the_metric():
    manager = DAPORewardManager(TOK, 0, compute_score=naive_scorer("nan"), bad_sample_score=0.0)
    out = manager(make_batch(BATCH), return_dict=True)
    assert out["reward_metrics"] == {BAD_SAMPLES_METRIC: 1.0}
    assert torch.equal(out["reward_tensor"].sum(-1), torch.tensor([0.25, 0.25, 0.25, 0.0]))


def test_no_metric_without_the_key_and_zero_when_all_are_good():
    good = NaiveRewardManager(TOK, 0, compute_score=naive_scorer("nan"), bad_sample_score=None)
    assert "reward_metrics" not in good(make_batch(BATCH[:3]), return_dict=True)
    counted = NaiveRewardManager(TOK, 0, compute_score=naive_scorer("nan"), bad_sample_score=0.0)
    assert counted(make_batch(BATCH[:3]), return_dict=True)["reward_metrics"] == {BAD_SAMPLES_METRIC: 0.0}


@pytest.mark.parametrize(
    "kwargs, key",
    [({"bad_sample_score": float("nan")}, "reward.bad_sample_score"), ({"score_timeout_s": 0}, "score_timeout_s")],
)
def test_settings_that_cannot_work_are_refused(kwargs, key):
    with pytest.raises(ValueError, match=key):
        NaiveRewardManager(TOK, 0, **kwargs)
