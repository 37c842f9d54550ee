"""HFRollout (the batch facade over the hf server + single_turn_agent) on the tiny Qwen2 (vocab 100):
layout, masks, sampling controls, weight loading."""

from __future__ import annotations

import pytest
import torch
from rollout_test_utils import EOS_ID, PAD_ID, TEXTS, make_prompts, rollout_config, with_meta
from transformers import AutoModelForCausalLM, AutoTokenizer

from hybridflow.models.tiny import build_tiny_model
from hybridflow.workers.rollout import HFRollout

R = 8


@pytest.fixture(autouse=True)
def closed_after_the_test(monkeypatch):
    """Every HFRollout a test builds is closed after it (its loop and decode threads, its model copy)."""
    built, init = [], HFRollout.__init__

    def recording_init(self, *args, **kwargs):
        init(self, *args, **kwargs)
        built.append(self)

    monkeypatch.setattr(HFRollout, "__init__", recording_init)
    yield
    for rollout in built:
        rollout.close()


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir, padding_side="left")


@pytest.fixture
def model(tiny_model_dir):
    # function scope: some tests load other weights into it or change its generation_config
    return AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()


@pytest.fixture
def rollout(model):
    return HFRollout(model, rollout_config(response_length=R), pad_token_id=PAD_ID, eos_token_id=EOS_ID)


@pytest.fixture
def prompts(tokenizer):
    return make_prompts(tokenizer, meta_info={"step": 3})


def greedy(rollout, prompts, **meta):
    return rollout.generate_sequences(with_meta(prompts, do_sample=False, **meta))


def test_output_layout(rollout, prompts):
    out = rollout.generate_sequences(prompts)
    B, P = prompts.batch["input_ids"].shape
    assert set(out.batch.keys()) == {
        "prompts",
        "responses",
        "input_ids",
        "attention_mask",
        "position_ids",
        "response_mask",
        "rollout_log_probs",
    }
    assert out.batch["responses"].shape == (B, R)
    for key in ("input_ids", "attention_mask", "position_ids"):
        assert out.batch[key].shape == (B, P + R)
    assert torch.equal(out.batch["prompts"], prompts.batch["input_ids"])
    assert torch.equal(out.batch["input_ids"][:, :P], prompts.batch["input_ids"])
    assert torch.equal(out.batch["input_ids"][:, P:], out.batch["responses"])
    assert torch.equal(out.batch["attention_mask"][:, :P], prompts.batch["attention_mask"])
    # single turn: every response token is the model's own, so the loss mask is the response attention
    assert torch.equal(out.batch["response_mask"], out.batch["attention_mask"][:, P:])
    # input's non-tensor data and meta_info are kept; generated_tokens = number of response tokens
    assert list(out.non_tensor_batch["data_source"]) == [f"src{i}" for i in range(B)]
    assert out.meta_info["step"] == 3
    assert out.meta_info["generated_tokens"] == int(out.batch["attention_mask"][:, P:].sum())


def test_position_ids_continue_from_last_prompt_position(rollout, prompts):
    out = rollout.generate_sequences(prompts)
    P = prompts.batch["input_ids"].size(1)
    # left padding: a prompt of n real tokens has positions 0..n-1 at its end, so the j-th response
    # token (j = 0..R-1) sits at position n + j
    n = prompts.batch["attention_mask"].sum(-1, keepdim=True)  # (B, 1)
    expected = n + torch.arange(R)
    assert torch.equal(out.batch["position_ids"][:, P:], expected)
    assert torch.equal(out.batch["position_ids"][:, :P], prompts.batch["position_ids"])


def test_response_mask_through_first_eos_then_pad(rollout, prompts):
    P = prompts.batch["input_ids"].size(1)
    free = greedy(rollout, prompts, ignore_eos=True).batch["responses"]  # (B, R), runs to R
    # make the token that row 0 emits at step 2 the EOS: row 0 must stop right there
    eos = int(free[0, 2])
    first = (free[0] == eos).nonzero()[0].item()
    out = greedy(rollout, prompts, eos_token_id=eos)
    resp, mask = out.batch["responses"], out.batch["attention_mask"][:, P:]
    for row in range(free.size(0)):
        hits = (free[row] == eos).nonzero()
        end = hits[0].item() + 1 if len(hits) else R  # tokens up to and including the first EOS
        # greedy is unchanged up to the stop; everything after it is the pad id and masked out
        assert torch.equal(resp[row, :end], free[row, :end])
        assert (resp[row, end:] == PAD_ID).all()
        assert mask[row].tolist() == [1] * end + [0] * (R - end)
    assert mask[0].sum() == first + 1
    # ignore_eos: the same token no longer stops the row and every position counts
    out = greedy(rollout, prompts, eos_token_id=eos, ignore_eos=True)
    assert torch.equal(out.batch["responses"], free)
    assert (out.batch["attention_mask"][:, P:] == 1).all()


