"""Multi-turn SFT rows (messages + tools): the token layout written out by hand, the loss on the
assistant turns only, the same tokens as tool_agent builds at RL time; main_sft picks this dataset for
conversation data (veRL's data.multiturn / data.messages_key spellings)."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from hybridflow.config.loader import load_config
from hybridflow.data.multiturn_sft_dataset import MultiTurnSFTDataset
from hybridflow.data.sft_dataset import SFTDataset
from hybridflow.trainer.sft_trainer import create_sft_dataset
from tests.agent_loop.chat_helpers import CALC_SCHEMA, EOS, TOK, calc_entry, call_text, ids, response_of, run
from tests.agent_loop.test_tool_agent import QUESTION, TOOLS_BLOCK, worker_for

CONVERSATION = [
    {"role": "user", "content": "What is 347*82?"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"type": "function", "function": {"name": "calc", "arguments": {"expr": "347*82"}}}],
    },
    {"role": "tool", "content": "28454"},
    {"role": "assistant", "content": "#### 28454"},
]


def write(tmp_path, rows, name="conv.parquet") -> str:
    path = str(tmp_path / name)
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def conversation_file(tmp_path, messages_key="messages") -> str:
    return write(tmp_path, [{messages_key: json.dumps(CONVERSATION), "tools": json.dumps([CALC_SCHEMA])}])


def unpadded(item) -> tuple[list[int], list[int]]:
    n = int(item["attention_mask"].sum())
    return item["input_ids"][:n].tolist(), item["loss_mask"][:n].tolist()


def test_layout_by_hand_loss_on_the_assistant_turns_only(tmp_path):
    item = MultiTurnSFTDataset(conversation_file(tmp_path), TOK, {"max_length": 400})[0]
    got, loss = unpadded(item)
    # the ChatML text of the conversation, cut where the model speaks: the prompt (tools block + user turn +
    # generation prompt), turn 1 (the call + <|im_end|>), the tool turn and the next generation prompt,
    # turn 2 ('#### 28454' + <|im_end|>), the template's closing '\n'
    prompt = ids(TOOLS_BLOCK + "<|im_start|>user\nWhat is 347*82?<|im_end|>\n<|im_start|>assistant\n")
    turn1 = ids(call_text("calc", expr="347*82")) + [EOS]
    tool = ids("\n<|im_start|>user\n<tool_response>\n28454\n</tool_response><|im_end|>\n<|im_start|>assistant\n")
    turn2 = ids("#### 28454") + [EOS]
    tail = ids("\n")
    assert got == prompt + turn1 + tool + turn2 + tail
    assert loss == [0] * len(prompt) + [1] * len(turn1) + [0] * len(tool) + [1] * len(turn2) + [0] * len(tail)
    assert item["input_ids"].shape[0] == 400 and item["loss_mask"][len(got) :].sum() == 0  # right padding


def test_the_sft_tokens_are_the_tokens_tool_agent_builds(tmp_path):
    """What SFT trains on is what the rollout produces for the same conversation (token-in-token-out)."""
    worker, _ = worker_for(tmp_path, [call_text("calc", expr="347*82"), "#### 28454"], tools=[calc_entry()])
    out = run(worker, [{"messages": QUESTION}])
    resp, mask = response_of(out)
    p = out.batch["prompts"].size(1)
    prompt_len = int(out.batch["attention_mask"][0, :p].sum())
    prompt = out.batch["prompts"][0, p - prompt_len :].tolist()
    got, loss = unpadded(MultiTurnSFTDataset(conversation_file(tmp_path), TOK, {"max_length": 400})[0])
    assert got[: prompt_len + len(resp)] == prompt + resp
    assert loss[: prompt_len + len(resp)] == [0] * prompt_len + mask


def test_truncation_and_bad_rows(tmp_path):
    path = conversation_file(tmp_path)
    with pytest.raises(ValueError, match="max_length=50; set data.truncation"):
        MultiTurnSFTDataset(path, TOK, {"max_length": 50})[0]
    full, _ = unpadded(MultiTurnSFTDataset(path, TOK, {"max_length": 400})[0])
    left, _ = unpadded(MultiTurnSFTDataset(path, TOK, {"max_length": 50, "truncation": "left"})[0])
    assert left == full[-50:]
    no_answer = write(tmp_path, [{"messages": json.dumps(CONVERSATION[:1])}], "bad.parquet")
    with pytest.raises(ValueError, match="row 0.*assistant turn"):
        MultiTurnSFTDataset(no_answer, TOK, {})


def test_main_sft_picks_the_conversation_dataset_by_switch_or_by_columns(tmp_path):
    conv = conversation_file(tmp_path, messages_key="conv")
    single = write(tmp_path, [{"question": "ab", "answer": "c"}], "single.parquet")
    # veRL's earlier spelling data.multiturn.messages_key maps onto data.messages_key
    cfg = load_config("sft_trainer", ["data.multiturn.enable=True", "data.multiturn.messages_key=conv"])
    assert cfg.data.messages_key == "conv"
    assert isinstance(create_sft_dataset(conv, cfg.data, TOK), MultiTurnSFTDataset)
    # veRL 0.9.1 reads messages without a switch: a file with the messages column and no prompt column
    cfg = load_config("sft_trainer", ["data.messages_key=conv"])
    dataset = create_sft_dataset([conv], cfg.data, TOK)
    assert isinstance(dataset, MultiTurnSFTDataset) and len(dataset) == 1
    assert isinstance(create_sft_dataset(single, cfg.data, TOK), SFTDataset)  # question/answer rows


def test_the_section_is_read_into_sft_data_config(tmp_path):
    """A dict is read into SFTDataConfig: veRL's earlier multiturn.messages_key names the column, a typo names its
    key, a truncation the dataset cannot do is refused by key."""
    conv = conversation_file(tmp_path, messages_key="conv")
    assert len(MultiTurnSFTDataset(conv, TOK, {"multiturn": {"messages_key": "conv"}, "max_length": 400})) == 1
    with pytest.raises(ValueError, match=r"data.max_lenght is not a key of SFTDataConfig; did you mean max_length"):
        MultiTurnSFTDataset(conv, TOK, {"messages_key": "conv", "max_lenght": 8})
    with pytest.raises(ValueError, match="data.truncation must be one of"):
        MultiTurnSFTDataset(conv, TOK, {"messages_key": "conv", "truncation": "middle"})


# a ChatML template that marks a non-thinking assistant turn the way Qwen3's does (an empty think block)
THINKING_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n"
    "{% if m.role == 'assistant' and enable_thinking is defined and enable_thinking is false %}<think></think>"
    "{% endif %}{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def test_the_per_row_thinking_switch_reaches_the_chat_template(tmp_path):
    import copy

    tok = copy.deepcopy(TOK)
    tok.chat_template = THINKING_TEMPLATE
    conv = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok"}]
    rows = [{"messages": json.dumps(conv), "enable_thinking": flag} for flag in (False, True, None)]
    path = write(tmp_path, rows, "thinking.parquet")
    ds = MultiTurnSFTDataset(path, tok, {"max_length": 64})
    texts = [tok.decode(unpadded(ds[i])[0]) for i in range(3)]
    assert "<think></think>ok" in texts[0]  # enable_thinking=False reached the template
    assert "<think>" not in texts[1] and "<think>" not in texts[2]  # True, and a row without a value
    # without the column: data.enable_thinking_default (text, as the yaml holds it); none passes nothing
    plain = write(tmp_path, [{"messages": json.dumps(conv)}], "plain.parquet")
    off = MultiTurnSFTDataset(plain, tok, {"max_length": 64, "enable_thinking_default": "false"})
    assert "<think></think>ok" in tok.decode(unpadded(off[0])[0])
    assert "<think>" not in tok.decode(unpadded(MultiTurnSFTDataset(plain, tok, {"max_length": 64})[0])[0])
    # the loss is still on the assistant's tokens, the empty think block included (the template put it there)
    got, loss = unpadded(off[0])
    assert tok.decode([t for t, m in zip(got, loss) if m]).startswith("<think></think>ok")
    with pytest.raises(ValueError, match="enable_thinking_default='maybe' is not an enable_thinking switch"):
        MultiTurnSFTDataset(plain, tok, {"max_length": 64, "enable_thinking_default": "maybe"})


def test_a_template_that_drops_earlier_reasoning_is_an_error_unless_the_mismatch_is_ignored(tmp_path):
    # a Qwen3-shaped template renders the whole conversation without the first turn's reasoning; built turn by
    # turn, that turn keeps it. Before, the two renderings were spliced silently (the second user turn was lost)
    from tests.utils.test_chat_tokens import qwen3_like_tokenizer

    tok = qwen3_like_tokenizer()
    conversation = [
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "<think>\nadd\n</think>\n\n4"},
        {"role": "user", "content": "3+3?"},
        {"role": "assistant", "content": "<think>\nagain\n</think>\n\n6"},
    ]
    path = write(tmp_path, [{"messages": json.dumps(conversation)}])
    with pytest.raises(ValueError, match="data.ignore_input_ids_mismatch=True") as e:
        MultiTurnSFTDataset(path, tok, {"max_length": 200})[0]
    assert "in SFT row 0 of 'messages'" in e.value.__notes__

    item = MultiTurnSFTDataset(path, tok, {"max_length": 200, "ignore_input_ids_mismatch": True})[0]
    got, loss = unpadded(item)

    def tok_ids(text):
        return tok(text, add_special_tokens=False)["input_ids"]

    prompt1 = tok_ids("<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n<think>\n")
    turn1 = tok_ids("add\n</think>\n\n4") + [EOS]
    prompt2 = tok_ids("\n<|im_start|>user\n3+3?<|im_end|>\n<|im_start|>assistant\n<think>\n")
    turn2 = tok_ids("again\n</think>\n\n6") + [EOS]
    tail = tok_ids("\n")
    assert got == prompt1 + turn1 + prompt2 + turn2 + tail  # each turn as the model wrote it, reasoning kept
    assert loss == [0] * len(prompt1) + [1] * len(turn1) + [0] * len(prompt2) + [1] * len(turn2) + [0] * len(tail)
