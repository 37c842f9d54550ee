"""The policy losses added for veRL 0.9.1 parity (clip_cov, kl_cov, geo_mean, cispo, sapo, dppo_tv,
dppo_kl, dro) against values derived by hand in the comments or by a plain loop written here; never
by running veRL (hybridflow/devtools/verl_parity.py does that, outside the test suite)."""

import math

import pytest
import torch

from hybridflow.trainer.ppo import core_algos

T = torch.tensor
D = torch.float64
CONFIG = {"clip_ratio": 0.2, "clip_ratio_low": 0.2, "clip_ratio_high": 0.28, "clip_ratio_c": 3.0}


def _call(name, old, new, adv, mask, config, mode="token-mean", weights=None):
    """(loss, d loss / d log_prob, metrics as floats)."""
    new = new.clone().requires_grad_(True)
    loss, metrics = core_algos.get_policy_loss_fn(name)(old, new, adv, mask, mode, config, weights)
    loss.backward()
    return loss.detach(), new.grad, {k: float(v) for k, v in metrics.items()}


def test_every_verl_loss_mode_is_registered():
    for name in (
        "vanilla",
        "gspo",
        "gpg",
        "clip_cov",
        "kl_cov",
        "geo_mean",
        "cispo",
        "sapo",
        "dppo_tv",
        "dppo_kl",
        "dro",
    ):
        assert callable(core_algos.get_policy_loss_fn(name))


def test_cispo_clips_the_detached_weight_not_the_gradient():
    # ratios 1.5, 0.5, 1.1 with clip (0.8, 1.28) -> weights 1.28, 0.8, 1.1; loss_t = -w_t * A_t * log pi_t
    old = T([[-1.0, -2.0, -0.5]], dtype=D)
    new = old + torch.log(T([[1.5, 0.5, 1.1]], dtype=D))
    adv, mask = T([[1.0, -1.0, 2.0]], dtype=D), torch.ones(1, 3, dtype=D)
    loss, grad, m = _call("cispo", old, new, adv, mask, CONFIG)
    w = [1.28, 0.8, 1.1]
    lp = new[0].tolist()
    expected = -sum(w[i] * adv[0, i].item() * lp[i] for i in range(3)) / 3
    assert loss.item() == pytest.approx(expected)
    # every token keeps a gradient (PPO would give 0 to the two clipped ones): -w * A / 3
    torch.testing.assert_close(grad, T([[-1.28 / 3, 0.8 / 3, -2.2 / 3]], dtype=D))
    assert m["actor/pg_clipfrac"] == pytest.approx(2 / 3) and m["actor/pg_clipfrac_lower"] == 0.0


def _probs_case(p_old, p, adv):
    return (
        torch.log(T([p_old], dtype=D)),
        torch.log(T([p], dtype=D)),
        T([adv], dtype=D),
        torch.ones(1, len(adv), dtype=D),
    )


def test_dppo_tv_masks_tokens_whose_probability_moved_too_far():
    # p_old -> p, A:   0.5->0.9 (+0.4 > 0.28, A>0: out)   0.5->0.6 (+0.1: in, ratio 1.2)
    #                  0.5->0.2 (-0.3 < -0.2, A<0: out)    0.3->0.2 (-0.1: in, ratio 2/3)
    #                  0.01->0.2 (+0.19: in, ratio 20 truncated to clip_ratio_c = 3)
    old, new, adv, mask = _probs_case([0.5, 0.5, 0.5, 0.3, 0.01], [0.9, 0.6, 0.2, 0.2, 0.2], [1, 1, -1, -1, 2])
    loss, grad, m = _call("dppo_tv", old, new, adv, mask, CONFIG)
    weight = [0.0, 1.2, 0.0, 0.2 / 0.3, 3.0]
    lp = new[0].tolist()
    assert loss.item() == pytest.approx(-sum(weight[i] * adv[0, i].item() * lp[i] for i in range(5)) / 5)
    torch.testing.assert_close(grad, -T([weight], dtype=D) * adv / 5)
    assert m["actor/pg_clipfrac"] == pytest.approx(2 / 5)  # untrusted share
    assert m["actor/pg_clipfrac_lower"] == pytest.approx(1 / 5)  # trusted with ratio > c
    assert m["actor/ppo_kl"] == pytest.approx(
        -sum(math.log(p / q) for p, q in zip([0.9, 0.6, 0.2, 0.2, 0.2], [0.5, 0.5, 0.5, 0.3, 0.01])) / 5
    )


