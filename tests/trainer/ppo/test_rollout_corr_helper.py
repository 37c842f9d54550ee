"""veRL's rollout_corr_helper signatures over hybridflow's rollout correction, on a hand example.

One row, two tokens: π_old = (0.5, 0.25), π_rollout = (0.25, 0.25), so r = π_old/π_rollout = (2, 1)."""

import math

import pytest
import torch

from hybridflow.algorithms.rollout_correction import RS_OPTIONS
from hybridflow.protocol import DataProto
from hybridflow.trainer.ppo.rollout_corr_helper import (
    SUPPORTED_ROLLOUT_RS_OPTIONS,
    TOKEN_LEVEL_ROLLOUT_RS_OPTIONS,
    compute_offpolicy_metrics,
    compute_rollout_corr_metrics_from_logprobs,
    compute_rollout_correction_and_rejection_mask,
    compute_rollout_correction_weights,
    compute_rollout_rejection_mask,
)

OLD = torch.log(torch.tensor([[0.5, 0.25]], dtype=torch.float64))
ROLLOUT = torch.log(torch.tensor([[0.25, 0.25]], dtype=torch.float64))
MASK = torch.ones(1, 2)
LN2 = math.log(2)


def test_offpolicy_metrics_by_hand():
    m = compute_offpolicy_metrics(OLD, ROLLOUT, MASK)
    assert all(type(v) is float for v in m.values())
    assert m["kl"] == pytest.approx(-LN2 / 2)  # mean of log π_rollout - log π_old = (-ln 2 + 0) / 2
    assert m["k3_kl"] == pytest.approx((2 - LN2 - 1) / 2)  # r - log r - 1 per token
    assert m["training_ppl"] == pytest.approx(2**1.5)  # exp(-(ln 0.5 + ln 0.25) / 2)
    assert m["rollout_ppl"] == pytest.approx(4.0)
    assert m["chi2_token"] == pytest.approx((4 + 1) / 2 - 1)
    assert m["chi2_seq"] == pytest.approx((2 * 1) ** 2 - 1)
    # without rollout log-probs only the training perplexity is known
    assert compute_offpolicy_metrics(OLD, None, MASK) == {
        "training_ppl": pytest.approx(2**1.5),
        "training_log_ppl": pytest.approx(1.5 * LN2),
    }
    with pytest.raises(ValueError, match="no valid token"):
        compute_offpolicy_metrics(OLD, ROLLOUT, torch.zeros(1, 2))
    prefixed = compute_rollout_corr_metrics_from_logprobs(OLD, ROLLOUT, MASK)
    assert prefixed["rollout_corr/kl"] == pytest.approx(-LN2 / 2)


def test_weights_and_rejection_in_one_call():
    # token TIS at 1.5: weights min(r, 1.5) = (1.5, 1); token_k2 = (ln r)² / 2 = (0.240, 0) > 0.2 rejects token 0
    proto, mask, m = compute_rollout_correction_and_rejection_mask(
        OLD,
        ROLLOUT,
        MASK,
        rollout_is="token",
        rollout_is_threshold=1.5,
        rollout_rs="token_k2",
        rollout_rs_threshold=0.2,
    )
    assert isinstance(proto, DataProto)
    assert proto.batch["rollout_is_weights"].tolist() == [[1.5, 1.0]]
    assert mask.tolist() == [[0.0, 1.0]]
    assert all(k.startswith("rollout_corr/") and type(v) is float for k, v in m.items())
    assert m["rollout_corr/kl"] == pytest.approx(-LN2 / 2)
    assert m["rollout_corr/rollout_rs_masked_fraction"] == pytest.approx(0.5)


def test_no_weights_without_level_or_threshold_and_rejection_needs_a_threshold():
    proto, mask, m = compute_rollout_correction_and_rejection_mask(OLD, ROLLOUT, MASK)
    assert proto is None and torch.equal(mask, MASK) and "rollout_corr/chi2_token" in m
    proto, _, _ = compute_rollout_correction_and_rejection_mask(
        OLD, ROLLOUT, MASK, rollout_is="token", rollout_is_threshold=None
    )
    assert proto is None  # veRL: no threshold, no weights
    with pytest.raises(ValueError, match="threshold"):
        compute_rollout_correction_and_rejection_mask(OLD, ROLLOUT, MASK, rollout_rs="token_k1")


def test_weights_and_mask_helpers():
    weights, m = compute_rollout_correction_weights(
        OLD - ROLLOUT, MASK, rollout_is="sequence", rollout_is_threshold=1.5
    )
    assert weights.tolist() == [[1.5, 1.5]]  # the sequence ratio 2 · 1 = 2, truncated at 1.5
    assert type(m["rollout_is_mean"]) is float
    mask, m = compute_rollout_rejection_mask(OLD - ROLLOUT, MASK, rollout_rs="seq_max_k2", rollout_rs_threshold=0.2)
    assert mask.tolist() == [[0.0, 0.0]]  # the row's largest k2 (0.240) is over 0.2: the whole row goes


def test_supported_options():
    assert SUPPORTED_ROLLOUT_RS_OPTIONS == set(RS_OPTIONS) and len(SUPPORTED_ROLLOUT_RS_OPTIONS) == 11
    assert TOKEN_LEVEL_ROLLOUT_RS_OPTIONS == {"token_k1", "token_k2", "token_k3"}
