"""Policy, value and entropy losses and the aggregation modes, against hand-derived values."""

import math

import pytest
import torch

from hybridflow.trainer.ppo import core_algos

T = torch.tensor

# One token per case, clip range (low 0.2, high 0.28), dual-clip c = 3:
#   name            A     ratio  unclipped -A*r   clipped -A*clip(r, 0.8, 1.28)   max     dual cap -A*c   loss
#   unclipped      +1     1.1        -1.1              -1.1                       -1.1        -            -1.1
#   clipped_high   +1     1.5        -1.5              -1.28                      -1.28       -            -1.28
#   pos_low        +1     0.5        -0.5              -0.8                       -0.5        -            -0.5
#   clipped_low    -1     0.5         0.5               0.8                        0.8        3             0.8
#   dual_clip      -1     5.0         5.0               1.28                       5.0        3             3.0
CASES = {
    "unclipped": (1.0, 1.1, -1.1, False, False),
    "clipped_high": (1.0, 1.5, -1.28, True, False),
    "pos_low": (1.0, 0.5, -0.5, False, False),
    "clipped_low": (-1.0, 0.5, 0.8, True, False),
    "dual_clip": (-1.0, 5.0, 3.0, False, True),
}
# d loss / d log_prob = -A * ratio where the unclipped term is active, 0 where a clip is active.
GRADS = {"unclipped": -1.1, "clipped_high": 0.0, "pos_low": -0.5, "clipped_low": 0.0, "dual_clip": 0.0}


@pytest.mark.parametrize("name", list(CASES))
def test_policy_loss_branches(name):
    adv, ratio, loss, clipped, lower = CASES[name]
    old = T([[-1.0]], dtype=torch.float64)
    new = (old + math.log(ratio)).requires_grad_(True)
    mask = T([[1.0]], dtype=torch.float64)
    pg_loss, clipfrac, ppo_kl, clipfrac_lower = core_algos.compute_policy_loss(
        old, new, T([[adv]], dtype=torch.float64), mask, cliprange=0.2, cliprange_high=0.28, clip_ratio_c=3.0
    )
    torch.testing.assert_close(pg_loss, T(loss, dtype=torch.float64))
    # metrics are masked means (count + 1e-8 in the denominator, as in veRL)
    assert clipfrac.item() == pytest.approx(float(clipped)) and clipfrac_lower.item() == pytest.approx(float(lower))
    torch.testing.assert_close(ppo_kl, T(-math.log(ratio), dtype=torch.float64))
    pg_loss.backward()
    torch.testing.assert_close(new.grad, T([[GRADS[name]]], dtype=torch.float64))


def test_policy_loss_batch_metrics_and_mask():
    # The five cases side by side plus a masked token with a huge ratio; token-mean of the five losses.
    advs = [c[0] for c in CASES.values()] + [1.0]
    ratios = [c[1] for c in CASES.values()] + [100.0]
    old = torch.zeros(1, 6, dtype=torch.float64)
    new = torch.log(T([ratios], dtype=torch.float64))
    mask = T([[1, 1, 1, 1, 1, 0]], dtype=torch.float64)
    pg_loss, clipfrac, ppo_kl, lower = core_algos.compute_policy_loss(
        old, new, T([advs], dtype=torch.float64), mask, cliprange=0.2, cliprange_high=0.28
    )
    torch.testing.assert_close(pg_loss, T((-1.1 - 1.28 - 0.5 + 0.8 + 3.0) / 5, dtype=torch.float64))
    torch.testing.assert_close(clipfrac, T(2 / 5, dtype=torch.float64))
    torch.testing.assert_close(lower, T(1 / 5, dtype=torch.float64))
    torch.testing.assert_close(ppo_kl, -torch.log(T(ratios[:5], dtype=torch.float64)).mean())
    with pytest.raises(ValueError):
        core_algos.compute_policy_loss(old, new, old, mask, cliprange=0.2, clip_ratio_c=1.0)


