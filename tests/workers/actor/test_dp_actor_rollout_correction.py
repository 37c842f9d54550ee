"""The actor's side of rollout correction: the driver's importance weights scale the per-token policy
loss (decoupled mode), and bypass mode (settings in meta_info) weights/masks per micro-batch from the
current log-probs against the rollout's. Checked against full-batch SGD steps written from the formulas."""

import copy

import pytest
import torch

from hybridflow.config.rollout_correction import RolloutCorrectionConfig
from hybridflow.workers.actor import DataParallelPPOActor
from tests.workers.actor.ppo_batch import PROMPT, actor_config, flat_params, ppo_batch, tiny_causal_lm

LR = 0.5


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


def _log_probs(model, data):
    b = data.batch
    logits = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"], position_ids=b["position_ids"]).logits
    logp_all = torch.log_softmax(logits[:, PROMPT - 1 : -1], dim=-1)  # (B, R, V)
    return logp_all.gather(-1, b["responses"].unsqueeze(-1)).squeeze(-1)  # (B, R)


def _sgd(model, loss):
    loss.backward()
    with torch.no_grad():
        for p in model.parameters():
            p -= LR * p.grad


def _clipped_ppo(logp, old, adv, clip=0.2, clip_c=3.0):
    ratio = torch.exp(logp - old)
    pg = torch.maximum(-adv * ratio, -adv * ratio.clamp(1 - clip, 1 + clip))
    return torch.where(adv < 0, torch.minimum(pg, -adv * clip_c), pg)


def _splits():
    return {"8 x 1": {"ppo_micro_batch_size_per_gpu": 8}, "1 x 8": {"ppo_micro_batch_size_per_gpu": 1}}


def test_decoupled_weights_scale_each_tokens_loss():
    base = tiny_causal_lm()
    data = ppo_batch(base)
    gen = torch.Generator().manual_seed(5)
    weights = torch.rand(data.batch["advantages"].shape, generator=gen) * 2  # any non-negative weights
    data.batch["rollout_is_weights"] = weights

    reference = copy.deepcopy(base)  # token-mean of w * clipped-PPO loss
    mask = data.batch["response_mask"].float()
    per_token = weights * _clipped_ppo(
        _log_probs(reference, data), data.batch["old_log_probs"], data.batch["advantages"]
    )
    _sgd(reference, (per_token * mask).sum() / mask.sum())

    unweighted = copy.deepcopy(base)
    plain = copy.deepcopy(data)
    plain.batch.pop("rollout_is_weights")
    DataParallelPPOActor(actor_config(), unweighted, torch.optim.SGD(unweighted.parameters(), lr=LR)).update_policy(
        plain
    )

    for name, split in _splits().items():
        model = copy.deepcopy(base)
        DataParallelPPOActor(actor_config(**split), model, torch.optim.SGD(model.parameters(), lr=LR)).update_policy(
            data
        )
        assert (flat_params(model) - flat_params(reference)).abs().max() < 1e-5, name
    assert (flat_params(unweighted) - flat_params(reference)).abs().max() > 1e-3  # the weights mattered


@pytest.mark.parametrize("loss_type", ["reinforce", "ppo_clip"])
def test_bypass_mode_weights_and_masks_from_the_current_policy(loss_type):
    base = tiny_causal_lm()
    data = ppo_batch(base, noise=0.5)  # old_log_probs play π_rollout: the engine's, never recomputed
    rollout = data.batch["old_log_probs"]
    settings = RolloutCorrectionConfig(
        rollout_is="token",
        rollout_is_threshold=1.5,
        bypass_mode=True,
        loss_type=loss_type,
        rollout_rs="token_k1",
        rollout_rs_threshold=3.0,
    )
    data.meta_info["rollout_correction"] = settings

    reference = copy.deepcopy(base)
    logp = _log_probs(reference, data)
    mask = data.batch["response_mask"].float()
    r = torch.exp(logp.detach() - rollout)
    kept = mask * ((r >= 1 / 3) & (r <= 3)).float()  # token_k1 at 3: π_θ/π_rollout in [1/3, 3]
    adv = data.batch["advantages"]
    if loss_type == "reinforce":
        per_token = -r.clamp(max=1.5) * adv * logp  # truncated weight, detached
    else:
        per_token = _clipped_ppo(logp, rollout, adv)  # the ratio is the importance ratio: no weight
    assert 0 < (mask - kept).sum() < mask.sum()  # some, not all, tokens rejected
    _sgd(reference, (per_token * kept).sum() / mask.sum())  # rejected tokens leave the numerator only

    for name, split in _splits().items():
        model = copy.deepcopy(base)
        actor = DataParallelPPOActor(actor_config(**split), model, torch.optim.SGD(model.parameters(), lr=LR))
        metrics = actor.update_policy(copy.deepcopy(data))
        assert (flat_params(model) - flat_params(reference)).abs().max() < 1e-5, name
        masked = metrics["rollout_corr/rollout_rs_masked_fraction"][0]
        assert masked == pytest.approx(float((mask - kept).sum() / mask.sum()), abs=1e-6), name
        assert metrics["rollout_corr/rollout_is_mean"][0] > 0 and "rollout_corr/kl" in metrics