def test_pad_equal_to_eos_is_masked_after_first_eos(model, tokenizer):
    # Qwen base models use the same id for pad and eos: the mask must still stop at the first one
    prompts = make_prompts(tokenizer)
    free = greedy(HFRollout(model, rollout_config(), PAD_ID, EOS_ID), prompts, ignore_eos=True).batch["responses"]
    eos = int(free[0, 1])
    rollout = HFRollout(model, rollout_config(), pad_token_id=eos, eos_token_id=eos)
    out = greedy(rollout, prompts)
    P = prompts.batch["input_ids"].size(1)
    end = (free[0] == eos).nonzero()[0].item() + 1
    assert out.batch["attention_mask"][0, P:].tolist() == [1] * end + [0] * (R - end)
    assert (out.batch["responses"][0, end:] == eos).all()


def test_batched_left_padded_greedy_equals_each_prompt_alone(rollout, tokenizer, prompts):
    batched = greedy(rollout, prompts).batch["responses"]
    assert len({len(t) for t in TEXTS}) > 2  # the batch really mixes prompt lengths
    for i, text in enumerate(TEXTS):
        alone = greedy(rollout, make_prompts(tokenizer, [text])).batch["responses"]  # no padding at all
        assert torch.equal(batched[i], alone[0]), text


def test_greedy_tokens_are_the_argmax_of_the_model(model, rollout, prompts):
    # independent reference: a teacher-forced forward pass over prompt + response; the token at
    # response step t must be argmax of the logits at the position just before it
    out = greedy(rollout, prompts)
    P = prompts.batch["input_ids"].size(1)
    with torch.no_grad():
        logits = model(
            input_ids=out.batch["input_ids"],
            attention_mask=out.batch["attention_mask"],
            position_ids=out.batch["position_ids"],
        ).logits  # (B, P+R, V)
    argmax = logits[:, P - 1 : -1].argmax(-1)  # (B, R) predictions for each response token
    mask = out.batch["attention_mask"][:, P:].bool()
    assert torch.equal(argmax[mask], out.batch["responses"][mask])


def test_model_generation_config_cannot_shape_sampling(model, tokenizer):
    # a chat checkpoint's generation_config.json often sets these; the rollout must ignore them
    prompts = make_prompts(tokenizer)
    reference = HFRollout(model, rollout_config(), PAD_ID, EOS_ID)
    expected = reference.generate_sequences(prompts).batch["responses"]
    expected_greedy = greedy(reference, prompts).batch["responses"]
    gc = model.generation_config
    gc.top_k, gc.top_p, gc.repetition_penalty, gc.min_p, gc.no_repeat_ngram_size = 1, 0.1, 3.0, 0.9, 2
    shaped = HFRollout(model, rollout_config(), PAD_ID, EOS_ID)
    assert torch.equal(shaped.generate_sequences(prompts).batch["responses"], expected)
    assert torch.equal(greedy(shaped, prompts).batch["responses"], expected_greedy)


def test_sampling_controls_via_meta_info(rollout, prompts):
    g1 = greedy(rollout, prompts).batch["responses"]
    assert torch.equal(greedy(rollout, prompts).batch["responses"], g1)  # greedy is deterministic
    # temperature 0 means greedy even with do_sample=True
    assert torch.equal(rollout.generate_sequences(with_meta(prompts, temperature=0)).batch["responses"], g1)
    # top_k=1 sampling keeps only the argmax: the same tokens as greedy, whatever the draws
    top1 = rollout.generate_sequences(with_meta(prompts, top_k=1, temperature=1.3)).batch["responses"]
    assert torch.equal(top1, g1)
    # sampling is a function of the request ids (step + row) and the engine seed, not of torch's RNG
    torch.manual_seed(1)
    s1 = rollout.generate_sequences(with_meta(prompts, global_steps=1)).batch["responses"]
    torch.manual_seed(2)
    assert torch.equal(rollout.generate_sequences(with_meta(prompts, global_steps=1)).batch["responses"], s1)
    assert not torch.equal(rollout.generate_sequences(with_meta(prompts, global_steps=2)).batch["responses"], s1)
    other_seed = HFRollout(rollout.module, rollout_config(response_length=R, seed=7), PAD_ID, EOS_ID)
    assert not torch.equal(other_seed.generate_sequences(with_meta(prompts, global_steps=1)).batch["responses"], s1)
    assert not torch.equal(s1, g1)


def test_a_request_samples_the_same_tokens_whatever_its_batch(rollout, tokenizer, prompts):
    # row i of a batch is request "<step>:<i>": alone (as row 0 of a one-row batch with sample_offset i)
    # it must draw exactly the same tokens, so runs do not depend on how requests were grouped
    batched = rollout.generate_sequences(with_meta(prompts, global_steps=4)).batch["responses"]
    for i, text in enumerate(TEXTS):
        alone = rollout.generate_sequences(with_meta(make_prompts(tokenizer, [text]), global_steps=4, sample_offset=i))
        assert torch.equal(alone.batch["responses"][0], batched[i]), text


