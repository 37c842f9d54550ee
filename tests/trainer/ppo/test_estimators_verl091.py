"""gdpo, optimal_token_baseline and tir_optimal_token_baseline against hand-derived values and plain
loops written here (never by running veRL), and the trainer passing them their extra inputs."""

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from hybridflow.protocol import DataProto
from hybridflow.trainer.ppo import core_algos
from hybridflow.trainer.ppo.core_algos import AdvantageEstimator
from hybridflow.trainer.ppo.ray_trainer import RayPPOTrainer

T = torch.tensor
D = torch.float64


def test_new_names_resolve():
    for est in (
        AdvantageEstimator.GDPO,
        AdvantageEstimator.OPTIMAL_TOKEN_BASELINE,
        AdvantageEstimator.TIR_OPTIMAL_TOKEN_BASELINE,
    ):
        assert callable(core_algos.get_adv_estimator_fn(est)) and callable(core_algos.get_adv_estimator_fn(est.value))


# ----------------------------------------------------------------------------- gdpo


def _whiten_loop(values, mask):
    """Zero mean, unit unbiased variance over the masked entries (plain Python)."""
    xs = [v for v, m in zip(values.flatten().tolist(), mask.flatten().tolist()) if m]
    mean = sum(xs) / len(xs)
    var = sum((x - mean) ** 2 for x in xs) / (len(xs) - 1)
    return (values - mean) / math.sqrt(var + 1e-8)


def _grpo_loop(scores, index, eps=1e-6):
    out = []
    for i, s in enumerate(scores):
        group = [scores[j] for j in range(len(scores)) if index[j] == index[i]]
        if len(group) == 1:
            mean, std = 0.0, 1.0
        else:
            mean = sum(group) / len(group)
            std = math.sqrt(sum((x - mean) ** 2 for x in group) / (len(group) - 1))
        out.append((s - mean) / (std + eps))
    return out


def _gdpo_inputs():
    # one group of 3: accuracy (0, 10, 0) has a large spread, format (1, 0, 0) a small one
    mask = torch.ones(3, 2, dtype=D)
    index = np.array(["p", "p", "p"], dtype=object)
    non_tensor = {"acc": np.array([0.0, 10.0, 0.0], dtype=object), "fmt": np.array([1, 0, 0], dtype=object)}
    rewards = torch.zeros(3, 2, dtype=D)
    rewards[:, -1] = T([1.0, 10.0, 0.0], dtype=D)  # the summed score a GRPO run would see
    return rewards, mask, index, non_tensor


def test_gdpo_normalises_each_component_before_summing():
    rewards, mask, index, non_tensor = _gdpo_inputs()
    config = {"gdpo_reward_keys": ["acc", "fmt"], "norm_adv_by_std_in_grpo": True}
    adv, ret = core_algos.compute_gdpo_outcome_advantage(
        rewards, mask, index, config=config, non_tensor_batch=non_tensor, batch={}
    )
    # acc -> (-0.577, 1.155, -0.577), fmt -> (1.155, -0.577, -0.577): sum (0.577, 0.577, -1.155); the
    # first response (right format, wrong answer) is above average. GRPO on the sum (1, 10, 0) puts it
    # below: the large component drowns the small one there.
    assert adv[0, 0] > 0 and adv[1, 0] > 0 and adv[2, 0] < 0
    grpo, _ = core_algos.compute_grpo_outcome_advantage(rewards, mask, index)
    assert grpo[0, 0] < 0
    summed = [a + b for a, b in zip(_grpo_loop([0, 10, 0], index), _grpo_loop([1, 0, 0], index))]
    expected = _whiten_loop(T(summed, dtype=D).unsqueeze(-1) * mask, mask)
    torch.testing.assert_close(adv, expected, atol=1e-6, rtol=0)
    torch.testing.assert_close(ret, adv)


