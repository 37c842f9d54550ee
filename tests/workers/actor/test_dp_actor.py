import copy
import math

import pytest
import torch

from hybridflow.workers.actor import DataParallelPPOActor
from tests.workers.actor.ppo_batch import PROMPT, actor_config, flat_params, ppo_batch, tiny_causal_lm

LR = 0.5


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


def _reference_sgd_step(model, data, loss_agg_mode, entropy_coeff, kl_coef, clip=0.2, clip_c=3.0):
    """Full-batch PPO step written from the formulas, independent of hybridflow's code."""
    b = data.batch
    logits = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"], position_ids=b["position_ids"]).logits
    logp_all = torch.log_softmax(logits[:, PROMPT - 1 : -1], dim=-1)  # (B, R, V): positions that predict the response
    logp = logp_all.gather(-1, b["responses"].unsqueeze(-1)).squeeze(-1)  # (B, R)
    adv, mask = b["advantages"], b["response_mask"].float()
    ratio = torch.exp(logp - b["old_log_probs"])
    pg = torch.maximum(-adv * ratio, -adv * ratio.clamp(1 - clip, 1 + clip))
    pg = torch.where(adv < 0, torch.minimum(pg, -adv * clip_c), pg)  # dual clip
    entropy = -(logp_all.exp() * logp_all).sum(-1)
    x = b["ref_log_prob"] - logp
    kl = torch.exp(x) - x - 1  # k3 / low_var_kl
    per_token = pg - entropy_coeff * entropy + kl_coef * kl  # every aggregation is linear, so add first
    if loss_agg_mode == "token-mean":
        loss = (per_token * mask).sum() / mask.sum()
    else:  # seq-mean-token-mean
        loss = ((per_token * mask).sum(-1) / mask.sum(-1)).mean()
    loss.backward()
    with torch.no_grad():
        for p in model.parameters():
            p -= LR * p.grad
    return loss.item()


@pytest.mark.parametrize("loss_agg_mode", ["token-mean", "seq-mean-token-mean"])
def test_update_equals_full_batch_step_for_any_micro_batching(loss_agg_mode):
    base = tiny_causal_lm()
    data = ppo_batch(base, batch_size=8)
    assert len(set(data.batch["response_mask"].sum(-1).tolist())) > 1  # uneven lengths: naive averaging would differ

    reference = copy.deepcopy(base)
    ref_loss = _reference_sgd_step(reference, data, loss_agg_mode, entropy_coeff=0.01, kl_coef=0.1)

    splits = {
        "8 x 1": {"ppo_micro_batch_size_per_gpu": 8},
        "1 x 8": {"ppo_micro_batch_size_per_gpu": 1},
        "token budget": {"use_dynamic_bsz": True, "ppo_max_token_len_per_gpu": 16},  # rows have up to 11 tokens
    }
    for name, split in splits.items():
        model = copy.deepcopy(base)
        config = actor_config(
            loss_agg_mode=loss_agg_mode, entropy_coeff=0.01, use_kl_loss=True, kl_loss_coef=0.1, **split
        )
        actor = DataParallelPPOActor(config, model, torch.optim.SGD(model.parameters(), lr=LR))
        metrics = actor.update_policy(data)

        diff = (flat_params(model) - flat_params(reference)).abs().max().item()
        assert diff < 1e-5, f"{name}: max param diff {diff}"
        # the loss terms add up to the reference loss: pg - coeff * entropy + coef * kl
        total = metrics["actor/pg_loss"][0] - 0.01 * metrics["actor/entropy"][0] + 0.1 * metrics["actor/kl_loss"][0]
        assert total == pytest.approx(ref_loss, abs=1e-5), name
    assert (flat_params(reference) - flat_params(base)).abs().max() > 1e-3  # the step is not trivially small


def test_second_epoch_clips_and_first_does_not():
    model = tiny_causal_lm()
    data = ppo_batch(model, noise=0.0)  # old_log_probs are the current policy's: ratio 1 in epoch 1
    actor = DataParallelPPOActor(
        actor_config(ppo_epochs=2, ppo_micro_batch_size_per_gpu=4), model, torch.optim.Adam(model.parameters(), lr=0.05)
    )
    metrics = actor.update_policy(data)
    assert len(metrics["actor/pg_clipfrac"]) == 2
    assert metrics["actor/pg_clipfrac"][0] == 0.0 and abs(metrics["actor/ppo_kl"][0]) < 1e-5
    assert metrics["actor/pg_clipfrac"][1] > 0.0 and abs(metrics["actor/ppo_kl"][1]) > 1e-3


