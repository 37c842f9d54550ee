"""The veRL parity script's comparison helpers, run on hybridflow's functions only (veRL is not
installed here): a function compared with itself is at 0, a changed formula or a missing metric is
caught, and the table marks what only one side registers."""

import math

import torch

from hybridflow.devtools import verl_parity as vp
from hybridflow.trainer.ppo import core_algos


def _ours_both_sides(info):
    cfg = {**vp.ACTOR, "global_batch_info": dict(info or {})}
    return cfg, cfg


LOSSES = {name: core_algos.get_policy_loss_fn(name) for name in ("vanilla", "cispo", "clip_cov", "geo_mean")}
ESTIMATORS = {name: core_algos.get_adv_estimator_fn(name) for name in ("grpo", "gdpo", "tir_optimal_token_baseline")}


def test_a_function_against_itself_is_exact_and_the_table_lists_one_sided_names():
    theirs = {**LOSSES, "bypass_mode": LOSSES["vanilla"]}
    rows = vp.compare(
        LOSSES, theirs, ESTIMATORS, ESTIMATORS, _ours_both_sides, lambda: (vp.ALGORITHM, vp.ALGORITHM), seeds=[0]
    )
    diffs = {name: diff for _, name, diff in rows}
    assert math.isnan(diffs.pop("bypass_mode"))  # registered on one side only
    assert diffs.pop("geo_mean (global batch info)") == 0.0  # its own row (a deviation from veRL on purpose)
    assert set(diffs) == set(LOSSES) | set(ESTIMATORS) and all(d == 0.0 for d in diffs.values()), diffs
    table = vp.format_table(rows)
    assert "| policy loss | cispo | 0.00e+00 | yes |" in table and "only one side registers it" in table


def test_a_changed_formula_or_metric_is_caught():
    cispo = LOSSES["cispo"]

    def scaled(*args):  # the same loss, 1% larger
        loss, metrics = cispo(*args)
        return loss * 1.01, metrics

    def fewer_metrics(*args):
        loss, metrics = cispo(*args)
        return loss, {k: v for k, v in metrics.items() if k != "actor/pg_clipfrac_lower"}

    for other, check in ((scaled, lambda d: 0 < d < math.inf), (fewer_metrics, math.isinf)):
        rows = vp.compare({"cispo": cispo}, {"cispo": other}, {}, {}, _ours_both_sides, lambda: ({}, {}), seeds=[0])
        assert check(rows[0][2]) and "NO" in vp.format_table(rows)


def test_random_cases_hit_the_branches_the_losses_have():
    case = vp.random_case(0, multi_turn=True)
    mask = case["response_mask"]
    ratio = torch.exp(case["log_prob"] - case["old_log_prob"])[mask.bool()]
    assert (ratio > 1.28).any() and (ratio < 0.8).any() and ((ratio > 0.8) & (ratio < 1.28)).any()
    assert (case["log_prob"] < 0).all()  # probabilities, as dppo needs
    assert (mask.sum(-1) < mask.shape[-1]).any() and (mask[:, 2:4] == 0).any()  # padding and tool spans
    groups = {uid: (case["index"] == uid).sum() for uid in case["index"]}
    assert 1 in groups.values() and max(groups.values()) > 1
    out = vp.estimator_outputs(
        "optimal_token_baseline", core_algos.get_adv_estimator_fn("optimal_token_baseline"), case, vp.ALGORITHM
    )
    assert out["advantages"].abs().sum() > 0