def test_gdpo_weights_masks_and_groups_as_a_loop():
    rng = np.random.default_rng(0)
    index = np.array(["a", "b", "a", "c", "b", "a", "b"], dtype=object)  # c: a group of one
    n = len(index)
    mask = (torch.arange(4).unsqueeze(0) < torch.from_numpy(rng.integers(1, 5, n)).unsqueeze(1)).to(D)
    comps = {"x": rng.integers(0, 2, n).astype(float), "y": rng.random(n), "z": rng.normal(size=n)}
    weights = [1.0, 0.5, 2.0]
    config = OmegaConf.create({"gdpo_reward_keys": ["x", "y", "z"], "gdpo_reward_weights": weights})
    adv, _ = core_algos.get_adv_estimator_fn("gdpo")(
        torch.zeros(n, 4, dtype=D),
        mask,
        index,
        config=config,
        non_tensor_batch={k: v.astype(object) for k, v in comps.items()},
        batch={},
    )
    total = [
        sum(w * g[i] for w, g in zip(weights, [_grpo_loop(list(comps[k]), index) for k in "xyz"])) for i in range(n)
    ]
    expected = _whiten_loop(T(total, dtype=D).unsqueeze(-1) * mask, mask) * mask
    torch.testing.assert_close(adv, expected, atol=1e-6, rtol=0)


def test_gdpo_without_components_is_grpo_then_whitening_and_errors_name_the_key():
    rewards, mask, index, non_tensor = _gdpo_inputs()
    adv, _ = core_algos.compute_gdpo_outcome_advantage(rewards, mask, index)
    expected = _whiten_loop(T(_grpo_loop([1.0, 10.0, 0.0], index), dtype=D).unsqueeze(-1) * mask, mask)
    torch.testing.assert_close(adv, expected, atol=1e-6, rtol=0)
    fn = core_algos.compute_gdpo_outcome_advantage
    with pytest.raises(ValueError, match="algorithm.gdpo_reward_keys"):
        fn(rewards, mask, index, config={}, non_tensor_batch=non_tensor, batch={})
    with pytest.raises(ValueError, match="'len'"):
        fn(rewards, mask, index, config={"gdpo_reward_keys": ["len"]}, non_tensor_batch=non_tensor, batch={})
    with pytest.raises(ValueError, match="gdpo_reward_weights has 1 entries for 2"):
        fn(
            rewards,
            mask,
            index,
            config={"gdpo_reward_keys": ["acc", "fmt"], "gdpo_reward_weights": [1.0]},
            non_tensor_batch=non_tensor,
            batch={},
        )


# ----------------------------------------------------------------------------- optimal token baseline


def _otb_hand_case():
    # one group: row 0 has 2 tokens, reward 1 at the end; row 1 has 3 tokens, reward 2 at the end.
    # w_t = 1 - 2 pi + sum pi^2: row 0 pi = 0.5, sum 0.5 -> 0.5, W = (0.5, 1.0);
    #                            row 1 pi = 0.1, sum 0.5 -> 1.3, W = (1.3, 2.6, 3.9)
    rewards = T([[0.0, 1.0, 0.0], [0.0, 0.0, 2.0]], dtype=D)
    mask = T([[1, 1, 0], [1, 1, 1]], dtype=D)
    old = torch.log(T([[0.5, 0.5, 0.5], [0.1, 0.1, 0.1]], dtype=D))
    spsq = torch.full((2, 3), 0.5, dtype=D)
    return rewards, mask, np.array(["g", "g"], dtype=object), old, spsq


