"""Rollout correction (algorithm.rollout_correction): weights, rejection masks, metrics and settings,
against values worked out by hand.

The shared example: two responses, token ratios r = π_train/π_rollout of
row 0: [1.5, 4.0, 0.25] and row 1: [0.8, 3.6, (padding)]; response_mask [[1, 1, 1], [1, 1, 0]].
Sequence ratios (products): row 0: 1.5 * 4 * 0.25 = 1.5; row 1: 0.8 * 3.6 = 2.88.
"""

from __future__ import annotations

import math

import pytest
import torch

from hybridflow.algorithms.rollout_correction import (
    compute_is_weights,
    compute_policy_loss_bypass_mode,
    compute_rejection_mask,
    compute_rollout_correction,
    parse_rejection_options,
)
from hybridflow.config.convert import as_section
from hybridflow.config.rollout_correction import RolloutCorrectionConfig

PATH = "algorithm.rollout_correction"

RATIOS = [[1.5, 4.0, 0.25], [0.8, 3.6, 10.0]]  # the padded position holds garbage: it must not count
MASK = torch.tensor([[1, 1, 1], [1, 1, 0]])


def log_ratio() -> torch.Tensor:
    return torch.log(torch.tensor(RATIOS, dtype=torch.float64))


def values(metrics: dict) -> dict:
    return {k: float(v) for k, v in metrics.items()}


def test_token_tis_weights_and_metrics():
    w, m = compute_is_weights(log_ratio(), MASK, "token", upper=2.0)
    m = values(m)
    # truncated at 2, padding 0
    torch.testing.assert_close(w, torch.tensor([[1.5, 2.0, 0.25], [0.8, 2.0, 0.0]], dtype=torch.float64))
    # mean of the 5 applied weights: (1.5 + 2 + 0.25 + 0.8 + 2) / 5
    assert m["rollout_is_mean"] == pytest.approx(6.55 / 5)
    assert m["rollout_is_max"] == 2.0 and m["rollout_is_min"] == 0.25
    # raw ratios above 2: 4.0, 3.6; below 1/2: 0.25
    assert m["rollout_is_ratio_fraction_high"] == pytest.approx(2 / 5)
    assert m["rollout_is_ratio_fraction_low"] == pytest.approx(1 / 5)
    # E[w²] = (2.25 + 4 + 0.0625 + 0.64 + 4) / 5 = 2.1905; std = sqrt(2.1905 - 1.31²); ESS = 1.31² / 2.1905
    assert m["rollout_is_std"] == pytest.approx(math.sqrt(2.1905 - 1.31**2))
    assert m["rollout_is_eff_sample_size"] == pytest.approx(1.31**2 / 2.1905, rel=1e-6)
    # row means of the weights: (1.5 + 2 + 0.25) / 3 = 1.25 and (0.8 + 2) / 2 = 1.4
    assert m["rollout_is_seq_mean"] == pytest.approx(1.325)
    assert m["rollout_is_seq_std"] == pytest.approx(0.15 / math.sqrt(2))
    assert (m["rollout_is_seq_max"], m["rollout_is_seq_min"]) == pytest.approx((1.4, 1.25))
    assert m["rollout_is_seq_max_deviation"] == pytest.approx(0.4)
    # raw row means: 5.75 / 3 = 1.917 (not above 2) and 4.4 / 2 = 2.2 (above)
    assert m["rollout_is_seq_fraction_high"] == 0.5 and m["rollout_is_seq_fraction_low"] == 0.0
    assert "rollout_is_oob_ratio" not in m and "rollout_is_batch_norm_factor" not in m


def test_sequence_tis_weights_and_metrics():
    w, m = compute_is_weights(log_ratio(), MASK, "sequence", upper=2.0)
    m = values(m)
    # every token of a row gets its product ratio, truncated: 1.5 and min(2.88, 2)
    torch.testing.assert_close(w, torch.tensor([[1.5, 1.5, 1.5], [2.0, 2.0, 0.0]], dtype=torch.float64))
    assert m["rollout_is_mean"] == pytest.approx((3 * 1.5 + 2 * 2.0) / 5)
    # max/min from the untruncated sequence ratios; fractions over rows (2.88 > 2)
    assert (m["rollout_is_max"], m["rollout_is_min"]) == pytest.approx((2.88, 1.5))
    assert m["rollout_is_ratio_fraction_high"] == 0.5 and m["rollout_is_ratio_fraction_low"] == 0.0
    # E[w²] = (3 * 2.25 + 2 * 4) / 5 = 2.95; mean 1.7
    assert m["rollout_is_std"] == pytest.approx(math.sqrt(2.95 - 1.7**2))
    assert m["rollout_is_eff_sample_size"] == pytest.approx(1.7**2 / 2.95, rel=1e-6)
    assert m["rollout_is_seq_max_deviation"] == pytest.approx(1.0)  # |2 - 1|
    assert m["rollout_is_seq_fraction_high"] == 0.5  # raw row means 1.5 and 2.88