def _binary_kl(p_old, p):
    return p_old * math.log(p_old / p) + (1 - p_old) * math.log((1 - p_old + 1e-8) / (1 - p + 1e-8))


def test_dppo_kl_limits_only_moves_in_the_advantage_direction():
    # thresholds 0.05 both ways. A > 0 and p rose far -> out; A > 0 and p fell far -> in (fell: the
    # advantage pushes up, nothing to limit); A < 0 and p fell far -> out; A < 0 and p rose far -> in;
    # A > 0 and p rose a little (binary KL < 0.05) -> in.
    p_old, p = [0.3, 0.6, 0.6, 0.3, 0.3], [0.7, 0.2, 0.2, 0.7, 0.35]
    kls = [_binary_kl(a, b) for a, b in zip(p_old, p)]
    assert min(kls[:4]) > 0.05 and kls[4] < 0.05  # the cases are what they claim
    old, new, adv, mask = _probs_case(p_old, p, [1, 1, -1, -1, 1])
    config = {**CONFIG, "clip_ratio_low": 0.05, "clip_ratio_high": 0.05, "clip_ratio_c": 10.0}
    loss, grad, m = _call("dppo_kl", old, new, adv, mask, config)
    trusted = [0, 1, 0, 1, 1]
    weight = [trusted[i] * p[i] / p_old[i] for i in range(5)]
    torch.testing.assert_close(grad, -T([weight], dtype=D) * adv / 5)
    assert m["actor/pg_clipfrac"] == pytest.approx(2 / 5) and m["actor/pg_clipfrac_lower"] == 0.0
    torch.testing.assert_close(core_algos.binary_kl(old, new), T([kls], dtype=D), atol=1e-9, rtol=0)


def test_dro_quadratic_penalty_and_required_beta():
    old = T([[-1.0, -2.0]], dtype=D)
    new = T([[-0.5, -2.5]], dtype=D)
    adv, mask = T([[1.0, -2.0]], dtype=D), torch.ones(1, 2, dtype=D)
    config = {**CONFIG, "policy_loss": {"dro_beta": 0.4}}
    loss, grad, m = _call("dro", old, new, adv, mask, config)
    # loss_t = -(A lp - beta/2 (lp - old)^2): -(-0.5 - 0.05) = 0.55 and -(5 - 0.05) = -4.95; mean -2.2
    assert loss.item() == pytest.approx(-2.2)
    # d/dlp = -(A - beta (lp - old)) / 2: -(1 - 0.2) / 2 = -0.4 and -(-2 + 0.2) / 2 = 0.9
    torch.testing.assert_close(grad, T([[-0.4, 0.9]], dtype=D))
    assert set(m) == {"actor/ppo_kl"} and m["actor/ppo_kl"] == pytest.approx(0.0)  # (-0.5 + 0.5) / 2
    for beta in (None, 0.0):
        with pytest.raises(ValueError, match="policy_loss.dro_beta"):
            _call("dro", old, new, adv, mask, {**CONFIG, "policy_loss": {"dro_beta": beta}})


