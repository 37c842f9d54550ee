"""A discriminative reward model reads each row as veRL 0.9's reward loop feeds it: the prompt's messages
plus the response (decoded by the policy's tokenizer, EOS text removed) in the reward model's own chat
template and tokenizer, scored at the conversation's last token. Expected texts are written by hand for a
template written by hand; expected scores come from the model's body and head applied to one unpadded row."""

from __future__ import annotations

import copy
import os

import numpy as np
import pytest
import torch

from hybridflow.protocol import DataProto
from hybridflow.workers.reward_model_inputs import reward_model_texts, tokenize_right_padded

TAGGED = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}</{{ m['role'] }}>{% endfor %}"


def _response(tokenizer, text: str, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    ids = tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    row = torch.full((width,), tokenizer.pad_token_id, dtype=torch.long)
    row[: len(ids)] = torch.tensor(ids)
    mask = torch.zeros(width, dtype=torch.long)
    mask[: len(ids)] = 1
    return row, mask


def test_the_conversation_is_rendered_in_the_reward_models_template(tiny_tokenizer):
    rm_tokenizer = copy.deepcopy(tiny_tokenizer)
    rm_tokenizer.chat_template = TAGGED  # another template than the policy's
    rows = [_response(tiny_tokenizer, "4", 8), _response(tiny_tokenizer, "it is 5", 8)]
    responses, mask = torch.stack([r for r, _ in rows]), torch.stack([m for _, m in rows])
    prompts = [
        [{"role": "user", "content": "2+2?"}],
        [{"role": "system", "content": "be brief"}, {"role": "user", "content": "2+3?"}],
    ]
    texts = reward_model_texts(prompts, responses, mask, tiny_tokenizer, rm_tokenizer)
    assert texts == [
        "<user>2+2?</user><assistant>4</assistant>",
        "<system>be brief</system><user>2+3?</user><assistant>it is 5</assistant>",
    ]
    ids, attention = tokenize_right_padded(texts, rm_tokenizer, pad_id=0)
    first = rm_tokenizer(texts[0])["input_ids"]
    assert ids[0, : len(first)].tolist() == first and attention[0].sum() == len(first)
    assert attention[1].all() and ids.shape[1] == len(rm_tokenizer(texts[1])["input_ids"])
    with pytest.raises(ValueError, match="row 0: raw_prompt must be the prompt's chat messages"):
        reward_model_texts(["2+2?"], responses[:1], mask[:1], tiny_tokenizer, rm_tokenizer)
    rm_tokenizer.chat_template = (
        "{% for m in messages %}{% if m['role'] == 'system' %}{{ raise_exception('no system turns') }}{% endif %}"
        "{{ m['content'] }}{% endfor %}"
    )
    with pytest.raises(ValueError, match="row 1: the reward model's chat template failed .*no system turns"):
        reward_model_texts(prompts, responses, mask, tiny_tokenizer, rm_tokenizer)


def test_a_leading_bos_of_the_template_is_not_doubled(tiny_tokenizer):
    rm_tokenizer = copy.deepcopy(tiny_tokenizer)
    rm_tokenizer.chat_template = "{{ bos_token }}" + TAGGED
    rm_tokenizer.bos_token = "<|endoftext|>"
    response, mask = _response(tiny_tokenizer, "4", 4)
    (text,) = reward_model_texts(
        [[{"role": "user", "content": "q"}]], response[None], mask[None], tiny_tokenizer, rm_tokenizer
    )
    assert text == "<user>q</user><assistant>4</assistant>"


def _save_rm_with_template(tiny_model_dir, out: str) -> str:
    from transformers import AutoConfig, AutoTokenizer

    from hybridflow.models.tiny import build_tiny_model

    config = AutoConfig.from_pretrained(tiny_model_dir, num_labels=1)
    config.pad_token_id = None  # many reward models ship none; the worker must still batch
    model = build_tiny_model(config, seed=3, head="sequence_classification")
    torch.nn.init.normal_(model.score.weight, std=1.0, generator=torch.Generator().manual_seed(3))
    model.save_pretrained(out)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    tokenizer.chat_template = TAGGED
    tokenizer.save_pretrained(out)
    return out


@pytest.fixture
def worker_process(one_rank_group, restore_env):
    """A worker built in the test's process: its group (one rank) and the rendezvous variables it writes."""
    restore_env("MASTER_ADDR", "MASTER_PORT")


def test_the_worker_scores_each_conversation_at_its_last_token(
    tiny_model_dir, tiny_tokenizer, tmp_path, worker_process
):
    from transformers import AutoModelForSequenceClassification

    from hybridflow.workers.reward_model_worker import RewardModelWorker

    rm_dir = _save_rm_with_template(tiny_model_dir, str(tmp_path / "rm"))
    config = {"model": {"path": rm_dir}, "micro_batch_size_per_gpu": 2}
    worker = RewardModelWorker(
        config, input_tokenizer=tiny_model_dir, input_tokenizer_key="actor_rollout_ref.model.path"
    )
    worker.init_model()

    answers = ["4", "it is 5", "six"]
    prompts = [[{"role": "user", "content": f"q{i}?"}] for i in range(3)]
    rows = [_response(tiny_tokenizer, a, 10) for a in answers]
    responses = torch.stack([r for r, _ in rows])
    prompt_ids = torch.full((3, 6), tiny_tokenizer.pad_token_id)  # the policy's prompt: left-padded, unused by the RM
    prompt_mask = torch.ones(3, 6, dtype=torch.long)
    data = DataProto.from_dict(
        tensors={
            "responses": responses,
            "input_ids": torch.cat([prompt_ids, responses], -1),
            "attention_mask": torch.cat([prompt_mask, torch.stack([m for _, m in rows])], -1),
        },
        non_tensors={"raw_prompt": np.array(prompts + [None], dtype=object)[:3]},
    )
    rm_scores = worker.compute_rm_score(data).batch["rm_scores"]

    rm = AutoModelForSequenceClassification.from_pretrained(rm_dir).eval()
    for i, answer in enumerate(answers):
        ids = torch.tensor([tiny_tokenizer(f"<user>q{i}?</user><assistant>{answer}</assistant>")["input_ids"]])
        with torch.no_grad():  # one unpadded row: the head on the body's last hidden state
            expected = rm.score(rm.model(input_ids=ids).last_hidden_state)[0, -1, -1]
        last = int(rows[i][1].sum()) - 1
        assert rm_scores[i].nonzero().flatten().tolist() == [last]
        torch.testing.assert_close(rm_scores[i, last], expected, rtol=1e-4, atol=1e-5)

    missing = DataProto.from_dict(tensors={k: data.batch[k] for k in ("responses", "input_ids", "attention_mask")})
    with pytest.raises(KeyError, match="this batch has no raw_prompt column"):
        worker.compute_rm_score(missing)


def test_a_reward_model_without_a_chat_template_is_named(tiny_model_dir, tmp_path, worker_process):
    from transformers import AutoTokenizer

    from hybridflow.workers.reward_model_worker import RewardModelWorker

    rm_dir = _save_rm_with_template(tiny_model_dir, str(tmp_path / "rm"))
    tokenizer = AutoTokenizer.from_pretrained(rm_dir)
    tokenizer.chat_template = None
    tokenizer.save_pretrained(rm_dir)
    for name in ("chat_template.jinja", "chat_template.json"):
        if os.path.exists(os.path.join(rm_dir, name)):
            os.remove(os.path.join(rm_dir, name))
    worker = RewardModelWorker({"model": {"path": rm_dir}, "micro_batch_size_per_gpu": 2})
    with pytest.raises(ValueError, match=r"reward.reward_model.model_path=.*: its tokenizer has no chat template"):
        worker.init_model()
