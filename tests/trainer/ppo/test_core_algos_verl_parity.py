"""veRL 0.9.1 behaviour of core_algos that code written against veRL relies on (issue 14).

Expected values are derived by hand in the comments (or by a plain loop written here), never by
running veRL.
"""

import math

import numpy as np
import pytest
import torch

from hybridflow.trainer.ppo import core_algos

T = torch.tensor

# Two valid rows and one fully masked row (4 columns):
#   row 1 valid [1, 2, 3] -> token sum 6;  row 2 valid [5, 6] -> token sum 11;  row 3 none
LOSS = T([[1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 0.0, 0.0], [7.0, 7.0, 7.0, 7.0]])
MASK = T([[1, 1, 1, 0], [1, 1, 0, 0], [0, 0, 0, 0]])


def test_seq_mean_token_sum_norm_is_the_batch_mean_of_token_sums_over_the_horizon():
    # veRL 0.9.1: mean over the 2 valid sequences of the token sums, (6 + 11) / 2 = 8.5, then / horizon
    # 4 -> 2.125 (not the whole-batch sum 17 / 4 = 4.25, which is a factor batch size off).
    torch.testing.assert_close(core_algos.agg_loss(LOSS, MASK, "seq-mean-token-sum-norm"), T(2.125))
    # loss_scale_factor replaces the horizon: 8.5 / 10
    torch.testing.assert_close(
        core_algos.agg_loss(LOSS, MASK, "seq-mean-token-sum-norm", loss_scale_factor=10), T(0.85)
    )
    # ... and the global batch size replaces the local sequence count: 17 / 4 sequences / 4 columns
    torch.testing.assert_close(
        core_algos.agg_loss(LOSS, MASK, "seq-mean-token-sum-norm", global_batch_size=4), T(17 / 4 / 4)
    )


def test_verl_positional_signature_dp_size_and_token_sum():
    # agg_loss(loss_mat, loss_mask, mode, dp_size, batch_num_tokens, global_batch_size, loss_scale_factor)
    # token-mean over a global batch of 20 tokens on 2 ranks: 17 / 20 * 2 = 1.7
    torch.testing.assert_close(core_algos.agg_loss(LOSS, MASK, "token-mean", 2, 20), T(1.7))
    # seq-mean-token-sum-norm, global batch of 8 sequences, scale 5, 2 ranks: 17 / 8 * 2 / 5 = 0.85
    torch.testing.assert_close(core_algos.agg_loss(LOSS, MASK, "seq-mean-token-sum-norm", 2, None, 8, 5), T(0.85))
    # token-sum: the plain sum of valid tokens (x dp_size)
    torch.testing.assert_close(core_algos.agg_loss(LOSS, MASK, "token-sum"), T(17.0))
    torch.testing.assert_close(core_algos.agg_loss(LOSS, MASK, "token-sum", 3), T(51.0))
    # with dp_size > 1 the global counts are required (veRL raises ValueError)
    with pytest.raises(ValueError, match="batch_num_tokens"):
        core_algos.agg_loss(LOSS, MASK, "token-mean", dp_size=2)
    with pytest.raises(ValueError, match="global_batch_size"):
        core_algos.agg_loss(LOSS, MASK, "seq-mean-token-mean", dp_size=2)


