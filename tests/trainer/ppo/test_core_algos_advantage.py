"""Advantage estimators: hand-derived values and python-loop references."""

import math
import statistics
from collections import defaultdict

import numpy as np
import pytest
import torch

from hybridflow.trainer.ppo import core_algos

T = torch.tensor


def _outcome_rewards(scores, lengths, width):
    """(B, width) rewards with each score on the last valid token, and the matching mask."""
    rewards = torch.zeros(len(scores), width, dtype=torch.float64)
    mask = torch.zeros(len(scores), width, dtype=torch.float64)
    for i, (s, n) in enumerate(zip(scores, lengths)):
        mask[i, :n] = 1
        rewards[i, n - 1] = s
    return rewards, mask


# ----------------------------------------------------------------------------- GAE


def test_gae_three_tokens_by_hand():
    # gamma = lam = 0.5, r = [0, 0, 1], V = [0.5, 0.25, 0.5], V after the end = 0
    # t=2: delta = 1 + 0.5*0 - 0.5 = 0.5            A2 = 0.5
    # t=1: delta = 0 + 0.5*0.5 - 0.25 = 0            A1 = 0 + 0.25*0.5 = 0.125
    # t=0: delta = 0 + 0.5*0.25 - 0.5 = -0.375       A0 = -0.375 + 0.25*0.125 = -0.34375
    # returns = A + V = [0.15625, 0.375, 1.0]
    rewards = T([[0.0, 0.0, 1.0]], dtype=torch.float64)
    values = T([[0.5, 0.25, 0.5]], dtype=torch.float64)
    mask = torch.ones_like(rewards)
    adv, ret = core_algos.compute_gae_advantage_return(rewards, values, mask, 0.5, 0.5)
    raw = [-0.34375, 0.125, 0.5]
    torch.testing.assert_close(ret, T([[0.15625, 0.375, 1.0]], dtype=torch.float64))
    # whitened: mean 0.09375, unbiased variance 0.357421875 / 2 = 0.1787109375
    mean, var = 0.09375, 0.1787109375
    expected = [(a - mean) / math.sqrt(var + 1e-8) for a in raw]
    torch.testing.assert_close(adv, T([expected], dtype=torch.float64))


def test_gae_skips_masked_tail():
    # Row 2 has mask [1, 1, 0] and junk (value 9, reward 7) on the padded token, which must be ignored:
    # t=1: delta = 1 + 0 - 0.5 = 0.5, A1 = 0.5;  t=0: delta = 0 + 0.5*0.5 - 0.5 = -0.25, A0 = -0.25 + 0.25*0.5 = -0.125
    rewards = T([[0.0, 0.0, 1.0], [0.0, 1.0, 7.0]], dtype=torch.float64)
    values = T([[0.5, 0.25, 0.5], [0.5, 0.5, 9.0]], dtype=torch.float64)
    mask = T([[1, 1, 1], [1, 1, 0]], dtype=torch.float64)
    adv, ret = core_algos.compute_gae_advantage_return(rewards, values, mask, gamma=0.5, lam=0.5)
    torch.testing.assert_close(ret[1, :2], T([0.375, 1.0], dtype=torch.float64))
    raw = [-0.34375, 0.125, 0.5, -0.125, 0.5]  # whitened together over the 5 valid tokens
    mean, std = statistics.mean(raw), statistics.stdev(raw)
    got = adv[mask.bool()]
    torch.testing.assert_close(got, T([(a - mean) / math.sqrt(std**2 + 1e-8) for a in raw], dtype=torch.float64))


def _gae_reference(rewards, values, mask, gamma, lam):
    """Per-sample loop over the valid tokens only (holes in the mask are removed first)."""
    raw = torch.zeros_like(values)
    for i in range(rewards.shape[0]):
        idx = [t for t in range(rewards.shape[1]) if mask[i, t] > 0]
        gae, next_v = 0.0, 0.0
        for t in reversed(idx):
            delta = rewards[i, t].item() + gamma * next_v - values[i, t].item()
            gae = delta + gamma * lam * gae
            raw[i, t] = gae
            next_v = values[i, t].item()
    valid = raw[mask.bool()].numpy()
    mean, std = valid.mean(), valid.std(ddof=1)
    return raw, (raw - mean) / np.sqrt(std**2 + 1e-8)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_gae_matches_loop_reference(seed):
    g = torch.Generator().manual_seed(seed)
    B, L = 6, 9
    rewards = torch.randn(B, L, generator=g, dtype=torch.float64)
    values = torch.randn(B, L, generator=g, dtype=torch.float64)
    mask = (torch.rand(B, L, generator=g) > 0.3).double()  # holes anywhere (multi-turn style)
    mask[0] = 1
    gamma, lam = 0.9, 0.8
    adv, ret = core_algos.compute_gae_advantage_return(rewards, values, mask, gamma, lam)
    raw_ref, adv_ref = _gae_reference(rewards, values, mask, gamma, lam)
    m = mask.bool()
    torch.testing.assert_close(ret[m], (raw_ref + values)[m])
    torch.testing.assert_close(adv[m], adv_ref[m])