def test_vanilla_registered_loss_reads_config():
    g = torch.Generator().manual_seed(0)
    old = torch.randn(3, 5, generator=g, dtype=torch.float64)
    new = old + 0.5 * torch.randn(3, 5, generator=g, dtype=torch.float64)
    adv = torch.randn(3, 5, generator=g, dtype=torch.float64)
    mask = torch.ones(3, 5, dtype=torch.float64)
    ref = core_algos.compute_policy_loss(old, new, adv, mask, 0.2, 0.1, 0.3, 2.0, "seq-mean-token-mean")
    fn = core_algos.get_policy_loss_fn("vanilla")
    cfg = {"clip_ratio": 0.2, "clip_ratio_low": 0.1, "clip_ratio_high": 0.3, "clip_ratio_c": 2.0}
    loss, metrics = fn(old, new, adv, mask, "seq-mean-token-mean", cfg)  # veRL 0.9.1: (loss, metrics dict)
    torch.testing.assert_close(loss, ref[0])
    for name, value in zip(["actor/pg_clipfrac", "actor/ppo_kl", "actor/pg_clipfrac_lower"], ref[1:], strict=True):
        torch.testing.assert_close(metrics[name], value)
    # same with only clip_ratio set: low/high fall back to it
    ref = core_algos.compute_policy_loss(old, new, adv, mask, cliprange=0.2)
    got = fn(old, new, adv, mask, "token-mean", {"clip_ratio": 0.2, "clip_ratio_low": None})
    torch.testing.assert_close(ref[0], got[0])


def test_gspo_sequence_ratio():
    # One sequence, token log-ratios [ln 2, 0] -> sequence ratio = geometric mean = sqrt(2) = 1.414;
    # A = +1, clip 0.2 -> clipped to 1.2 on both tokens, loss -1.2, gradient 0, clipfrac 1.
    old = torch.zeros(1, 2, dtype=torch.float64)
    new = T([[math.log(2.0), 0.0]], dtype=torch.float64, requires_grad=True)
    adv, mask = torch.ones(1, 2, dtype=torch.float64), torch.ones(1, 2, dtype=torch.float64)
    fn = core_algos.get_policy_loss_fn("gspo")
    loss, metrics = fn(old, new, adv, mask, config={"clip_ratio": 0.2})
    torch.testing.assert_close(loss, T(-1.2, dtype=torch.float64))
    assert metrics["actor/pg_clipfrac"].item() == pytest.approx(1.0)
    loss.backward()
    assert torch.all(new.grad == 0)
    # Log-ratios [ln 1.1, -ln 1.1] -> sequence ratio 1 (unclipped) although each token alone is 1.1 / 0.909;
    # loss = mean_t(-A * s) = -1; gradient per token = -A * s / |y| = -0.5 (value s, gradient through own token).
    new = T([[math.log(1.1), -math.log(1.1)]], dtype=torch.float64, requires_grad=True)
    loss, metrics = fn(old, new, adv, mask, config={"clip_ratio": 0.05})
    torch.testing.assert_close(loss, T(-1.0, dtype=torch.float64))
    assert metrics["actor/pg_clipfrac"].item() == 0.0
    loss.backward()
    torch.testing.assert_close(new.grad, T([[-0.5, -0.5]], dtype=torch.float64))


def test_gpg_loss():
    # -log_prob * A, token-mean: (-(-1)*2 - (-3)*(-1)) / 2 = (2 - 3) / 2 = -0.5
    lp = T([[-1.0, -3.0]])
    loss, *_ = core_algos.get_policy_loss_fn("gpg")(lp, lp, T([[2.0, -1.0]]), torch.ones(1, 2))
    torch.testing.assert_close(loss, T(-0.5))