def test_sapo_gate_value_slope_and_sequence_mean():
    # f(r) = 4/tau sigmoid(tau (r - 1)): f(1) = 2/tau, f'(1) = 1 -> at ratio 1 the gradient wrt log pi
    # is -A (PPO's), whatever tau
    tau = T(1.7, dtype=D)
    r = T(1.0, dtype=D, requires_grad=True)
    value = core_algos.sapo_gate(r, tau)
    value.backward()
    assert value.item() == pytest.approx(2 / 1.7) and r.grad.item() == pytest.approx(1.0)
    # two rows of lengths 2 and 1; tau_pos 1 for A > 0, tau_neg 2 for A <= 0; always seq-mean-token-mean
    old = torch.zeros(2, 2, dtype=D)
    new = torch.log(T([[1.5, 0.5], [2.0, 1.0]], dtype=D))
    adv = T([[1.0, -1.0], [-2.0, 9.0]], dtype=D)
    mask = T([[1, 1], [1, 0]], dtype=D)

    def f(x, t):
        return 4 / t / (1 + math.exp(-t * (x - 1)))

    row0 = (-f(1.5, 1.0) * 1 + f(0.5, 2.0) * 1) / 2
    row1 = f(2.0, 2.0) * 2
    config = {**CONFIG, "tau_pos": 1.0, "tau_neg": 2.0}
    for mode in ("token-mean", "seq-mean-token-sum"):  # the mode passed is not used
        loss, _, m = _call("sapo", old, new, adv, mask, config, mode)
        assert loss.item() == pytest.approx((row0 + row1) / 2)
    assert m["actor/pg_clipfrac"] == 0.0 and m["actor/ppo_kl"] == pytest.approx(
        -(math.log(1.5) + math.log(0.5) + math.log(2)) / 3
    )


def test_geo_mean_one_ratio_per_sequence():
    # row 0: A = 1 on 3 tokens, log ratios 0.5, -0.1, 0.1; clipped to [-0.2, 0.2] -> 0.2, -0.1, 0.1;
    #        A > 0 keeps the smaller -> 0.2, -0.1, 0.1; ratio exp(0.2 / 3); loss -1 * exp(0.2 / 3)
    # row 1: A = -2 on 2 tokens, log ratios -0.5, 0.3 (third token padding); clipped -0.2, 0.2;
    #        A < 0 keeps the larger -> -0.2, 0.3; ratio exp(0.05); loss 2 * exp(0.05)
    old = torch.zeros(2, 3, dtype=D)
    new = T([[0.5, -0.1, 0.1], [-0.5, 0.3, 7.0]], dtype=D)
    adv = T([[1.0, 1.0, 1.0], [-2.0, -2.0, 0.0]], dtype=D)
    mask = T([[1, 1, 1], [1, 1, 0]], dtype=D)
    config = {"clip_ratio": 0.2}
    loss0, loss1 = -math.exp(0.2 / 3), 2 * math.exp(0.05)
    loss, grad, m = _call("geo_mean", old, new, adv, mask, config, "seq-mean-token-sum")
    assert loss.item() == pytest.approx((loss0 + loss1) / 2)  # the mean over sequences, whatever the mode
    # gradients: a clipped token's term is the constant bound -> 0; else d/dlp = seq_loss / len / 2 rows
    torch.testing.assert_close(grad, T([[0.0, loss0 / 3 / 2, loss0 / 3 / 2], [0.0, loss1 / 2 / 2, 0.0]], dtype=D))
    # clipped tokens: (0, 0) with A > 0; (1, 0) and (1, 1) with A < 0; 5 valid tokens
    assert m["actor/pg_clipfrac"] == pytest.approx(1 / 5) and m["actor/pg_clipfrac_lower"] == pytest.approx(2 / 5)
    # given global batch info (the actor's micro-batches): the sum over the global sequence count x dp
    info = {"dp_size": 2, "batch_num_tokens": 20, "global_batch_size": 8, "loss_scale_factor": None}
    loss, _, _ = _call("geo_mean", old, new, adv, mask, core_algos.ConfigWithBatchInfo(config, info))
    assert loss.item() == pytest.approx((loss0 + loss1) / 8 * 2)


