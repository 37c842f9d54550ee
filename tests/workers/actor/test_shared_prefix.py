"""shared_prefix.py + dp_actor: a micro-batch that repeats its prompts (GRPO's n samples) runs each
distinct prompt once on a copied KV cache. Its log-probs, entropies and gradients must be those of the
ordinary padded forward and of a full forward written out here (sum_pi_squared too: sum_v p_v^2)."""

from __future__ import annotations

import copy

import pytest
import torch

from hybridflow.protocol import DataProto
from hybridflow.workers.actor import DataParallelPPOActor, shared_prefix
from tests.workers.actor.ppo_batch import PROMPT, RESPONSE, VOCAB, actor_config, tiny_causal_lm

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py

TEMPERATURE = 0.7


def _grpo_batch(prompt_lens, n, response_lens, seed=0, interleave=True) -> DataProto:
    """Distinct left-padded prompts repeated n times (DataProto.repeat; interleave=True, as GRPO does,
    puts a prompt's n copies next to each other, False tiles the whole batch),
    each row its own right-padded response (lengths ``response_lens``, one per row)."""
    gen = torch.Generator().manual_seed(seed)
    prompt_lens = torch.as_tensor(prompt_lens)
    prompt_mask = (torch.arange(PROMPT) >= PROMPT - prompt_lens[:, None]).long()
    prompt_ids = torch.randint(1, VOCAB, (len(prompt_lens), PROMPT), generator=gen) * prompt_mask
    prompts = DataProto.from_dict(tensors={"prompt_ids": prompt_ids, "prompt_mask": prompt_mask})
    rows = prompts.repeat(n, interleave=interleave)
    batch = len(rows)
    response_lens = torch.as_tensor(response_lens)
    assert len(response_lens) == batch
    response_mask = (torch.arange(RESPONSE) < response_lens[:, None]).long()
    responses = torch.randint(1, VOCAB, (batch, RESPONSE), generator=gen) * response_mask
    attention_mask = torch.cat([rows.batch["prompt_mask"], response_mask], 1)
    input_ids = torch.cat([rows.batch["prompt_ids"], responses], 1)
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    return DataProto.from_dict(
        tensors={
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "position_ids": position_ids,
            "responses": responses,
            "response_mask": response_mask,
        }
    )


def _reference(model, data, weights):
    """Full-width forward, log-softmax at the positions that predict the responses; and the loss."""
    b = data.batch
    logits = (
        model(input_ids=b["input_ids"], attention_mask=b["attention_mask"], position_ids=b["position_ids"]).logits[
            :, PROMPT - 1 : -1
        ]
        / TEMPERATURE
    )
    logp_all = torch.log_softmax(logits.float(), -1)
    logp = logp_all.gather(-1, b["responses"][..., None]).squeeze(-1)
    entropy = -(logp_all.exp() * logp_all).sum(-1)
    return logp, entropy, (logp_all.exp() ** 2).sum(-1)


def _loss(logp, entropy, data, weights):
    mask = data.batch["response_mask"].float()
    return ((logp * weights + 0.1 * entropy) * mask).sum()


def _run(actor, data, weights):
    actor.actor_module.zero_grad()
    logp, entropy, sum_pi_sq = actor._forward_micro_batch(
        data, TEMPERATURE, calculate_entropy=True, calculate_sum_pi_squared=True
    )
    _loss(logp, entropy, data, weights).backward()
    grads = [p.grad.detach().clone() for p in actor.actor_module.parameters()]
    return logp.detach(), entropy.detach(), grads, sum_pi_sq.detach()