def test_top_k_restricts_every_sampled_token(model, rollout, prompts):
    out = rollout.generate_sequences(with_meta(prompts, top_k=3, temperature=2.0, response_length=6))
    P = prompts.batch["input_ids"].size(1)
    with torch.no_grad():
        logits = model(
            input_ids=out.batch["input_ids"],
            attention_mask=out.batch["attention_mask"],
            position_ids=out.batch["position_ids"],
        ).logits[:, P - 1 : -1]  # (B, 6, V)
    rank = (logits > logits.gather(-1, out.batch["responses"].unsqueeze(-1))).sum(-1)  # 0 = argmax
    mask = out.batch["attention_mask"][:, P:].bool()
    assert (rank[mask] < 3).all()
    assert (rank[mask] > 0).any()  # at temperature 2 not everything is the argmax


def test_validate_uses_val_kwargs(model, prompts):
    rollout = HFRollout(model, rollout_config(temperature=1.5), PAD_ID, EOS_ID)  # sampling for training
    g = greedy(rollout, prompts).batch["responses"]
    val = rollout.generate_sequences(with_meta(prompts, validate=True)).batch["responses"]
    assert torch.equal(val, g)  # val_kwargs: temperature 0, do_sample False


def test_response_length_cap(rollout, prompts):
    out = rollout.generate_sequences(with_meta(prompts, response_length=3, ignore_eos=True))
    P = prompts.batch["input_ids"].size(1)
    assert out.batch["responses"].shape == (len(TEXTS), 3)
    assert out.batch["input_ids"].shape == (len(TEXTS), P + 3)
    assert out.meta_info["generated_tokens"] == 3 * len(TEXTS)


def test_smaller_engine_batches_give_the_same_output(model, prompts):
    one_batch = HFRollout(model, rollout_config(), PAD_ID, EOS_ID)
    small = HFRollout(model, rollout_config(max_num_seqs=2), PAD_ID, EOS_ID)  # 6 rows -> 3 engine batches
    for meta in ({"do_sample": False}, {"global_steps": 3}):
        a = one_batch.generate_sequences(with_meta(prompts, **meta))
        b = small.generate_sequences(with_meta(prompts, **meta))
        for key in a.batch.keys():
            torch.testing.assert_close(a.batch[key], b.batch[key], msg=key)


def test_rollout_log_probs_are_the_models_at_the_sampling_temperature(model, rollout, prompts):
    # independent reference: teacher-forced log softmax(logits / T) of each sampled token
    out = rollout.generate_sequences(with_meta(prompts, temperature=1.7))
    P = prompts.batch["input_ids"].size(1)
    with torch.no_grad():
        logits = model(
            input_ids=out.batch["input_ids"],
            attention_mask=out.batch["attention_mask"],
            position_ids=out.batch["position_ids"],
        ).logits[:, P - 1 : -1]  # (B, R, V)
    expected = torch.log_softmax(logits / 1.7, -1).gather(-1, out.batch["responses"].unsqueeze(-1)).squeeze(-1)
    mask = out.batch["response_mask"].bool()
    torch.testing.assert_close(out.batch["rollout_log_probs"][mask], expected[mask], atol=1e-5, rtol=0)
    assert (out.batch["rollout_log_probs"][~mask] == 0).all()


def test_from_pretrained_loads_the_same_model(tiny_model_dir, rollout, prompts):
    loaded = HFRollout.from_pretrained(tiny_model_dir, rollout_config(), PAD_ID, EOS_ID)
    assert not loaded.module.training
    assert torch.equal(greedy(loaded, prompts).batch["responses"], greedy(rollout, prompts).batch["responses"])


def test_training_mode_is_restored(model, rollout, prompts):
    model.train()
    rollout.generate_sequences(prompts)
    assert model.training


def test_load_weights_switches_to_the_other_models_outputs(model, rollout, prompts):
    other = build_tiny_model(model.config, seed=1).eval()
    expected = greedy(HFRollout(other, rollout_config(), PAD_ID, EOS_ID), prompts).batch["responses"]
    before = greedy(rollout, prompts).batch["responses"]
    assert not torch.equal(before, expected)

    # the trainer's full state dict (tied lm_head/embedding may appear under one name or both)
    state = {k: v.clone() for k, v in other.state_dict().items()}
    assert rollout.load_weights(state) == len(state)
    assert torch.equal(greedy(rollout, prompts).batch["responses"], expected)

    # pairs work too, and deduplicated names (no lm_head.weight) still set the tied head
    rollout.load_weights((k, v) for k, v in build_tiny_model(model.config, seed=0).named_parameters())
    assert torch.equal(greedy(rollout, prompts).batch["responses"], before)


def test_load_weights_is_strict(model, rollout):
    state = model.state_dict()
    with pytest.raises(KeyError, match="not a tensor"):
        rollout.load_weights({**state, "model.extra.weight": torch.zeros(1)})
    partial = {k: v for k, v in state.items() if "layers.0." not in k}
    with pytest.raises(KeyError, match="no tensor"):
        rollout.load_weights(partial)
    bad = dict(state)
    bad["model.norm.weight"] = torch.zeros(3)
    with pytest.raises(ValueError, match="shape"):
        rollout.load_weights(bad)