# ----------------------------------------------------------------------------- GRPO family

# Two groups interleaved plus a singleton:
#   a: scores [1, 0, 1] -> mean 2/3, unbiased var ((1/3)^2 + (2/3)^2 + (1/3)^2) / 2 = 1/3, std = sqrt(1/3)
#   b: scores [0.5, 1.5] -> mean 1, var (0.25 + 0.25) / 1 = 0.5, std = sqrt(0.5)
#   c: score [2] alone -> mean 0, std 1
GROUP_INDEX = np.array(["a", "b", "a", "b", "a", "c"], dtype=object)
GROUP_SCORES = [1.0, 0.5, 0.0, 1.5, 1.0, 2.0]
GROUP_LENGTHS = [3, 1, 4, 2, 4, 2]


def _check_outcome(adv, mask, per_row):
    torch.testing.assert_close(adv, T(per_row, dtype=torch.float64).unsqueeze(-1) * mask)


def test_grpo_two_groups_by_hand():
    rewards, mask = _outcome_rewards(GROUP_SCORES, GROUP_LENGTHS, 4)
    eps = 1e-6
    sa, sb = math.sqrt(1 / 3), math.sqrt(0.5)
    adv, ret = core_algos.compute_grpo_outcome_advantage(rewards, mask, GROUP_INDEX, epsilon=eps)
    expected = [
        (1 - 2 / 3) / (sa + eps),
        (0.5 - 1) / (sb + eps),
        (0 - 2 / 3) / (sa + eps),
        (1.5 - 1) / (sb + eps),
        (1 - 2 / 3) / (sa + eps),
        2.0 / (1 + eps),
    ]
    _check_outcome(adv, mask, expected)
    assert ret is adv or torch.equal(ret, adv)
    # Dr. GRPO: no division by std
    adv, _ = core_algos.compute_grpo_outcome_advantage(rewards, mask, GROUP_INDEX, norm_adv_by_std_in_grpo=False)
    _check_outcome(adv, mask, [1 / 3, -0.5, -2 / 3, 0.5, 1 / 3, 2.0])


def _grpo_reference(scores, index, eps, norm):
    groups = defaultdict(list)
    for s, k in zip(scores, index):
        groups[k].append(s)
    out = []
    for s, k in zip(scores, index):
        vals = torch.stack(groups[k])
        mean, std = (vals.mean(), vals.std()) if len(vals) > 1 else (torch.tensor(0.0), torch.tensor(1.0))
        out.append((s - mean) / (std + eps) if norm else s - mean)
    return torch.stack(out)


@pytest.mark.parametrize("norm", [True, False])
def test_grpo_matches_loop_reference(norm):
    g = torch.Generator().manual_seed(3)
    B, L = 40, 5
    index = np.array([f"uid{int(k)}" for k in torch.randint(0, 12, (B,), generator=g)], dtype=object)
    rewards = torch.randn(B, L, generator=g, dtype=torch.float64)
    mask = (torch.rand(B, L, generator=g) > 0.2).double()
    adv, _ = core_algos.compute_grpo_outcome_advantage(rewards, mask, index, norm_adv_by_std_in_grpo=norm)
    ref = _grpo_reference(list(rewards.sum(-1)), index, 1e-6, norm)
    torch.testing.assert_close(adv, ref.unsqueeze(-1) * mask)


def test_rloo_by_hand():
    # a: [1, 0, 1] -> each minus the mean of the other two: 1 - 0.5, 0 - 1, 1 - 0.5
    # b: [0.5, 1.5] -> 0.5 - 1.5, 1.5 - 0.5;  c alone keeps its score 2
    rewards, mask = _outcome_rewards(GROUP_SCORES, GROUP_LENGTHS, 4)
    adv, _ = core_algos.compute_rloo_outcome_advantage(rewards, mask, GROUP_INDEX)
    _check_outcome(adv, mask, [0.5, -1.0, -1.0, 1.0, 0.5, 2.0])