def test_nan_advantage_skips_the_step_and_recovers():
    model = tiny_causal_lm()
    data = ppo_batch(model)
    data.batch["advantages"][0, 0] = float("nan")  # response_mask[0, 0] is always 1
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    actor = DataParallelPPOActor(actor_config(ppo_micro_batch_size_per_gpu=4, grad_clip=1.0), model, optimizer)
    before = flat_params(model)

    metrics = actor.update_policy(data)
    assert torch.equal(flat_params(model), before)
    assert math.isnan(metrics["actor/grad_norm"][0]) and metrics["actor/skipped_steps"] == [1.0]
    assert not optimizer.state  # Adam never stepped: no moments polluted by NaN

    data.batch["advantages"][0, 0] = 0.0
    metrics = actor.update_policy(data)  # gradients were cleared: the next clean batch trains normally
    after = flat_params(model)
    assert metrics["actor/skipped_steps"] == [0.0] and math.isfinite(metrics["actor/grad_norm"][0])
    assert torch.isfinite(after).all() and not torch.equal(after, before)


def test_metrics_per_step_and_lr_once():
    model = tiny_causal_lm()
    data = ppo_batch(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 0.5)
    config = actor_config(
        ppo_mini_batch_size=4,
        ppo_micro_batch_size_per_gpu=2,
        ppo_epochs=2,
        shuffle=True,
        entropy_coeff=0.01,
        use_kl_loss=True,
    )
    metrics = DataParallelPPOActor(config, model, optimizer, scheduler).update_policy(data)
    per_step = [
        "actor/pg_loss",
        "actor/pg_clipfrac",
        "actor/ppo_kl",
        "actor/pg_clipfrac_lower",
        "actor/entropy",
        "actor/kl_loss",
        "actor/kl_coef",
        "actor/grad_norm",
        "actor/skipped_steps",
    ]
    assert sorted(metrics) == sorted(per_step + ["actor/lr"])
    assert all(len(metrics[k]) == 4 for k in per_step)  # 2 epochs x 2 mini-batches
    assert metrics["actor/lr"] == [0.05] and metrics["actor/kl_coef"] == [0.1] * 4
    assert all(isinstance(v, float) for vs in metrics.values() for v in vs)


def test_calculate_entropy_logs_the_updates_entropy_without_changing_the_update():
    """veRL's actor.calculate_entropy: with entropy_coeff 0 the update's entropy is a metric only (the same
    parameters after the step as without it), and it is the entropy of the policy the update starts from."""
    data = ppo_batch(tiny_causal_lm())
    results = {}
    for flag in (False, True):
        model = tiny_causal_lm()
        optimizer = torch.optim.SGD(model.parameters(), lr=LR)
        config = actor_config(calculate_entropy=flag)
        results[flag] = (DataParallelPPOActor(config, model, optimizer).update_policy(data), flat_params(model))
    (plain, after_plain), (logged, after_logged) = results[False], results[True]
    assert "actor/entropy" not in plain and len(logged["actor/entropy"]) == 1
    assert torch.equal(after_plain, after_logged)  # no gradient through the metric
    b = data.batch  # the entropy of the initial policy at the response positions, token-mean, written out here
    model = tiny_causal_lm()
    with torch.no_grad():
        logits = model(
            input_ids=b["input_ids"], attention_mask=b["attention_mask"], position_ids=b["position_ids"]
        ).logits
    logp = torch.log_softmax(logits[:, PROMPT - 1 : -1], dim=-1)
    entropy = -(logp.exp() * logp).sum(-1)
    mask = b["response_mask"].float()
    assert logged["actor/entropy"][0] == pytest.approx(((entropy * mask).sum() / mask.sum()).item(), rel=1e-5)


