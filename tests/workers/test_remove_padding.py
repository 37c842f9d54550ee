"""Padding-free (packed) forward passes give the padded path's numbers, with no compute on pads."""

import copy

import pytest
import torch

from hybridflow.workers.actor import DataParallelPPOActor
from hybridflow.workers.utils.logprob import (
    forward_response_log_probs,
    forward_response_logits,
    forward_response_token_stats,
)
from hybridflow.workers.utils.remove_padding import check_packed_attention, pack_for, pack_rows, unpack
from tests.workers.actor.ppo_batch import (
    PROMPT,
    RESPONSE,
    actor_config,
    flat_params,
    padded_rows,
    ppo_batch,
    tiny_causal_lm,
    tiny_value_model,
)

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


# ragged on purpose: full prompt + full response, 1-token prompt, 1-token response, ...
PROMPT_LENS = [6, 1, 3, 6, 2, 4]
RESPONSE_LENS = [5, 5, 1, 2, 3, 4]


def _rows():
    return padded_rows(len(PROMPT_LENS), seed=3, prompt_lens=PROMPT_LENS, response_lens=RESPONSE_LENS)


def test_pack_and_unpack_hand_example():
    # row 0: [pad a b | c pad], row 1: [d e f | g h]  -> packed a b c d e f g h
    attention_mask = torch.tensor([[0, 1, 1, 1, 0], [1, 1, 1, 1, 1]])
    input_ids = torch.tensor([[0, 11, 12, 13, 0], [14, 15, 16, 17, 18]])
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    packed = pack_rows(input_ids, attention_mask, position_ids)
    assert packed.input_ids.tolist() == [[11, 12, 13, 14, 15, 16, 17, 18]]
    assert packed.position_ids.tolist() == [[0, 1, 2, 0, 1, 2, 3, 4]]
    assert packed.indices.tolist() == [1, 2, 3, 5, 6, 7, 8, 9]  # b * 5 + s
    assert packed.cu_seqlens.tolist() == [0, 3, 8] and packed.max_seqlen == 5
    back = unpack(packed.input_ids, packed)
    assert torch.equal(back, input_ids)  # pads come back as 0


def test_bin_packing_hand_example():
    # lengths 2, 4, 1, 3 -> rows of width 4, longest first: [seq1], [seq3 seq2], [seq0 + a 2-token tail]
    attention_mask = torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1], [0, 0, 0, 1], [0, 1, 1, 1]])
    input_ids = torch.arange(1, 17).view(4, 4) * attention_mask
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    packed = pack_rows(input_ids, attention_mask, position_ids, one_row=False)
    assert packed.input_ids.tolist() == [[5, 6, 7, 8], [14, 15, 16, 12], [3, 4, 0, 0]]
    assert packed.position_ids.tolist() == [[0, 1, 2, 3], [0, 1, 2, 0], [0, 1, 0, 1]]  # the tail restarts at 0
    assert packed.slots.tolist() == [8, 9, 0, 1, 2, 3, 7, 4, 5, 6]  # token order: seq0, seq1, seq2, seq3
    assert torch.equal(unpack(packed.input_ids, packed), input_ids)
    # the same tokens in one row, for a variable-length kernel
    one = pack_rows(input_ids, attention_mask, position_ids, one_row=True)
    assert one.input_ids.tolist() == [[3, 4, 5, 6, 7, 8, 12, 14, 15, 16]] and one.slots.tolist() == list(range(10))


def test_the_layout_follows_the_attention_kernel():
    rows = _rows()
    model = tiny_causal_lm()
    model.config._attn_implementation = "sdpa"
    dense = pack_for(model, rows["input_ids"], rows["attention_mask"], rows["position_ids"])
    lengths = rows["attention_mask"].sum(-1)
    # as wide as the longest sequence, fewer rows than the batch, every slot used at most once
    assert dense.input_ids.size(1) == int(lengths.max()) and dense.input_ids.size(0) < len(lengths)
    assert dense.slots.unique().numel() == int(lengths.sum())
    model.config._attn_implementation = "flash_attention_2"
    assert pack_for(model, rows["input_ids"], rows["attention_mask"], rows["position_ids"]).input_ids.size(0) == 1


def test_position_ids_that_do_not_restart_are_rejected():
    attention_mask = torch.ones(2, 3, dtype=torch.long)
    input_ids = torch.ones(2, 3, dtype=torch.long)
    position_ids = torch.tensor([[0, 1, 2], [3, 4, 5]])  # row 1 continues row 0: indistinguishable when packed
    with pytest.raises(ValueError, match="position_ids must count"):
        pack_rows(input_ids, attention_mask, position_ids)


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_log_probs_entropy_and_gradients_match_padded(attn):
    base = tiny_causal_lm()
    base.config._attn_implementation = attn
    rows = _rows()
    mask = rows["response_mask"].bool()
    weights = torch.randn(mask.shape, generator=torch.Generator().manual_seed(0))
    results = {}
    for packed in (False, True):
        model = copy.deepcopy(base)
        log_probs, entropy = forward_response_log_probs(
            model,
            rows["input_ids"],
            rows["attention_mask"],
            rows["position_ids"],
            RESPONSE,
            temperature=0.7,
            calculate_entropy=True,
            use_remove_padding=packed,
        )
        # a loss that touches every valid response token (log prob and entropy)
        ((log_probs + 0.1 * entropy) * weights * mask).sum().backward()
        results[packed] = (log_probs.detach(), entropy.detach(), {n: p.grad for n, p in model.named_parameters()})

    (lp0, ent0, g0), (lp1, ent1, g1) = results[False], results[True]
    torch.testing.assert_close(lp1[mask], lp0[mask], atol=1e-5, rtol=0)
    torch.testing.assert_close(ent1[mask], ent0[mask], atol=1e-5, rtol=0)
    assert (lp1[~mask] == 0).all() and (ent1[~mask] == 0).all()  # pads are scattered back as zeros
    for name in g0:
        torch.testing.assert_close(g1[name], g0[name], atol=1e-5, rtol=1e-4, msg=name)