def test_geo_mean_zero_advantage_tokens_add_no_log_ratio():
    # A = (0, 2): the first token's log ratio 0.15 is dropped from the sum but counts in the length:
    # ratio exp((0 + 0.1) / 2), mean advantage 1 -> loss -exp(0.05)
    old = torch.zeros(1, 2, dtype=D)
    loss, _, _ = _call(
        "geo_mean",
        old,
        T([[0.15, 0.1]], dtype=D),
        T([[0.0, 2.0]], dtype=D),
        torch.ones(1, 2, dtype=D),
        {"clip_ratio": 0.2},
    )
    assert loss.item() == pytest.approx(-math.exp(0.05))


def _cov_config(**policy_loss):
    return {
        **CONFIG,
        "policy_loss": {
            "clip_cov_lb": 1.0,
            "clip_cov_ub": 5.0,
            "kl_cov_ratio": 0.0002,
            "ppo_kl_coef": 1.0,
            **policy_loss,
        },
    }


def test_clip_cov_drops_the_tokens_with_covariance_in_the_band():
    # ratio 1 everywhere; A = (2, 1, 1, -2), mean 0.5; log pi = (-1, -2, -2, -3), mean -2
    # cov = (1.5 * 1, 0.5 * 0, 0.5 * 0, -2.5 * -1) = (1.5, 0, 0, 2.5): tokens 0 and 3 lie in (1, 5);
    # clip_cov_ratio 0.5 -> int(0.5 * 4) = 2 tokens dropped: exactly those two
    lp = T([[-1.0, -2.0, -2.0, -3.0]], dtype=D)
    adv, mask = T([[2.0, 1.0, 1.0, -2.0]], dtype=D), torch.ones(1, 4, dtype=D)
    loss, grad, m = _call("clip_cov", lp, lp, adv, mask, _cov_config(clip_cov_ratio=0.5))
    assert loss.item() == pytest.approx((0 - 1 - 1 + 0) / 4)  # -A * 1 on the kept tokens
    torch.testing.assert_close(grad, T([[0.0, -0.25, -0.25, 0.0]], dtype=D))
    assert set(m) == {"actor/pg_clipfrac", "actor/ppo_kl"} and m["actor/pg_clipfrac"] == pytest.approx(0.5)


def test_clip_cov_never_drops_ppo_clipped_or_masked_tokens_and_draws_at_random():
    # token 0 is clipped by PPO (ratio 2, A > 0) and has the largest covariance: it keeps its clipped
    # loss -A * 1.28; token 4 is masked out. Tokens 1..3 are candidates; one of them (int(0.25 * 4) = 1)
    # is dropped, chosen at random, reproducibly under torch.manual_seed.
    old = T([[-2.0, -1.0, -1.2, -1.1, -0.1]], dtype=D)
    new = old + torch.log(T([[2.0, 1.0, 1.0, 1.0, 1.0]], dtype=D))
    adv = T([[3.0, 2.0, 2.5, 2.2, 9.0]], dtype=D)
    mask = T([[1, 1, 1, 1, 0]], dtype=D)
    config = _cov_config(clip_cov_ratio=0.25, clip_cov_lb=-10.0, clip_cov_ub=10.0)
    dropped = set()
    for seed in range(12):
        torch.manual_seed(seed)
        loss, grad, m = _call("clip_cov", old, new, adv, mask, config)
        zero = [i for i in range(4) if grad[0, i] == 0]
        assert grad[0, 0] == 0 and len(zero) == 2  # token 0 by PPO's clip, one candidate by clip_cov
        dropped.add(zero[1])
        kept = [i for i in (1, 2, 3) if i != zero[1]]
        assert loss.item() == pytest.approx((-3.0 * 1.28 - sum(adv[0, i].item() for i in kept)) / 4)
        torch.manual_seed(seed)
        again, _, _ = _call("clip_cov", old, new, adv, mask, config)
        assert again == loss
    assert dropped == {1, 2, 3}  # every candidate gets drawn for some seed
    with pytest.raises(ValueError, match="clip_cov_ratio"):
        _call("clip_cov", old, new, adv, mask, _cov_config(clip_cov_ratio=0.0))