def test_policy_and_value_loss_follow_seq_mean_token_sum_norm():
    # Ratio 1 everywhere (log_prob == old_log_prob): the vanilla per-token loss is -A.
    # A = -LOSS -> per-token loss = LOSS -> same aggregate as above: 2.125.
    lp = torch.zeros_like(LOSS)
    loss, metrics = core_algos.get_policy_loss_fn("vanilla")(
        lp, lp, -LOSS, MASK, "seq-mean-token-sum-norm", {"clip_ratio": 0.2}
    )
    torch.testing.assert_close(loss, T(2.125))
    torch.testing.assert_close(metrics["actor/pg_clipfrac"], T(0.0))
    # value loss: vpreds == values (no clipping), returns = vpreds - sqrt(2 * LOSS) -> per-token
    # (V - R)^2 = 2 * LOSS, times 0.5 -> LOSS; aggregate 2.125
    vpreds = torch.zeros_like(LOSS)
    returns = -torch.sqrt(2 * LOSS)
    vf_loss, _ = core_algos.compute_value_loss(vpreds, returns, vpreds, MASK, 0.5, "seq-mean-token-sum-norm")
    torch.testing.assert_close(vf_loss, T(2.125))
    # veRL's positional extras on the value loss: dp_size 2, global batch 4 sequences, scale 2
    #   -> 17 / 4 * 2 / 2 = 4.25
    vf_loss, _ = core_algos.compute_value_loss(
        vpreds, returns, vpreds, MASK, 0.5, "seq-mean-token-sum-norm", 2, None, 4, 2
    )
    torch.testing.assert_close(vf_loss, T(4.25))


def test_registered_policy_losses_return_loss_and_metrics_dict():
    # veRL 0.9.1: (pg_loss, {"actor/pg_clipfrac", "actor/ppo_kl", "actor/pg_clipfrac_lower"}); gpg: {}.
    old = torch.zeros(1, 2)
    new = torch.log(T([[1.5, 0.5]]))
    adv = T([[1.0, -1.0]])
    out = core_algos.get_policy_loss_fn("vanilla")(old, new, adv, torch.ones(1, 2), "token-mean", {"clip_ratio": 0.2})
    assert len(out) == 2 and set(out[1]) == {"actor/pg_clipfrac", "actor/ppo_kl", "actor/pg_clipfrac_lower"}
    # both tokens are clipped (1.5 -> 1.2 with A > 0, 0.5 -> 0.8 with A < 0): clipfrac 1
    assert float(out[1]["actor/pg_clipfrac"]) == pytest.approx(1.0)
    # ppo_kl = mean(-log ratio) = -(ln 1.5 + ln 0.5) / 2
    assert float(out[1]["actor/ppo_kl"]) == pytest.approx(-(math.log(1.5) + math.log(0.5)) / 2, abs=1e-6)
    loss, metrics = core_algos.get_policy_loss_fn("gpg")(old, new, adv, torch.ones(1, 2), "token-mean", {})
    assert metrics == {}


def test_policy_loss_reads_global_batch_info_from_the_config():
    # veRL's losses normalise with config.global_batch_info; ConfigWithBatchInfo supplies it without
    # mutating the config. Ratio 1, A = -LOSS -> per-token LOSS; token-mean over a global 34 tokens
    # on 2 ranks: 17 / 34 * 2 = 1.0
    config = {"clip_ratio": 0.2}
    view = core_algos.ConfigWithBatchInfo(
        config, {"dp_size": 2, "batch_num_tokens": 34, "global_batch_size": None, "loss_scale_factor": None}
    )
    lp = torch.zeros_like(LOSS)
    loss, _ = core_algos.get_policy_loss_fn("vanilla")(lp, lp, -LOSS, MASK, "token-mean", view)
    torch.testing.assert_close(loss, T(1.0))
    assert view.clip_ratio == 0.2 and view.get("clip_ratio_c", 3.0) == 3.0 and view["clip_ratio"] == 0.2
    assert "global_batch_info" not in config


def test_reinforce_plus_plus_carries_the_return_over_masked_spans():
    # One response with a masked (tool output) token in the middle: mask [1, 0, 1], reward 1 at the end,
    # gamma 0.5. veRL 0.9.1 skips the masked position: G_2 = 1, G_1 = 0 (masked, return carried on),
    # G_0 = 0 + 0.5 * G_2 = 0.5 (not 0.5 * 0.5 = 0.25, and not a restart at 0).
    rewards = T([[0.0, 0.0, 1.0]])
    mask = T([[1.0, 0.0, 1.0]])
    _, returns = core_algos.compute_reinforce_plus_plus_outcome_advantage(rewards, mask, config={"gamma": 0.5})
    torch.testing.assert_close(returns, T([[0.5, 0.0, 1.0]]))