def test_reinforce_plus_plus_baseline_by_hand():
    # minus group mean: a -> [1/3, -2/3, 1/3], b -> [-0.5, 0.5], c -> 2 (mean 0); broadcast to every
    # valid token, then whitened over all 16 valid tokens of the batch.
    rewards, mask = _outcome_rewards(GROUP_SCORES, GROUP_LENGTHS, 4)
    adv, _ = core_algos.compute_reinforce_plus_plus_baseline_outcome_advantage(rewards, mask, GROUP_INDEX)
    centred = [1 / 3, -0.5, -2 / 3, 0.5, 1 / 3, 2.0]
    tokens = [c for c, n in zip(centred, GROUP_LENGTHS) for _ in range(n)]
    mean, var = statistics.mean(tokens), statistics.variance(tokens)
    expected = [(c - mean) / math.sqrt(var + 1e-8) for c in centred]
    _check_outcome(adv, mask, expected)


def test_grpo_passk_by_hand():
    # one group [0.2, 0.9, 0.5]: best 0.9, second 0.5 -> 0.4 on the best row only;
    # std: mean 1.6/3, deviations (-1/3, 11/30, -1/30) -> var (100 + 121 + 1)/900/2 = 111/900
    rewards, mask = _outcome_rewards([0.2, 0.9, 0.5], [2, 3, 1], 3)
    index = np.array(["q", "q", "q"], dtype=object)
    adv, _ = core_algos.compute_grpo_passk_outcome_advantage(rewards, mask, index, norm_adv_by_std_in_grpo=False)
    _check_outcome(adv, mask, [0.0, 0.4, 0.0])
    adv, _ = core_algos.compute_grpo_passk_outcome_advantage(rewards, mask, index)
    _check_outcome(adv, mask, [0.0, 0.4 / (math.sqrt(111 / 900) + 1e-6), 0.0])
    with pytest.raises(ValueError):
        core_algos.compute_grpo_passk_outcome_advantage(rewards, mask, np.array(["q", "q", "z"], dtype=object))


def test_opo_by_hand():
    # group g: (score 1, 2 tokens), (score 0, 4 tokens): baseline (2*1 + 4*0) / 6 = 1/3; singleton s: baseline 0
    rewards, mask = _outcome_rewards([1.0, 0.0, 5.0], [2, 4, 1], 4)
    adv, _ = core_algos.compute_opo_outcome_advantage(rewards, mask, np.array(["g", "g", "s"], dtype=object))
    _check_outcome(adv, mask, [2 / 3, -1 / 3, 5.0])


# ----------------------------------------------------------------------------- REINFORCE++ and ReMax


def test_reinforce_plus_plus_returns_by_hand():
    # gamma 0.5. Row 1 r = [1, 0, 2]: G2 = 2, G1 = 0 + 0.5*2 = 1, G0 = 1 + 0.5*1 = 1.5
    # Row 2 r = [0, 3, junk], mask [1, 1, 0]: G1 = 3, G0 = 0 + 0.5*3 = 1.5 (the junk does not leak back)
    rewards = T([[1.0, 0.0, 2.0], [0.0, 3.0, 5.0]], dtype=torch.float64)
    mask = T([[1, 1, 1], [1, 1, 0]], dtype=torch.float64)
    adv, ret = core_algos.compute_reinforce_plus_plus_outcome_advantage(rewards, mask, 0.5)
    torch.testing.assert_close(ret[mask.bool()], T([1.5, 1.0, 2.0, 1.5, 3.0], dtype=torch.float64))
    valid = [1.5, 1.0, 2.0, 1.5, 3.0]
    mean, var = statistics.mean(valid), statistics.variance(valid)
    torch.testing.assert_close(
        adv[mask.bool()], T([(v - mean) / math.sqrt(var + 1e-8) for v in valid], dtype=torch.float64)
    )
    assert adv[1, 2] == 0


def test_remax_by_hand():
    # returns are undiscounted rewards-to-go: row 1 [1, 1, 1], row 2 [2, 2, 0];
    # advantages subtract the greedy baseline (0.25, 0.5) on valid tokens.
    rewards = T([[0.0, 0.0, 1.0], [0.0, 2.0, 0.0]])
    mask = T([[1, 1, 1], [1, 1, 0]])
    adv, ret = core_algos.compute_remax_outcome_advantage(rewards, T([0.25, 0.5]), mask)
    torch.testing.assert_close(ret, T([[1.0, 1.0, 1.0], [2.0, 2.0, 0.0]]))
    torch.testing.assert_close(adv, T([[0.75, 0.75, 0.75], [1.5, 1.5, 0.0]]))
