"""Incremental chat-template tokens and the tokenization sanity check (strict / ignore_strippable /
disable), with the tiny character tokenizer: every expected string below is the template written out."""

from __future__ import annotations

import copy

import pytest

from hybridflow.agent_loop import AgentLoopWorker
from hybridflow.utils.chat_tokens import ChatTokenizer, TokenizationMismatch
from tests.agent_loop.chat_helpers import EOS, TOK, ScriptedChat, calc_entry, ids, response_of, run, settings

QUESTION = [{"role": "user", "content": "2+3?"}]


def test_closing_split_and_deltas_by_hand():
    chat = ChatTokenizer(TOK)
    assert chat.assistant_closing == "<|im_end|>\n"
    # the model sampled '#### 5' + <|im_end|>: the '\n' after it is the template's, not the model's
    assert chat.split_turn(ids("#### 5") + [EOS]) == ("#### 5", "\n")
    assert chat.split_turn(ids("#### 5")) == ("#### 5", "<|im_end|>\n")  # cut by length: the whole closing
    tool = [{"role": "tool", "content": "5"}, {"role": "tool", "content": "6"}]
    assert chat.delta_text(tool) == (
        "<|im_start|>user\n<tool_response>\n5\n</tool_response>\n<tool_response>\n6\n"
        "</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )
    assert chat.append_ids([{"role": "user", "content": "no"}], ids("x") + [EOS]) == ids(
        "\n<|im_start|>user\nno<|im_end|>\n<|im_start|>assistant\n"
    )


def incremental(chat, turns, tools=None):
    """Build ids the way tool_agent does: prompt, then model turns (ids) and appended messages."""
    messages = list(QUESTION)
    out = chat.prompt_ids(messages, tools)
    last = None
    for kind, value in turns:
        if kind == "model":
            out += value
            messages.append({"role": "assistant", "content": chat.split_turn(value)[0]})
            last = value
        else:
            out += chat.append_ids(value, last, tools)
            messages += value
            last = None
    return out, messages, last


def test_incremental_ids_equal_the_whole_conversation_templated():
    chat = ChatTokenizer(TOK)
    tools = [calc_entry()["tool_schema"]]
    turns = [
        ("model", ids('<tool_call>\n{"name": "calc", "arguments": {"expr": "2+3"}}\n</tool_call>') + [EOS]),
        ("append", [{"role": "tool", "content": "5"}]),
        ("model", ids("#### 5") + [EOS]),
    ]
    built, messages, last = incremental(chat, turns, tools)
    assert chat.check(built, messages, tools, "strict", last) is True
    # ending on appended turns: compared with the generation prompt on
    built, messages, last = incremental(chat, turns[:2], tools)
    assert last is None and chat.check(built, messages, tools, "strict", None) is True


def test_drift_is_reported_at_the_first_differing_position():
    """The model spells '<|im_end|>' with 10 character tokens mid-text: decoding and re-tokenizing turns
    them into the one special token, so a text-level pipeline would train on other tokens."""
    chat = ChatTokenizer(TOK)
    sampled = ids("a") + ids("<") + ids("|im_end|>") + ids("b") + [EOS]  # 'a', 10 chars, 'b', EOS
    assert TOK("<|im_end|>", add_special_tokens=False)["input_ids"] == [EOS]  # the re-tokenized form
    built, messages, last = incremental(chat, [("model", sampled)])
    prompt = len(chat.prompt_ids(QUESTION))
    with pytest.raises(TokenizationMismatch) as e:
        chat.check(built, messages, None, "strict", last, prompt)
    # position: after the prompt and 'a', i.e. response token 1, where '<' (char) meets <|im_end|> (special)
    assert f"first differ at position {prompt + 1} (response token 1)" in str(e.value)
    assert f"trajectory ids {ids('<|im_end')}" in str(e.value) and "re-templated ids [2, " in str(e.value)
    with pytest.raises(TokenizationMismatch):  # not whitespace: ignore_strippable fails it too
        chat.check(built, messages, None, "ignore_strippable", last, prompt)
    assert chat.check(built, messages, None, "disable", last) is True


def trimming_tokenizer():
    """A tokenizer whose template strips assistant content (as some real templates do)."""
    tok = copy.deepcopy(TOK)
    tok.chat_template = tok.chat_template.replace(
        "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}",
        "{{- '<|im_start|>' + message['role'] + '\\n' + (message['content'] | trim) + '<|im_end|>' + '\\n' }}",
    )
    assert tok.chat_template != TOK.chat_template
    return tok


def test_whitespace_only_differences_pass_ignore_strippable_only():
    chat = ChatTokenizer(trimming_tokenizer())
    built, messages, last = incremental(
        chat, [("model", ids("#### 5 ") + [EOS])]
    )  # trailing space, trimmed on re-render
    with pytest.raises(TokenizationMismatch, match=r"\(strict\) failed"):
        chat.check(built, messages, None, "strict", last)
    assert chat.check(built, messages, None, "ignore_strippable", last) is False  # whitespace only: passes, flagged


def test_tool_agent_trains_the_sampled_tokens_and_fails_strict_samples(tmp_path, caplog):
    sampled = ids("#### ") + ids("<") + ids("|im_end|>") + [EOS]
    for mode in ("strict", "disable"):
        worker = AgentLoopWorker(
            settings(tmp_path, [calc_entry()], tokenization_sanity_check_mode=mode),
            [ScriptedChat([sampled])],
            TOK,
            pad_token_id=0,
        )
        out = run(worker, [{"messages": QUESTION}])
        # the trained response is exactly what was sampled, char tokens and all
        got, mask = response_of(out)
        assert got == sampled
        if mode == "strict":  # the sample failed the check: in the batch, but none of its tokens is trained
            assert mask == [0] * len(sampled) and out.meta_info["metrics"]["agent/tokenization_mismatch"] == [1.0]
            assert "first differ at position" in caplog.text and "left out of the loss" in caplog.text
        else:
            assert mask == [1] * len(sampled) and "agent/tokenization_mismatch" not in out.meta_info["metrics"]


# A template shaped as Qwen3's: an assistant turn after the last user query shows its reasoning (the newest
# one always, an empty think block when it has none); an earlier turn loses it. Rendering a conversation at
# once therefore differs from rendering it turn by turn.
QWEN3_LIKE = (
    "{%- set ns = namespace(last_query=-1) -%}"
    "{%- for m in messages -%}{%- if m.role == 'user' -%}{%- set ns.last_query = loop.index0 -%}{%- endif -%}"
    "{%- endfor -%}"
    "{%- for m in messages -%}"
    "{%- if m.role == 'assistant' -%}"
    "{%- set content = m.content.split('</think>')[-1].lstrip('\\n') -%}"
    "{%- set reasoning = m.content.split('</think>')[0].split('<think>')[-1].strip('\\n') "
    "if '</think>' in m.content else '' -%}"
    "{%- if loop.index0 > ns.last_query and (loop.last or reasoning) -%}"
    "{{- '<|im_start|>assistant\\n<think>\\n' + reasoning + '\\n</think>\\n\\n' + content + '<|im_end|>\\n' -}}"
    "{%- else -%}{{- '<|im_start|>assistant\\n' + content + '<|im_end|>\\n' -}}{%- endif -%}"
    "{%- elif m.role == 'tool' -%}"
    "{{- '<|im_start|>user\\n<tool_response>\\n' + m.content + '\\n</tool_response><|im_end|>\\n' -}}"
    "{%- else -%}{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' -}}{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n<think>\\n' -}}{%- endif -%}"
)


def qwen3_like_tokenizer():
    tok = copy.deepcopy(TOK)
    tok.chat_template = QWEN3_LIKE
    return tok


def test_a_template_that_rewrites_earlier_turns_still_has_deltas_and_passes_strict():
    chat = ChatTokenizer(qwen3_like_tokenizer())
    # the base turn is rendered with an empty think block when newest and without it once a message follows
    assert chat.delta_text([{"role": "tool", "content": "5"}]) == (
        "<|im_start|>user\n<tool_response>\n5\n</tool_response><|im_end|>\n<|im_start|>assistant\n<think>\n"
    )
    # two model turns with reasoning around a user's follow-up: the trajectory keeps the first turn's reasoning
    # (the model's tokens), the whole conversation rendered at once drops it; the check compares with the
    # turn-by-turn text
    first = ids("plan\n</think>\n\n#### 5") + [EOS]
    second = ids("done\n</think>\n\n#### 6") + [EOS]
    out, messages, last = incremental(
        chat, [("model", first), ("append", [{"role": "user", "content": "and 3+3?"}]), ("model", second)]
    )
    assert chat.decode(out).count("plan") == 1 and "plan" not in chat.render(messages)
    assert chat.check(out, messages, None, "strict", last) is True
    drifted = out[:-3] + ids(" ") + out[-3:]
    with pytest.raises(TokenizationMismatch):
        chat.check(drifted, messages, None, "strict", last)


def test_a_turn_the_template_cannot_render_as_written_fails_the_sample_not_the_run():
    # the generation prompt opens a think block; a template that drops it for this turn cannot re-render the
    # turn after it: the check reports a mismatch (the sample is left out), it does not raise anything else
    tok = copy.deepcopy(TOK)
    tok.chat_template = QWEN3_LIKE.replace(
        "'<|im_start|>assistant\\n<think>\\n' -}}{%- endif -%}", "'X' -}}{%- endif -%}"
    )
    chat = ChatTokenizer(tok)
    messages = [*QUESTION, {"role": "assistant", "content": "#### 5"}]
    with pytest.raises(TokenizationMismatch, match="does not render assistant message 1 after its generation prompt"):
        chat.check(ids("X#### 5") + [EOS], messages, None, "strict", ids("#### 5") + [EOS])