def test_icepop_zeroes_weights_outside_the_band():
    w, m = compute_is_weights(log_ratio(), MASK, "token", upper=3.0, lower=0.5)
    # inside [0.5, 3]: 1.5 and 0.8; 4.0, 0.25 and 3.6 become 0
    torch.testing.assert_close(w, torch.tensor([[1.5, 0.0, 0.0], [0.8, 0.0, 0.0]], dtype=torch.float64))
    assert float(m["rollout_is_oob_ratio"]) == pytest.approx(3 / 5)
    assert float(m["rollout_is_mean"]) == pytest.approx(2.3 / 5)


@pytest.mark.parametrize("level, mean", [("token", 6.55 / 5), ("sequence", (1.5 + 2.0) / 2)])
def test_batch_normalize_divides_by_the_mean_weight(level, mean):
    # token: the mean over tokens (1.31); sequence: the mean of the row weights 1.5 and 2 over valid rows
    raw, _ = compute_is_weights(log_ratio(), MASK, level, upper=2.0)
    w, m = compute_is_weights(log_ratio(), MASK, level, upper=2.0, batch_normalize=True)
    assert float(m["rollout_is_batch_norm_factor"]) == pytest.approx(mean)
    torch.testing.assert_close(w, raw / mean)
    assert float(m["rollout_is_mean"]) == pytest.approx(float((raw * MASK).sum() / 5))  # metrics before normalising


def test_token_k1_rejection_keeps_ratios_inside_the_band():
    # threshold 2 -> keep r in [1/2, 2]: 1.5 and 0.8 stay; 4, 0.25, 3.6 go
    options = parse_rejection_options("token_k1", 2.0)
    mask, m = compute_rejection_mask(log_ratio(), MASK, options)
    assert mask.tolist() == [[1, 0, 0], [1, 0, 0]] and mask.dtype == MASK.dtype
    m = values(m)
    assert m["rollout_rs_token_k1_masked_fraction"] == pytest.approx(3 / 5)
    assert m["rollout_rs_token_k1_seq_masked_fraction"] == 1.0
    assert m["rollout_rs_masked_fraction"] == pytest.approx(3 / 5) and m["rollout_rs_seq_masked_fraction"] == 1.0
    # statistic -log r; its mean = -log(1.5 * 4 * 0.25 * 0.8 * 3.6) / 5 = -log(4.32) / 5
    assert m["rollout_rs_token_k1_mean"] == pytest.approx(-math.log(4.32) / 5)
    # above log 2: -log 0.25; below -log 2: -log 4 and -log 3.6
    assert m["rollout_rs_token_k1_fraction_high"] == pytest.approx(1 / 5)
    assert m["rollout_rs_token_k1_fraction_low"] == pytest.approx(2 / 5)


def k3(r: float) -> float:
    return r - 1 - math.log(r)


def test_sequence_rejection_options():
    # seq_mean_k3: row means of r - 1 - log r; row 0 ≈ 0.7815 > 0.7 is dropped, row 1 ≈ 0.6711 stays
    row0 = (k3(1.5) + k3(4.0) + k3(0.25)) / 3
    row1 = (k3(0.8) + k3(3.6)) / 2
    assert row1 < 0.7 < row0
    mask, m = compute_rejection_mask(log_ratio(), MASK, parse_rejection_options("seq_mean_k3", 0.7))
    assert mask.tolist() == [[0, 0, 0], [1, 1, 0]]
    m = values(m)
    assert m["rollout_rs_seq_mean_k3_mean"] == pytest.approx((3 * row0 + 2 * row1) / 5)  # token-weighted
    assert (m["rollout_rs_seq_mean_k3_max"], m["rollout_rs_seq_mean_k3_min"]) == pytest.approx((row0, row1))
    assert m["rollout_rs_seq_mean_k3_fraction_high"] == 0.5 and m["rollout_rs_seq_mean_k3_seq_masked_fraction"] == 0.5
    assert "rollout_rs_seq_mean_k3_seq_fraction_low" not in m  # k3 has no lower bound

    # seq_sum_k1: the statistic is Σ -log r, so 'lower_upper' bounds the inverse product ratio
    # Π π_rollout/π_train (veRL's convention): row 0: 1/1.5 = 0.667, row 1: 1/2.88 = 0.347.
    # [0.3, 3] keeps both; [0.5, 3] drops row 1; [0.1, 0.5] drops row 0
    mask, _ = compute_rejection_mask(log_ratio(), MASK, parse_rejection_options("seq_sum_k1", "0.3_3.0"))
    assert mask.tolist() == [[1, 1, 1], [1, 1, 0]]
    mask, _ = compute_rejection_mask(log_ratio(), MASK, parse_rejection_options("seq_sum_k1", "0.5_3.0"))
    assert mask.tolist() == [[1, 1, 1], [0, 0, 0]]
    mask, _ = compute_rejection_mask(log_ratio(), MASK, parse_rejection_options("seq_sum_k1", "0.1_0.5"))
    assert mask.tolist() == [[0, 0, 0], [1, 1, 0]]

    # seq_max_k2: the largest (log r)² / 2 per row: row 0 (log 4)² / 2 ≈ 0.961, row 1 (log 3.6)² / 2 ≈ 0.820
    mask, _ = compute_rejection_mask(log_ratio(), MASK, parse_rejection_options("seq_max_k2", 0.9))
    assert mask.tolist() == [[0, 0, 0], [1, 1, 0]]