def test_compute_log_prob_any_split_same_result_in_order():
    model = tiny_causal_lm()
    data = ppo_batch(model, temperature=0.8, noise=0.0)
    actor = DataParallelPPOActor(actor_config(), model)
    data.meta_info.update(micro_batch_size=3)
    fixed, entropy, sum_pi_sq = actor.compute_log_prob(data, calculate_entropy=True, calculate_sum_pi_squared=True)
    data.meta_info.update(use_dynamic_bsz=True, max_token_len=16)
    dynamic, entropy_dynamic, sum_pi_sq_dynamic = actor.compute_log_prob(
        data, calculate_entropy=True, calculate_sum_pi_squared=True
    )
    # actor.calculate_sum_pi_squared: sum_v pi_v^2 >= pi_sampled^2 (one of its terms), <= 1, split-independent
    mask = data.batch["response_mask"].bool()
    assert (sum_pi_sq[mask] >= torch.exp(fixed[mask]) ** 2 - 1e-6).all() and (sum_pi_sq[mask] <= 1 + 1e-6).all()
    torch.testing.assert_close(sum_pi_sq_dynamic, sum_pi_sq, atol=1e-6, rtol=0)
    # old_log_probs were computed by one full-batch forward at the same temperature
    torch.testing.assert_close(fixed, data.batch["old_log_probs"], atol=1e-5, rtol=0)
    torch.testing.assert_close(dynamic, fixed, atol=1e-5, rtol=0)
    torch.testing.assert_close(entropy_dynamic, entropy, atol=1e-5, rtol=0)
    assert actor.compute_log_prob(data)[1] is None

    del data.meta_info["temperature"]
    with pytest.raises(KeyError, match="temperature"):
        actor.compute_log_prob(data)


def test_verl_style_custom_policy_loss_gets_global_batch_info():
    """A policy loss written for veRL 0.9.1 returns (loss, metrics dict) and normalises with
    ``config.global_batch_info``; under any micro-batching it must give the full-batch step."""
    from hybridflow.trainer.ppo import core_algos

    @core_algos.register_policy_loss("test_verl_style_plain_pg")
    def plain_pg(
        old_log_prob,
        log_prob,
        advantages,
        response_mask,
        loss_agg_mode="token-mean",
        config=None,
        rollout_is_weights=None,
    ):
        ratio = torch.exp(log_prob - old_log_prob)
        loss = core_algos.agg_loss(
            loss_mat=-advantages * ratio,
            loss_mask=response_mask,
            loss_agg_mode=loss_agg_mode,
            **config.global_batch_info,
        )
        return loss, {"actor/test_ratio_mean": core_algos.masked_mean(ratio, response_mask).detach().item()}

    try:
        base = tiny_causal_lm()
        data = ppo_batch(base, batch_size=8)
        # reference: one full-batch SGD step on token-mean(-A * ratio), written from the formula
        reference = copy.deepcopy(base)
        b = data.batch
        logits = reference(
            input_ids=b["input_ids"], attention_mask=b["attention_mask"], position_ids=b["position_ids"]
        ).logits
        logp = (
            torch.log_softmax(logits[:, PROMPT - 1 : -1], dim=-1).gather(-1, b["responses"].unsqueeze(-1)).squeeze(-1)
        )
        mask = b["response_mask"].float()
        ref_loss = ((-b["advantages"] * torch.exp(logp - b["old_log_probs"])) * mask).sum() / mask.sum()
        ref_loss.backward()
        with torch.no_grad():
            for p in reference.parameters():
                p -= LR * p.grad
        for micro in (8, 1, 3):
            model = copy.deepcopy(base)
            config = actor_config(
                ppo_micro_batch_size_per_gpu=micro, policy_loss={"loss_mode": "test_verl_style_plain_pg"}
            )
            actor = DataParallelPPOActor(config, model, torch.optim.SGD(model.parameters(), lr=LR))
            metrics = actor.update_policy(data)
            assert (flat_params(model) - flat_params(reference)).abs().max().item() < 1e-5, micro
            assert metrics["actor/pg_loss"][0] == pytest.approx(ref_loss.item(), abs=1e-5)
            assert "actor/test_ratio_mean" in metrics and "global_batch_info" not in config
    finally:
        core_algos.POLICY_LOSS_REGISTRY.pop("test_verl_style_plain_pg", None)