def test_otb_hand_computed_with_and_without_zero_tail():
    rewards, mask, index, old, spsq = _otb_hand_case()
    # returns G: row 0 (1, 1, 0), row 1 (2, 2, 2)
    # b_0 = (1 * 0.5 + 2 * 1.3) / (0.5 + 1.3) = 3.1 / 1.8;  b_1 = (1 * 1.0 + 2 * 2.6) / 3.6 = 6.2 / 3.6
    # b_2: only row 1 -> 2 * 3.9 / 3.9 = 2 (advantage 0); with the zero tail (row 1 is the single longest,
    #      beyond the second-longest length 2) its baseline there is 0 -> advantage 2
    b0, b1 = 3.1 / 1.8, 6.2 / 3.6
    adv, ret = core_algos.compute_optimal_token_baseline_advantage(rewards, mask, index, old, spsq)
    torch.testing.assert_close(ret, T([[1.0, 1.0, 0.0], [2.0, 2.0, 2.0]], dtype=D))
    torch.testing.assert_close(adv, T([[1 - b0, 1 - b1, 0.0], [2 - b0, 2 - b1, 2.0]], dtype=D))
    adv, _ = core_algos.compute_optimal_token_baseline_advantage(
        rewards, mask, index, old, spsq, handle_zero_tail=False
    )
    torch.testing.assert_close(adv, T([[1 - b0, 1 - b1, 0.0], [2 - b0, 2 - b1, 0.0]], dtype=D), atol=1e-7, rtol=0)
    # rollout IS weights scale each w by rho^2: rho = 2 on row 0 -> W row 0 = (2, 4)
    rho = T([[2.0, 2.0, 2.0], [1.0, 1.0, 1.0]], dtype=D)
    adv, _ = core_algos.compute_optimal_token_baseline_advantage(
        rewards, mask, index, old, spsq, rollout_is_weights=rho
    )
    b0, b1 = (1 * 2 + 2 * 1.3) / 3.3, (1 * 4 + 2 * 2.6) / 6.6
    torch.testing.assert_close(adv[:, :2], T([[1 - b0, 1 - b1], [2 - b0, 2 - b1]], dtype=D))


def _otb_loop(rewards, mask, index, old, spsq, tir, zero_tail=True, eps=1e-8):
    """Per group, per aligned position k: b_k = sum G W / (sum W + eps) over the group's rows having a
    k-th token. Aligned by column (tir=False) or by the k-th valid token (tir=True); under tir a row
    without any token belongs to no group."""
    r, m, lp, sq = (x.tolist() for x in (rewards, mask, old, spsq))
    n, width = len(r), len(r[0])

    def entries(j):  # {aligned position: (return-to-go G, cumulative W)} of row j
        cols = [t for t in range(width) if m[j][t]]
        out, w = {}, 0.0
        for t in cols:
            w += 1 - 2 * math.exp(lp[j][t]) + sq[j][t]
            out[cols.index(t) if tir else t] = (sum(r[j][s] * m[j][s] for s in range(t, width)), w)
        return out

    rows = [entries(j) for j in range(n)]
    adv = torch.zeros_like(rewards)
    for i in range(n):
        group = [j for j in range(n) if index[j] == index[i] and (rows[j] or not tir)]
        lengths = sorted(len(rows[j]) for j in group)
        sole_longest = len(group) > 1 and lengths[-1] > lengths[-2] and len(rows[i]) == lengths[-1]
        cols = [t for t in range(width) if m[i][t]]
        for t in cols:
            k = cols.index(t) if tir else t
            if len(group) == 1 or (zero_tail and sole_longest and k >= lengths[-2]):
                b = 0.0
            else:
                num = sum(rows[j][k][0] * rows[j][k][1] for j in group if k in rows[j])
                den = sum(rows[j][k][1] for j in group if k in rows[j])
                b = num / (den + eps)
            adv[i, t] = rows[i][k][0] - b
    return adv


def _random_otb_case(seed, holes):
    rng = np.random.default_rng(seed)
    n, width = 9, 7
    index = np.array(["a", "a", "b", "b", "b", "c", "d", "d", "d"], dtype=object)
    lengths = torch.from_numpy(rng.integers(1, width + 1, n))
    lengths[2] = lengths[3] = 4  # group b: a tie for the longest unless row 4 is longer
    mask = (torch.arange(width).unsqueeze(0) < lengths.unsqueeze(1)).to(D)
    if holes:  # tool output between model turns
        mask[0, 1:3] = 0
        mask[4, 0] = 0
        mask[7] = 0  # a row with no model token at all
    rewards = torch.from_numpy(rng.integers(0, 3, (n, width))).to(D) * (torch.from_numpy(rng.random((n, width))) < 0.3)
    old = torch.log(torch.from_numpy(rng.random((n, width)) * 0.9 + 0.05))
    spsq = torch.exp(old) ** 2 + torch.from_numpy(rng.random((n, width))) * 0.3
    return rewards, mask, index, old, spsq


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("holes", [False, True])
def test_otb_and_tir_otb_equal_the_loop(seed, holes):
    rewards, mask, index, old, spsq = _random_otb_case(seed, holes)
    for name, tir in (("optimal_token_baseline", False), ("tir_optimal_token_baseline", True)):
        fn = core_algos.get_adv_estimator_fn(name)
        for zero_tail in (True, False):
            adv, _ = fn(rewards, mask, index, old_log_probs=old, sum_pi_squared=spsq, handle_zero_tail=zero_tail)
            expected = _otb_loop(rewards, mask, index, old, spsq, tir, zero_tail)
            torch.testing.assert_close(adv, expected, atol=1e-9, rtol=0, msg=f"{name} zero_tail={zero_tail}")