def test_chained_options_must_all_pass():
    # token_k1 keeps [[1,0,0],[1,0,0]], seq_mean_k3 keeps row 1 only: together only token (1, 0)
    options = parse_rejection_options("token_k1,seq_mean_k3,token_k1", "2.0,0.7")  # duplicate dropped
    assert [o.name for o in options] == ["token_k1", "seq_mean_k3"]
    mask, m = compute_rejection_mask(log_ratio(), MASK, options)
    assert mask.tolist() == [[0, 0, 0], [1, 0, 0]]
    assert float(m["rollout_rs_masked_fraction"]) == pytest.approx(4 / 5)
    assert float(m["rollout_rs_seq_masked_fraction"]) == 1.0


def test_offpolicy_metrics_and_prefix():
    rollout = torch.tensor([[-1.0, -2.0, -0.5], [-1.0, -1.0, -3.0]], dtype=torch.float64)
    train = rollout + log_ratio()
    settings = RolloutCorrectionConfig.disabled()  # metrics only
    weights, mask, m = compute_rollout_correction(train, rollout, MASK, settings)
    assert weights is None and mask is MASK
    assert all(k.startswith("rollout_corr/") for k in m)
    m = {k.removeprefix("rollout_corr/"): float(v) for k, v in m.items()}
    assert m["kl"] == pytest.approx(-math.log(4.32) / 5)  # mean of log π_rollout - log π_train
    assert m["k3_kl"] == pytest.approx((k3(1.5) + k3(4.0) + k3(0.25) + k3(0.8) + k3(3.6)) / 5)
    assert m["chi2_token"] == pytest.approx((1.5**2 + 16 + 0.25**2 + 0.8**2 + 3.6**2) / 5 - 1)
    assert m["chi2_seq"] == pytest.approx((1.5**2 + 2.88**2) / 2 - 1)
    # rollout mean log-probs per row: -7/6 and -1; ppl = mean of exp(-mean log-prob)
    assert m["rollout_ppl"] == pytest.approx((math.exp(7 / 6) + math.e) / 2)
    assert m["rollout_log_ppl"] == pytest.approx((7 / 6 + 1) / 2)
    # log_ppl_diff per row = -(mean log ratio): -log(1.5)/3 and -log(2.88)/2
    d0, d1 = -math.log(1.5) / 3, -math.log(2.88) / 2
    assert m["log_ppl_diff"] == pytest.approx((d0 + d1) / 2)
    assert (m["log_ppl_diff_max"], m["log_ppl_diff_min"]) == pytest.approx((d0, d1))
    assert m["ppl_ratio"] == pytest.approx((1.5 ** (-1 / 3) + 2.88**-0.5) / 2)
    # training log-ppl per row = rollout log-ppl + log_ppl_diff
    assert m["training_log_ppl"] == pytest.approx(((7 / 6 + d0) + (1 + d1)) / 2)