def test_value_loss_clipping():
    # cliprange 0.2 around the rollout values V_old = 0.5 -> predictions clipped into [0.3, 0.7]; return 1.0
    #   vpred 1.0: unclipped (1.0-1)^2 = 0,    clipped (0.7-1)^2 = 0.09 -> 0.09 (the clipped one counts)
    #   vpred 0.6: unclipped 0.16,            clipped 0.16          -> 0.16
    #   vpred 0.0: unclipped 1.0,             clipped (0.3-1)^2 = 0.49 -> 1.0
    #   4th token masked (junk). vf_loss = 0.5 * (0.09 + 0.16 + 1.0) / 3, clipfrac = 1/3
    vpreds = T([[1.0, 0.6, 0.0, 50.0]], requires_grad=True)
    returns = T([[1.0, 1.0, 1.0, -50.0]])
    values = T([[0.5, 0.5, 0.5, 0.5]])
    mask = T([[1.0, 1.0, 1.0, 0.0]])
    vf_loss, clipfrac = core_algos.compute_value_loss(vpreds, returns, values, mask, 0.2)
    torch.testing.assert_close(vf_loss, T(0.5 * 1.25 / 3))
    torch.testing.assert_close(clipfrac, T(1 / 3))
    vf_loss.backward()
    # gradient: token 1 clipped -> 0; token 2: 0.5*2*(0.6-1)/3; token 3: 0.5*2*(0-1)/3; masked 0
    torch.testing.assert_close(vpreds.grad, T([[0.0, -0.4 / 3, -1 / 3, 0.0]]))


def test_entropy_loss_uniform():
    # uniform logits over 4 classes -> entropy ln 4 on every token; a peaked token (masked) is ignored
    logits = torch.zeros(1, 3, 4)
    logits[0, 2] = T([100.0, 0.0, 0.0, 0.0])
    mask = T([[1.0, 1.0, 0.0]])
    torch.testing.assert_close(core_algos.compute_entropy_loss(logits, mask), T(math.log(4.0)))


# loss_mat / mask with a partly padded row and a fully masked row:
#   row 1 valid [1, 2, 3] -> sum 6, mean 2;  row 2 valid [5, 6] -> sum 11, mean 5.5;  row 3 none
#   token-mean               (6 + 11) / 5 tokens           = 3.4
#   seq-mean-token-sum       (6 + 11) / 2 sequences        = 8.5
#   seq-mean-token-mean      (2 + 5.5) / 2                 = 3.75
#   token-sum                6 + 11                         = 17
#   seq-mean-token-sum-norm  veRL 0.9.1: the seq-mean-token-sum, / the 4 columns
#                            (6 + 11) / 2 sequences / 4    = 2.125  (or 8.5 / 10 = 0.85 with loss_scale_factor=10)
AGG_LOSS = T([[1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 0.0, 0.0], [7.0, 7.0, 7.0, 7.0]])
AGG_MASK = T([[1, 1, 1, 0], [1, 1, 0, 0], [0, 0, 0, 0]])


@pytest.mark.parametrize(
    "mode,expected",
    [
        ("token-mean", 3.4),
        ("token-sum", 17.0),
        ("seq-mean-token-sum", 8.5),
        ("seq-mean-token-mean", 3.75),
        ("seq-mean-token-sum-norm", 2.125),
    ],
)
def test_agg_loss_modes(mode, expected):
    torch.testing.assert_close(core_algos.agg_loss(AGG_LOSS, AGG_MASK, mode), T(expected))


def test_agg_loss_options_and_errors():
    torch.testing.assert_close(
        core_algos.agg_loss(AGG_LOSS, AGG_MASK, "seq-mean-token-sum-norm", loss_scale_factor=10), T(0.85)
    )
    # explicit global counts replace the local ones: 17 / 10 tokens, 17 / 4 sequences
    torch.testing.assert_close(core_algos.agg_loss(AGG_LOSS, AGG_MASK, "token-mean", global_token_count=10), T(1.7))
    torch.testing.assert_close(
        core_algos.agg_loss(AGG_LOSS, AGG_MASK, "seq-mean-token-sum", global_seq_count=4), T(4.25)
    )
    # an all-masked micro-batch contributes 0, not NaN
    assert core_algos.agg_loss(AGG_LOSS, torch.zeros_like(AGG_MASK), "token-mean").item() == 0.0
    with pytest.raises(KeyError, match="token-mean"):
        core_algos.agg_loss(AGG_LOSS, AGG_MASK, "token-median")