# ----------------------------------------------------------------------------- vectorized estimators


def _loop_grpo(scores, index, eps=1e-6, norm=True):
    """GRPO written as a per-row loop: (s - mean_g) / (unbiased std_g + eps); groups of one -> s / (1 + eps)."""
    out = []
    for i, s in enumerate(scores):
        group = [scores[j] for j in range(len(scores)) if index[j] == index[i]]
        if len(group) == 1:
            mean, std = 0.0, 1.0
        else:
            mean = sum(group) / len(group)
            std = math.sqrt(sum((x - mean) ** 2 for x in group) / (len(group) - 1))
        out.append((s - mean) / (std + eps) if norm else s - mean)
    return out


def _loop_rloo(scores, index):
    """RLOO as a loop: s_i minus the mean of the group's other scores."""
    out = []
    for i, s in enumerate(scores):
        others = [scores[j] for j in range(len(scores)) if index[j] == index[i] and j != i]
        out.append(s - sum(others) / len(others) if others else s)
    return out


def _random_groups(seed, min_size=2, max_size=6, n_groups=7):
    rng = np.random.default_rng(seed)
    sizes = rng.integers(min_size, max_size + 1, n_groups)
    index = np.array(sum([[f"uid{g}"] * int(n) for g, n in enumerate(sizes)], []), dtype=object)
    rng.shuffle(index)  # rows of one group need not be adjacent
    n = len(index)
    mask = (torch.arange(5).unsqueeze(0) < torch.from_numpy(rng.integers(1, 6, n)).unsqueeze(1)).double()
    rewards = torch.zeros(n, 5, dtype=torch.float64)
    rewards[torch.arange(n), mask.sum(-1).long() - 1] = torch.from_numpy(rng.integers(0, 4, n)).double()
    return rewards, mask, index


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("norm", [True, False])
def test_grpo_vectorized_equals_the_loop(seed, norm):
    rewards, mask, index = _random_groups(seed, min_size=1)
    expected = torch.tensor(_loop_grpo(rewards.sum(-1).tolist(), index, norm=norm), dtype=torch.float64)
    for fn in (
        core_algos.compute_grpo_outcome_advantage,
        core_algos.compute_grpo_vectorized_outcome_advantage,
        core_algos.get_adv_estimator_fn("grpo_vectorized"),
    ):
        adv, ret = fn(rewards, mask, index, norm_adv_by_std_in_grpo=norm)
        torch.testing.assert_close(adv, expected.unsqueeze(-1) * mask)
        torch.testing.assert_close(ret, adv)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_rloo_vectorized_equals_the_loop(seed):
    rewards, mask, index = _random_groups(seed, min_size=2)
    expected = torch.tensor(_loop_rloo(rewards.sum(-1).tolist(), index), dtype=torch.float64).unsqueeze(-1) * mask
    for fn in (
        core_algos.compute_rloo_outcome_advantage,
        core_algos.compute_rloo_vectorized_outcome_advantage,
        core_algos.get_adv_estimator_fn("rloo_vectorized"),
    ):
        adv, ret = fn(rewards, mask, index)
        torch.testing.assert_close(adv, expected)
        torch.testing.assert_close(ret, adv)


def test_rloo_singleton_groups_as_verl():
    # A prompt with one response: veRL's rloo keeps its raw score, rloo_vectorized gives 0.
    rewards = T([[2.0], [1.0], [3.0]])
    mask = torch.ones(3, 1)
    index = np.array(["a", "b", "b"], dtype=object)
    # rloo: a alone -> 2; b: 1 - 3 = -2, 3 - 1 = 2
    torch.testing.assert_close(
        core_algos.compute_rloo_outcome_advantage(rewards, mask, index)[0], T([[2.0], [-2.0], [2.0]])
    )
    torch.testing.assert_close(
        core_algos.compute_rloo_vectorized_outcome_advantage(rewards, mask, index)[0], T([[0.0], [-2.0], [2.0]])
    )
    assert core_algos.AdvantageEstimator.RLOO_VECTORIZED == "rloo_vectorized"