def test_kl_cov_penalises_the_top_covariance_tokens():
    # 6 tokens, the last masked (its covariance would be largest); kl_cov_ratio 0.4 -> int(5 * 0.4) = 2
    # tokens get + coef * |log ratio|. Covariance over the 5 valid tokens, written as a loop.
    old = T([[-1.0, -1.5, -0.7, -2.0, -1.2, -5.0]], dtype=D)
    new = T([[-0.8, -1.9, -0.6, -2.6, -1.0, -0.1]], dtype=D)
    adv = T([[1.5, -0.5, 0.8, -1.2, 0.3, 50.0]], dtype=D)
    mask = T([[1, 1, 1, 1, 1, 0]], dtype=D)
    a, lp = adv[0, :5].tolist(), new[0, :5].tolist()
    ma, ml = sum(a) / 5, sum(lp) / 5
    cov = [(a[i] - ma) * (lp[i] - ml) for i in range(5)]
    top = sorted(range(5), key=lambda i: -cov[i])[:2]
    coef = 0.3
    per_token = []
    for i in range(5):
        lr = lp[i] - old[0, i].item()
        per_token.append(-a[i] * math.exp(lr) + (coef * abs(lr) if i in top else 0.0))
    loss, _, m = _call("kl_cov", old, new, adv, mask, _cov_config(kl_cov_ratio=0.4, ppo_kl_coef=coef))
    assert loss.item() == pytest.approx(sum(per_token) / 5)
    assert set(m) == {"actor/ppo_kl"}
    assert m["actor/ppo_kl"] == pytest.approx(sum(abs(lp[i] - old[0, i].item()) for i in range(5)) / 5)  # |log ratio|


# ----------------------------------------------------------------------------- micro-batch invariance

B, L = 10, 6


def _random_batch(seed=0):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, L + 1, (B,), generator=g)
    mask = (torch.arange(L).unsqueeze(0) < lengths.unsqueeze(1)).to(D)
    old = torch.log(torch.rand(B, L, generator=g, dtype=D) * 0.9 + 0.05)
    new = torch.clamp(old + 0.4 * torch.randn(B, L, generator=g, dtype=D), max=-1e-3)
    return old, new, torch.randn(B, L, generator=g, dtype=D) * mask, mask


@pytest.mark.parametrize("name", ["cispo", "dppo_tv", "dppo_kl", "dro", "sapo", "geo_mean"])
@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean"])
def test_micro_batches_with_global_batch_info_give_the_full_batch_gradient(name, mode):
    # the actor hands each micro-batch the mini-batch's totals (config.global_batch_info): summing the
    # micro-batch losses must equal the full-batch loss, gradient included (geo_mean too, see its doc)
    old, new, adv, mask = _random_batch()
    base = {**CONFIG, "tau_pos": 1.0, "tau_neg": 1.05, "policy_loss": {"dro_beta": 0.3}}
    tokens, seqs = core_algos.global_counts(mask)
    info = {"dp_size": 1, "batch_num_tokens": tokens, "global_batch_size": seqs, "loss_scale_factor": L}
    config = core_algos.ConfigWithBatchInfo(base, info)
    full_lp = new.clone().requires_grad_(True)
    full, _ = core_algos.get_policy_loss_fn(name)(old, full_lp, adv, mask, mode, config)
    full.backward()
    split_lp = new.clone().requires_grad_(True)
    total = 0.0
    for rows in (torch.arange(0, 3), torch.arange(3, 4), torch.arange(4, B)):
        width = int(mask[rows].sum(-1).max())  # each micro-batch trimmed to its own longest response
        sl = (rows, slice(0, width))
        total = total + core_algos.get_policy_loss_fn(name)(old[sl], split_lp[sl], adv[sl], mask[sl], mode, config)[0]
    total.backward()
    torch.testing.assert_close(total, full)
    torch.testing.assert_close(split_lp.grad, full_lp.grad)
    assert full_lp.grad.abs().sum() > 0