def test_bypass_reinforce_weights_the_policy_gradient():
    # π_θ/π_rollout = [3, 1.5] on one row; token TIS at 2 -> w = [2, 1.5]; A = [1, -2]
    rollout = torch.tensor([[-1.0, -1.0]], dtype=torch.float64)
    log_prob = (rollout + torch.log(torch.tensor([[3.0, 1.5]], dtype=torch.float64))).requires_grad_()
    settings = RolloutCorrectionConfig(
        rollout_is="token", rollout_is_threshold=2.0, bypass_mode=True, loss_type="reinforce"
    )
    loss, m = compute_policy_loss_bypass_mode(
        rollout,
        log_prob,
        torch.tensor([[1.0, -2.0]], dtype=torch.float64),
        torch.ones(1, 2),
        "token-mean",
        {},
        settings,
    )
    kl = m["actor/ppo_kl"]
    loss.backward()
    # loss = -(2 * 1 * lp0 + 1.5 * (-2) * lp1) / 2 -> d/dlp = [-1, 1.5]
    torch.testing.assert_close(log_prob.grad, torch.tensor([[-1.0, 1.5]], dtype=torch.float64))
    assert float(kl) == pytest.approx(-(math.log(3) + math.log(1.5)) / 2)  # mean log π_rollout - log π_θ
    assert float(m["rollout_corr/rollout_is_mean"]) == pytest.approx(1.75)


def test_bypass_ppo_clip_rejected_tokens_leave_only_the_numerator():
    # token_k1 at 2 drops the r = 3 token; the r = 1.5, A = -2 token: max(-A r, -A clip(r)) = max(3, 2.4) = 3,
    # under the dual-clip cap -A * 3 = 6; token-mean over the caller's count of 2 tokens -> 3 / 2
    rollout = torch.tensor([[-1.0, -1.0]], dtype=torch.float64)
    log_prob = rollout + torch.log(torch.tensor([[3.0, 1.5]], dtype=torch.float64))
    settings = RolloutCorrectionConfig(rollout_rs="token_k1", rollout_rs_threshold=2.0, bypass_mode=True)
    assert settings.rejection == parse_rejection_options("token_k1", 2.0)
    loss, m = compute_policy_loss_bypass_mode(
        rollout,
        log_prob,
        torch.tensor([[5.0, -2.0]], dtype=torch.float64),
        torch.ones(1, 2),
        "token-mean",
        {"clip_ratio": 0.2},
        settings,
        global_token_count=torch.tensor(2.0),
    )
    clipfrac = m["actor/pg_clipfrac"]
    assert float(loss) == pytest.approx(1.5)
    assert float(clipfrac) == 0.0
    assert float(m["rollout_corr/rollout_rs_masked_fraction"]) == 0.5


@pytest.mark.parametrize(
    "section, message",
    [
        ({"rollout_is": "tokens"}, "rollout_is='tokens'"),
        (
            {"rollout_is": "token", "rollout_is_threshold": None},
            "needs algorithm.rollout_correction.rollout_is_threshold",
        ),
        ({"rollout_is": "token", "rollout_is_threshold": "3_2"}, "lower bound exceeds"),
        ({"rollout_is": "token", "rollout_is_threshold": -1.0}, "must be positive"),
        ({"rollout_rs": "token_k4", "rollout_rs_threshold": 1.0}, "unknown option 'token_k4'"),
        ({"rollout_rs": "token_k1"}, "needs algorithm.rollout_correction.rollout_rs_threshold"),
        ({"rollout_rs": "seq_mean_k3", "rollout_rs_threshold": "0.1_0.2"}, "single upper bound"),
        ({"rollout_rs": "token_k1,seq_mean_k3", "rollout_rs_threshold": "1,2,3"}, "exactly one per option"),
        ({"loss_type": "ppo"}, "loss_type='ppo'"),
        ({"bypass_mode": "yes"}, "bypass_mode must be true or false"),
    ],
)
def test_settings_refuse_bad_values_naming_the_key(section, message):
    with pytest.raises(ValueError, match="algorithm.rollout_correction") as err:
        as_section(section, RolloutCorrectionConfig, PATH)
    assert message in str(err.value)


def test_settings_parse_thresholds():
    s = as_section(
        {
            "rollout_is": "sequence",
            "rollout_is_threshold": "0.5_5.0",
            "rollout_rs": "token_k1,seq_max_k3",
            "rollout_rs_threshold": "0.2_5,0.01",
        },
        RolloutCorrectionConfig,
        PATH,
    )
    assert s.is_bounds == (5.0, 0.5)
    k1, k3_max = s.rejection
    assert (k1.lower, k1.upper) == pytest.approx((math.log(0.2), math.log(5)))  # log space
    assert (k3_max.lower, k3_max.upper, k3_max.aggregation) == (None, 0.01, "max")
    # one number for k1: the symmetric band [1/u, u]
    (sym,) = parse_rejection_options("seq_mean_k1", 2)
    assert (sym.lower, sym.upper) == pytest.approx((-math.log(2), math.log(2)))
    assert as_section({"rollout_is_threshold": "3"}, RolloutCorrectionConfig, PATH).is_bounds[0] == 3.0