def _compare(data, expect_shared: bool, monkeypatch):
    base = tiny_causal_lm(seed=3)
    weights = torch.randn(data.batch["responses"].shape, generator=torch.Generator().manual_seed(5))
    mask = data.batch["response_mask"].bool()

    calls = []
    real = shared_prefix.response_log_probs
    monkeypatch.setattr(shared_prefix, "response_log_probs", lambda *a, **k: calls.append(1) or real(*a, **k))

    model = copy.deepcopy(base)
    actor = DataParallelPPOActor(actor_config(), model, torch.optim.SGD(model.parameters(), lr=0.1))
    assert actor._shared_prefix  # a plain transformers LM: the optimisation is on
    fast_logp, fast_ent, fast_grads, fast_sq = _run(actor, data, weights)
    assert bool(calls) == expect_shared, calls

    plain_model = copy.deepcopy(base)
    plain = DataParallelPPOActor(actor_config(), plain_model, torch.optim.SGD(plain_model.parameters(), lr=0.1))
    plain._shared_prefix = False  # the switch dp_actor reads: the ordinary padded forward
    calls.clear()
    plain_logp, plain_ent, plain_grads, plain_sq = _run(plain, data, weights)
    assert not calls

    ref_model = copy.deepcopy(base)
    ref_model.zero_grad()
    ref_logp, ref_ent, ref_sq = _reference(ref_model, data, weights)
    _loss(ref_logp, ref_ent, data, weights).backward()
    ref_grads = [p.grad for p in ref_model.parameters()]

    for name, (logp, ent, grads, sq) in {
        "shared": (fast_logp, fast_ent, fast_grads, fast_sq),
        "plain": (plain_logp, plain_ent, plain_grads, plain_sq),
    }.items():
        assert logp.shape == ent.shape == sq.shape == mask.shape, name
        torch.testing.assert_close(sq[mask], ref_sq.detach()[mask], atol=1e-6, rtol=0, msg=name)
        torch.testing.assert_close(logp[mask], ref_logp.detach()[mask], atol=1e-5, rtol=0, msg=name)
        torch.testing.assert_close(ent[mask], ref_ent.detach()[mask], atol=1e-5, rtol=0, msg=name)
        worst = max(((g - r).norm() / r.norm().clamp(min=1e-12)).item() for g, r in zip(grads, ref_grads, strict=True))
        assert worst < 1e-5, f"{name}: worst relative gradient difference {worst:.2e}"
    torch.testing.assert_close(fast_logp[mask], plain_logp[mask], atol=1e-5, rtol=0)
    assert ref_logp.abs().max() > 0.1 and max(g.abs().max() for g in ref_grads) > 1e-3  # not trivially zero


@pytest.mark.parametrize("interleave", [True, False])
def test_grpo_repeats_take_the_shared_path_and_match(interleave, monkeypatch):
    # 3 prompts of lengths 6, 3, 1 (left padding), n = 4; responses of 1..5 tokens
    data = _grpo_batch([6, 3, 1], n=4, response_lens=[5, 2, 4, 1, 3, 3, 5, 1, 2, 4, 2, 3], interleave=interleave)
    ids = data.batch["input_ids"][:, :PROMPT]
    if interleave:  # GRPO's order: a prompt's n samples next to each other
        assert torch.equal(ids[0], ids[3]) and not torch.equal(ids[0], ids[4])
    else:
        assert torch.equal(ids[0], ids[3]) and not torch.equal(ids[0], ids[1])
    _compare(data, expect_shared=True, monkeypatch=monkeypatch)


def test_repeats_with_shared_padding_on_both_sides(monkeypatch):
    # every prompt left-padded by >= 2 and every response right-padded by >= 1: both cuts happen
    data = _grpo_batch([4, 2], n=3, response_lens=[3, 1, 4, 2, 4, 3])
    assert not data.batch["attention_mask"][:, :2].any() and not data.batch["attention_mask"][:, -1].any()
    _compare(data, expect_shared=True, monkeypatch=monkeypatch)


def test_shuffled_repeats(monkeypatch):
    data = _grpo_batch([5, 2, 6], n=3, response_lens=[5, 1, 2, 3, 4, 5, 2, 2, 1])
    order = torch.randperm(len(data), generator=torch.Generator().manual_seed(1))
    _compare(data.select_idxs(order), expect_shared=True, monkeypatch=monkeypatch)


def test_no_repeats_take_the_ordinary_path_and_match(monkeypatch):
    data = _grpo_batch([6, 3, 1, 4, 2], n=1, response_lens=[5, 2, 4, 1, 3])
    _compare(data, expect_shared=False, monkeypatch=monkeypatch)


def test_too_few_repeats_take_the_ordinary_path(monkeypatch):
    # 4 distinct prompts in 6 rows: fewer than MIN_ROWS_PER_PROMPT rows per prompt on average
    data = _grpo_batch([6, 3, 1, 4], n=2, response_lens=[5, 2, 4, 1, 3, 3, 1, 2])
    data = data[torch.tensor([0, 1, 2, 4, 6, 7])]
    assert shared_prefix.prompt_groups(data.batch["input_ids"], data.batch["attention_mask"], PROMPT) is None
    _compare(data, expect_shared=False, monkeypatch=monkeypatch)


def test_gradient_checkpointing_turns_the_shared_path_off():
    model = tiny_causal_lm()
    model.gradient_checkpointing_enable()
    assert not shared_prefix.usable(model)
    assert shared_prefix.usable(tiny_causal_lm())