def test_sum_pi_squared_packed_equals_padded_and_the_softmax():
    # sum_v p_v^2 of the temperature-scaled distribution, from the packed and the padded forward,
    # against softmax(logits / T)^2 summed by hand
    model = tiny_causal_lm()
    rows = _rows()
    mask = rows["response_mask"].bool()
    args = (model, rows["input_ids"], rows["attention_mask"], rows["position_ids"], RESPONSE)
    with torch.no_grad():
        probs = torch.softmax(forward_response_logits(*args) / 0.7, dim=-1)  # (B, R, V)
        expected = (probs * probs).sum(-1)
        for packed in (False, True):
            log_probs, entropy, sum_pi_sq = forward_response_token_stats(
                *args, temperature=0.7, calculate_sum_pi_squared=True, use_remove_padding=packed
            )
            assert entropy is None and log_probs.shape == sum_pi_sq.shape
            torch.testing.assert_close(sum_pi_sq[mask], expected[mask], atol=1e-6, rtol=0)
    assert float(expected[mask].min()) > 1 / probs.shape[-1] - 1e-6  # >= 1/V: not trivially zero


def test_padded_forward_projects_only_the_positions_that_predict_the_response():
    # the lm_head sees the R positions per row that predict a response token (not the prompt's, not the last),
    # the logits come out contiguous (no copy to flatten them, no zero-filled gradient of a wider slice), and
    # they are the full forward's
    model = tiny_causal_lm()
    rows = _rows()
    seen = []
    hook = model.lm_head.register_forward_hook(lambda _m, inputs, _out: seen.append(inputs[0].shape[1]))
    try:
        with torch.no_grad():
            logits = forward_response_logits(
                model, rows["input_ids"], rows["attention_mask"], rows["position_ids"], RESPONSE
            )
            full = model(
                input_ids=rows["input_ids"], attention_mask=rows["attention_mask"], position_ids=rows["position_ids"]
            ).logits
    finally:
        hook.remove()
    assert rows["input_ids"].shape[1] == PROMPT + RESPONSE and PROMPT > 1
    assert seen == [RESPONSE, PROMPT + RESPONSE]  # ours, then the reference's full projection
    assert logits.is_contiguous()
    torch.testing.assert_close(logits, full[:, -RESPONSE - 1 : -1, :], atol=1e-6, rtol=0)


def test_critic_values_and_gradients_match_padded():
    base = tiny_value_model(pad_token_id=0)  # head dropout off, as CriticWorker: deterministic values
    rows = _rows()
    mask = rows["response_mask"].bool()
    out = {}
    for packed in (False, True):
        model = copy.deepcopy(base)
        values = forward_response_logits(
            model, rows["input_ids"], rows["attention_mask"], rows["position_ids"], RESPONSE, use_remove_padding=packed
        ).squeeze(-1)  # (B, R)
        (values * mask).pow(2).sum().backward()
        out[packed] = (values.detach(), {n: p.grad for n, p in model.named_parameters()})
    torch.testing.assert_close(out[True][0][mask], out[False][0][mask], atol=1e-5, rtol=0)
    assert (out[True][0][~mask] == 0).all()
    for name, grad in out[False][1].items():
        torch.testing.assert_close(out[True][1][name], grad, atol=1e-5, rtol=1e-4, msg=name)


def test_actor_update_with_remove_padding_equals_padded_update():
    base = tiny_causal_lm()
    data = ppo_batch(base, batch_size=8)
    models = {}
    for packed in (False, True):
        model = copy.deepcopy(base)
        config = actor_config(
            ppo_micro_batch_size_per_gpu=3, entropy_coeff=0.01, use_kl_loss=True, use_remove_padding=packed
        )
        DataParallelPPOActor(config, model, torch.optim.SGD(model.parameters(), lr=0.5)).update_policy(data)
        models[packed] = model
    assert (flat_params(models[False]) - flat_params(base)).abs().max() > 1e-3  # the step moved the weights
    assert (flat_params(models[True]) - flat_params(models[False])).abs().max() < 1e-5


class _DropsPositionIds(torch.nn.Module):
    """A model that ignores position ids: packing by position ids cannot work, attention leaks."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner
        self.config = inner.config

    def forward(self, input_ids, position_ids=None, attention_mask=None, **kwargs):
        return self.inner(input_ids=input_ids, attention_mask=attention_mask, **kwargs)


def test_a_model_that_attends_across_packed_sequences_is_refused():
    check_packed_attention(tiny_causal_lm())  # a plain HF model passes
    with pytest.raises(RuntimeError, match="attends across packed sequences"):
        check_packed_attention(_DropsPositionIds(tiny_causal_lm()))
    rows = _rows()
    with pytest.raises(RuntimeError, match="attends across packed sequences"):
        forward_response_log_probs(
            _DropsPositionIds(tiny_causal_lm()),
            rows["input_ids"],
            rows["attention_mask"],
            rows["position_ids"],
            RESPONSE,
            use_remove_padding=True,
        )
    assert PROMPT + RESPONSE == rows["input_ids"].shape[1]