def test_tir_equals_otb_without_holes_and_differs_with_them():
    for holes in (False, True):
        rewards, mask, index, old, spsq = _random_otb_case(5, holes)
        kwargs = dict(old_log_probs=old, sum_pi_squared=spsq)
        otb, ret = core_algos.compute_optimal_token_baseline_advantage(rewards, mask, index, **kwargs)
        tir, tir_ret = core_algos.compute_multi_turn_optimal_token_baseline_advantage(rewards, mask, index, **kwargs)
        torch.testing.assert_close(ret, tir_ret)
        assert torch.allclose(otb, tir) != holes


def test_otb_group_of_one_and_missing_input():
    rewards, mask, _, old, spsq = _otb_hand_case()
    alone = np.array(["x", "y"], dtype=object)
    adv, ret = core_algos.compute_optimal_token_baseline_advantage(rewards, mask, alone, old, spsq)
    torch.testing.assert_close(adv, ret * mask)  # no baseline: the return itself
    with pytest.raises(ValueError, match="calculate_sum_pi_squared=True"):
        core_algos.compute_optimal_token_baseline_advantage(rewards, mask, alone, old, None)


# ----------------------------------------------------------------------------- trainer wiring


def _trainer_view(estimator, **algorithm):
    """What RayPPOTrainer._compute_advantage reads of the trainer."""
    fn = core_algos.get_adv_estimator_fn(estimator)
    import inspect

    algo = OmegaConf.create({"gamma": 1.0, "lam": 1.0, "adv_estimator": estimator, **algorithm})
    return SimpleNamespace(
        adv_fn=fn, _adv_params=set(inspect.signature(fn).parameters), config=OmegaConf.create({"algorithm": algo})
    )


def test_trainer_passes_reward_components_and_sum_pi_squared():
    rewards, mask, index, non_tensor = _gdpo_inputs()
    batch = DataProto.from_dict(
        tensors={"token_level_rewards": rewards, "response_mask": mask}, non_tensors={"uid": index, **non_tensor}
    )
    RayPPOTrainer._compute_advantage(_trainer_view("gdpo", gdpo_reward_keys=["acc", "fmt"]), batch)
    expected, _ = core_algos.compute_gdpo_outcome_advantage(
        rewards, mask, index, config={"gdpo_reward_keys": ["acc", "fmt"]}, non_tensor_batch=non_tensor, batch={}
    )
    torch.testing.assert_close(batch.batch["advantages"], expected)

    rewards, mask, index, old, spsq = _otb_hand_case()
    tensors = {"token_level_rewards": rewards, "response_mask": mask, "old_log_probs": old}
    batch = DataProto.from_dict(tensors={**tensors, "sum_pi_squared": spsq}, non_tensors={"uid": index})
    RayPPOTrainer._compute_advantage(_trainer_view("optimal_token_baseline"), batch)
    expected, _ = core_algos.compute_optimal_token_baseline_advantage(rewards, mask, index, old, spsq)
    torch.testing.assert_close(batch.batch["advantages"], expected)
    batch = DataProto.from_dict(tensors=tensors, non_tensors={"uid": index})  # the actor did not compute it
    with pytest.raises(ValueError, match="calculate_sum_pi_squared"):
        RayPPOTrainer._compute_advantage(_trainer_view("tir_optimal_token_baseline"), batch)
