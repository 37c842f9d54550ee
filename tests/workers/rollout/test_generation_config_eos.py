"""The rollout worker stops where the model's generation config says: several EOS ids
(``generation_config.eos_token_id`` a list), a pad token different from EOS, or none at all (pad = EOS).

The second EOS id is a token the tiny model greedily emits mid-answer; with it in the generation
config, HF ``generate`` and the worker's rollout (RolloutHost, the trainer's engine host) both stop
there, the stop token is kept with mask 1 and everything after it is padding with mask 0."""

from __future__ import annotations

import json
import os
import shutil

import pytest
import torch

from hybridflow.rollout.sampling import model_eos_token_ids

EOS = 2  # the tiny tokenizer's <|im_end|>
N_NEW = 12


def _chat_ids(tok, question):
    return tok.apply_chat_template(
        [{"role": "user", "content": question}], add_generation_prompt=True, tokenize=True, return_dict=False
    )


def _hf_greedy(model_dir, ids):
    """HF generate with the folder's own generation config (what users compare against)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    with torch.no_grad():
        out = model.generate(
            torch.tensor([ids]), max_new_tokens=N_NEW, do_sample=False, top_k=None, top_p=None, temperature=None
        )
    tokens = out[0, len(ids) :].tolist()
    pad = model.generation_config.pad_token_id
    while tokens and pad is not None and tokens[-1] == pad and pad not in model_eos_token_ids(model_dir, None):
        tokens.pop()  # generate pads rows that stopped early
    return tokens


def _with_generation_config(src, dst, eos_ids, drop_pad=False):
    shutil.copytree(src, dst)
    with open(os.path.join(dst, "generation_config.json")) as f:
        cfg = json.load(f)
    cfg["eos_token_id"] = eos_ids
    with open(os.path.join(dst, "generation_config.json"), "w") as f:
        json.dump(cfg, f)
    if drop_pad:  # a tokenizer without a pad token (load_tokenizer falls back to EOS)
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(dst)
        tok.pad_token = None
        tok.save_pretrained(dst)
    return dst


def _worker_responses(model_dir, prompts):
    """(responses, response_mask, pad id) from RolloutHost.generate_sequences, hf rollout, greedy."""
    from hybridflow.config.loader import load_config
    from hybridflow.protocol import DataProto
    from hybridflow.trainer.generation import build_rollout_group
    from hybridflow.workers.model_loading import load_tokenizer

    tok = load_tokenizer(model_dir)
    config = load_config(
        "generation",
        [
            f"model.path={model_dir}",
            "trainer.backend=inprocess",
            "trainer.device=cpu",
            "rollout.prompt_length=32",
            f"rollout.response_length={N_NEW}",
            "rollout.do_sample=False",
        ],
    )
    width = max(map(len, prompts))
    ids = torch.tensor([[tok.pad_token_id] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    batch = DataProto.from_dict(
        {"input_ids": ids, "attention_mask": mask, "position_ids": (mask.cumsum(-1) - 1).clamp(min=0)}
    )
    batch.meta_info = {"pad_token_id": tok.pad_token_id}
    group, shutdown = build_rollout_group(config)
    try:
        group.init_model()
        out = group.generate_sequences(batch)
    finally:
        shutdown()
    return out.batch["responses"].tolist(), out.batch["response_mask"].tolist(), tok.pad_token_id


@pytest.fixture(scope="module")
def stop_case(tiny_model_dir, tiny_tokenizer):
    """(prompts, token, position): the token prompt 0's greedy answer first emits at ``position`` (a later
    position where the answer has one; the random tiny model often repeats one token throughout)."""
    prompts = [_chat_ids(tiny_tokenizer, q) for q in ("12+7=?", "3*4=?")]
    answer = _hf_greedy(tiny_model_dir, prompts[0])
    assert len(answer) == N_NEW and EOS not in answer  # else the case below proves nothing
    firsts = [(k, t) for k, t in enumerate(answer) if t not in answer[:k]]
    k, t = firsts[-1]
    return prompts, t, k


def test_the_eos_ids_come_from_the_generation_config(tiny_model_dir, tiny_tokenizer, tmp_path):
    two = _with_generation_config(tiny_model_dir, str(tmp_path / "two"), [7, EOS])
    assert model_eos_token_ids(two, tiny_tokenizer) == [7, EOS]
    one = _with_generation_config(tiny_model_dir, str(tmp_path / "one"), 9)
    assert model_eos_token_ids(one, tiny_tokenizer) == [9, EOS]  # the tokenizer's EOS too
    assert model_eos_token_ids(str(tmp_path), tiny_tokenizer) == [EOS]  # no generation_config.json


@pytest.mark.parametrize("drop_pad", [False, True], ids=["pad-differs-from-eos", "no-pad-token"])
def test_the_rollout_stops_at_any_generation_config_eos(tiny_model_dir, stop_case, tmp_path, drop_pad):
    prompts, token, k = stop_case
    model = _with_generation_config(tiny_model_dir, str(tmp_path / "m"), [EOS, token], drop_pad=drop_pad)
    expected = _hf_greedy(model, prompts[0])
    assert expected[-1] == token and len(expected) == k + 1 < N_NEW  # HF generate stops at the second id
    responses, masks, pad = _worker_responses(model, prompts)
    assert pad == (EOS if drop_pad else 0)
    assert responses[0][: k + 1] == expected  # the stop token is kept ...
    assert masks[0] == [1] * (k + 1) + [0] * (N_NEW - k - 1)  # ... with mask 1, nothing after it counts
    assert responses[0][k + 1 :] == [pad] * (N_NEW - k - 1)
    other = _hf_greedy(model, prompts[1])
    n = sum(masks[1])
    assert responses[1][:n] == other and n == len(other)  # the other row follows the same rule
