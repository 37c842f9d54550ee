"""Validation statistics (veRL's process_validation_metrics): means by hand, bootstraps against an
independent loop over the same seeded draws, and veRL's val-core / val-aux naming."""

import numpy as np
import pytest
import torch

from hybridflow.protocol import DataProto
from hybridflow.trainer.ppo.metric_utils import (
    bootstrap_metric,
    calc_maj_val,
    compute_throughout_metrics,
    process_validation_metrics,
    validation_metrics,
)
from hybridflow.trainer.ppo.validation_stats import subset_sizes


def _draws(n_data, k, seed=42, n_bootstrap=1000):
    """veRL's draws: numpy's legacy generator seeded with ``seed``, indices with replacement."""
    return np.random.RandomState(seed).choice(n_data, size=(n_bootstrap, k), replace=True)


def test_subset_sizes():
    assert subset_sizes(1) == [] and subset_sizes(2) == [2]
    assert subset_sizes(5) == [2, 4, 5] and subset_sizes(8) == [2, 4, 8]


def test_calc_maj_val_first_value_of_the_most_common_answer():
    data = [{"pred": "A", "val": 0.9}, {"pred": "B", "val": 0.8}, {"pred": "A", "val": 0.7}]
    assert calc_maj_val(data, vote_key="pred", val_key="val") == 0.9
    tie = [{"pred": "B", "val": 1.0}, {"pred": "A", "val": 0.0}]  # a tie goes to the answer seen first
    assert calc_maj_val(tie, vote_key="pred", val_key="val") == 1.0


def test_bootstrap_metric_matches_a_plain_loop_and_keeps_global_numpy_state():
    data = [0.0, 1.0, 0.5, 2.0, 1.5]
    state = np.random.get_state()
    (best_mean, best_std), (mean_mean, mean_std) = bootstrap_metric(data, 3, [np.max, np.mean], n_bootstrap=200, seed=7)
    assert np.array_equal(np.random.get_state()[1], state[1])  # the global generator is untouched
    best = [max(data[i] for i in row) for row in _draws(5, 3, seed=7, n_bootstrap=200)]
    means = [sum(data[i] for i in row) / 3 for row in _draws(5, 3, seed=7, n_bootstrap=200)]
    assert best_mean == pytest.approx(np.mean(best)) and best_std == pytest.approx(np.std(best))
    assert mean_mean == pytest.approx(np.mean(means)) and mean_std == pytest.approx(np.std(means))
    # constant data: every subset gives the same value
    assert bootstrap_metric([3.0, 3.0], 2, [np.min]) == [(3.0, 0.0)]


def test_process_validation_metrics_by_hand_and_by_loop():
    # prompt p0 (source a): 4 responses; prompt p1 (source a): 4 responses; prompt p2 (source b): 1 response
    sources = ["a"] * 8 + ["b"]
    uids = ["p0"] * 4 + ["p1"] * 4 + ["p2"]
    reward = [1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0, 0.5]
    pred = ["7", "3", "3", "7", "1", "2", "2", "9", "5"]
    out = process_validation_metrics(sources, uids, {"reward": reward, "pred": pred, "note": [None] * 9})
    assert set(out) == {"a", "b"} and set(out["a"]) == {"reward"}  # strings and all-None variables: no stats
    a = out["a"]["reward"]
    assert a["mean@4"] == pytest.approx((0.5 + 0.25) / 2)
    assert a["std@4"] == pytest.approx((0.5 + np.std([0, 0, 0, 1])) / 2)  # population std per prompt
    assert out["b"]["reward"] == {"mean@1": 0.5}  # one response: nothing to bootstrap
    for k in (2, 4):
        idx = _draws(4, k)
        best, worst, maj = [], [], []
        for rows_r, rows_p in ((reward[:4], pred[:4]), (reward[4:8], pred[4:8])):
            best.append(np.mean([max(rows_r[i] for i in row) for row in idx]))
            worst.append(np.mean([min(rows_r[i] for i in row) for row in idx]))
            votes = [calc_maj_val([{"pred": rows_p[i], "val": rows_r[i]} for i in row], "pred", "val") for row in idx]
            maj.append(np.mean(votes))
        assert a[f"best@{k}/mean"] == pytest.approx(np.mean(best))
        assert a[f"worst@{k}/mean"] == pytest.approx(np.mean(worst))
        assert a[f"maj@{k}/mean"] == pytest.approx(np.mean(maj))
    assert set(a) == {"mean@4", "std@4"} | {
        f"{m}@{k}/{s}" for m in ("best", "worst", "maj") for k in (2, 4) for s in ("mean", "std")
    }


def test_missing_sessions_count_as_failures_for_acc():
    out = process_validation_metrics(["s", "s"], ["u", "u"], {"acc": [1.0, None]}, expected_acc_counts={("s", "u"): 4})
    assert out["s"]["acc"]["mean@4"] == pytest.approx(0.25)  # 1 success of 4 expected sessions
    assert out["s"]["acc_success_only"]["mean@1"] == 1.0


def test_process_validation_metrics_rejects_misaligned_inputs():
    with pytest.raises(ValueError, match="reward has 1 values for 2 samples"):
        process_validation_metrics(["a", "a"], ["u", "u"], {"reward": [1.0]})


def test_validation_metrics_sections_follow_verl():
    sources, uids = ["gsm8k"] * 4, ["p0", "p0", "p1", "p1"]
    out = validation_metrics(sources, uids, {"reward": [1.0, 0.0, 1.0, 1.0], "pred": ["1", "2", "3", "3"]})
    core = sorted(k for k in out if k.startswith("val-core/"))
    assert core == [
        "val-core/gsm8k/reward/best@2/mean",
        "val-core/gsm8k/reward/best@2/std",
        "val-core/gsm8k/reward/maj@2/mean",
        "val-core/gsm8k/reward/maj@2/std",
        "val-core/gsm8k/reward/mean@2",
    ]
    assert out["val-core/gsm8k/reward/mean@2"] == 0.75
    assert "val-aux/gsm8k/reward/std@2" in out and "val-aux/gsm8k/reward/worst@2/mean" in out
    # a scorer that reports acc: acc is the core variable, the reward moves to val-aux
    out = validation_metrics(["m"], ["u"], {"reward": [0.5], "acc": [1.0]})
    assert out == {"val-aux/m/reward/mean@1": 0.5, "val-core/m/acc/mean@1": 1.0}


def test_compute_throughout_metrics_counts_global_token_num():
    batch = DataProto.from_dict({"attention_mask": torch.tensor([[1, 1, 0], [1, 1, 1]])})
    batch.meta_info["global_token_num"] = [2, 3]
    out = compute_throughout_metrics(batch, {"step": 2.0, "gen": 1.0}, n_gpus=5)
    assert out == {"perf/total_num_tokens": 5.0, "perf/time_per_step": 2.0, "perf/throughput": 5 / (2.0 * 5)}
    del batch.meta_info["global_token_num"]  # without it: the attention mask's tokens
    assert compute_throughout_metrics(batch, {"step": 1.0}, 1)["perf/total_num_tokens"] == 5.0
    with pytest.raises(KeyError, match="step"):
        compute_throughout_metrics(batch, {"gen": 1.0}, 1)
