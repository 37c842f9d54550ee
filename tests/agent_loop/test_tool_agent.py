"""tool_agent against a scripted server with the tiny chat tokenizer: token layout by hand, the
engine sees exactly the trained tokens, stops, tool failures, bounded parallel calls, interactions."""

from __future__ import annotations

import asyncio
import time

import pytest

from hybridflow.agent_loop import AgentLoopWorker
from hybridflow.tools.base_tool import BaseTool
from hybridflow.tools.schemas import ToolResponse
from tests.agent_loop.chat_helpers import EOS, TOK, ScriptedChat, calc_entry, call_text, ids, response_of, run, settings

QUESTION = [{"role": "user", "content": "What is 347*82?"}]
# the template's tools block, written out: the system turn the prompt starts with (a tool as name(params))
TOOLS_BLOCK = "<|im_start|>system\n# Tools\n<tools>\ncalc(expr)\n</tools><|im_end|>\n"


def worker_for(tmp_path, replies, tools=None, **mt):
    server = ScriptedChat(replies)
    entries = [calc_entry()] if tools is None else tools
    mt.setdefault("response_length", 512)
    return AgentLoopWorker(settings(tmp_path, entries, **mt), [server], TOK, pad_token_id=0), server


def test_tool_turn_layout_by_hand_and_engine_sees_the_trained_tokens(tmp_path):
    call = call_text("calc", expr="347*82")
    worker, server = worker_for(tmp_path, [call, "#### 28454"])
    out = run(worker, [{"messages": QUESTION}])
    resp, mask = response_of(out)
    # model turn 1: the call + EOS (sampled, mask 1); then the template's delta for the tool message: the
    # '\n' after <|im_end|> the model did not sample, the tool turn, the generation prompt (mask 0);
    # model turn 2: '#### 28454' + EOS (mask 1)
    turn1 = ids(call) + [EOS]
    tool = ids("\n<|im_start|>user\n<tool_response>\n28454\n</tool_response><|im_end|>\n<|im_start|>assistant\n")
    turn2 = ids("#### 28454") + [EOS]
    assert resp == turn1 + tool + turn2
    assert mask == [1] * len(turn1) + [0] * len(tool) + [1] * len(turn2)
    # log-probs: the engine's -0.5 on model tokens, 0 on the tool's
    logp = out.batch["rollout_log_probs"][0, : len(resp)].tolist()
    assert logp == [-0.5] * len(turn1) + [0.0] * len(tool) + [-0.5] * len(turn2)
    prompt = ids(TOOLS_BLOCK + "<|im_start|>user\nWhat is 347*82?<|im_end|>\n<|im_start|>assistant\n")
    p = out.batch["prompts"].size(1)
    assert out.batch["prompts"][0, p - len(prompt) :].tolist() == prompt
    # token-in-token-out: turn 2 was generated from exactly prompt + turn 1 + tool tokens (no re-tokenization)
    assert server.requests[1][1] == prompt + turn1 + tool
    assert [r[0] for r in server.requests] == ["train0:0/0", "train0:0/1"]
    # num_turns counts user + assistant + tool + assistant, as veRL
    assert out.non_tensor_batch["num_turns"].tolist() == [4]
    m = out.meta_info["metrics"]
    assert m["agent/tool_calls"] == [1.0] and m["agent/tool_failures"] == [0.0] and m["agent/truncated"] == [0.0]
    assert out.non_tensor_batch["tool_extra_fields"][0] == {"turn_scores": [], "tool_rewards": [0.0]}


def test_model_that_does_not_call_a_tool_stops_after_one_turn(tmp_path):
    worker, server = worker_for(tmp_path, ["#### 5"])
    out = run(worker, [{"messages": QUESTION}])
    assert response_of(out) == (ids("#### 5") + [EOS], [1] * 7)
    assert len(server.requests) == 1 and out.non_tensor_batch["num_turns"].tolist() == [2]


def test_turn_limits(tmp_path):
    call = call_text("calc", expr="1+1")
    worker, server = worker_for(tmp_path, [call] * 5, max_assistant_turns=2)
    out = run(worker, [{"messages": QUESTION}])
    assert len(server.requests) == 2 and out.meta_info["metrics"]["agent/assistant_turns"] == [2.0]
    assert response_of(out)[1][-1] == 1  # ends with the second model turn, its tool call not run
    assert out.meta_info["metrics"]["agent/tool_calls"] == [1.0]

    worker, server = worker_for(tmp_path, [call] * 5, max_user_turns=1)
    out = run(worker, [{"messages": QUESTION}])
    # turn 1 -> tool (user turn 1) -> turn 2 -> stop: the limit of user turns is reached
    assert len(server.requests) == 2 and out.meta_info["metrics"]["agent/user_turns"] == [1.0]


def test_response_budget_stops_and_appended_turns_that_do_not_fit_are_not_appended(tmp_path):
    call = call_text("calc", expr="347*82")
    first = len(ids(call)) + 1
    tool = len(ids("\n<|im_start|>user\n<tool_response>\n28454\n</tool_response><|im_end|>\n<|im_start|>assistant\n"))
    # room for turn 1 and the tool turn but not for the tool turn and one more token: stop before it
    worker, server = worker_for(tmp_path, [call, "#### 28454"], response_length=first + tool)
    out = run(worker, [{"messages": QUESTION}])
    assert response_of(out)[1] == [1] * first and len(server.requests) == 1
    assert out.meta_info["metrics"]["agent/truncated"] == [1.0]
    # with room for 3 more tokens, turn 2 is asked for exactly 3 tokens (the rest of the budget) and cut there
    worker, server = worker_for(tmp_path, [call, "#### 28454"], response_length=first + tool + 3)
    out = run(worker, [{"messages": QUESTION}])
    assert server.requests[1][2].response_length == 3
    assert response_of(out)[0][-3:] == ids("###") and out.meta_info["metrics"]["agent/truncated"] == [1.0]


class Raises(BaseTool):
    async def execute(self, instance_id, parameters, **kwargs):
        raise RuntimeError("boom")


class Hangs(BaseTool):
    released: list = []

    async def execute(self, instance_id, parameters, **kwargs):
        await asyncio.sleep(60)

    async def release(self, instance_id, **kwargs):
        Hangs.released.append(instance_id)


def schema(name):
    return {
        "type": "function",
        "function": {"name": name, "description": name, "parameters": {"type": "object", "properties": {}}},
    }


def test_failing_hanging_unknown_and_malformed_calls_become_messages_not_errors(tmp_path):
    here = __file__
    tools = [
        calc_entry(),
        {"class_name": f"{here}:Raises", "config": {"type": "native"}, "tool_schema": schema("raises")},
        {"class_name": f"{here}:Hangs", "config": {"type": "native", "timeout": 0.2}, "tool_schema": schema("hangs")},
    ]
    cases = {
        "raises": (call_text("raises"), "Error executing tool 'raises': boom"),
        "hangs": (call_text("hangs"), "Error executing tool 'hangs': timed out after 0.2 s"),
        "unknown": (call_text("nope"), "Unknown function 'nope'. Available tools: ['calc', 'hangs', 'raises']"),
        "bad args": (call_text("calc", expr="2+"), "Error executing tool 'calc': not an arithmetic expression: '2+'"),
    }
    released = None
    for name, (call, message) in cases.items():
        worker, server = worker_for(tmp_path, [call, "#### 1"], tools=tools, max_parallel_calls=1)
        released = type(next(t for t in worker.tools if t.name == "hangs")).released  # the class loaded from the file
        start = time.perf_counter()
        out = run(worker, [{"messages": QUESTION}])
        assert time.perf_counter() - start < 5, name
        text = TOK.decode(server.requests[1][1])
        assert f"<tool_response>\n{message}\n</tool_response>" in text, (name, text[-200:])
        assert out.meta_info["metrics"]["agent/tool_failures"] == [1.0], name
    assert len(released) == 1  # the hung call's instance was released
    # a call block that is not JSON is no call: counted, and the trajectory ends (nothing to answer)
    worker, server = worker_for(tmp_path, ["<tool_call>\nnot json\n</tool_call>"])
    out = run(worker, [{"messages": QUESTION}])
    assert len(server.requests) == 1 and out.meta_info["metrics"]["agent/malformed_tool_calls"] == [1.0]


class Slow(BaseTool):
    running = 0
    peak = 0

    async def execute(self, instance_id, parameters, **kwargs):
        Slow.running += 1
        Slow.peak = max(Slow.peak, Slow.running)
        await asyncio.sleep(0.05)
        Slow.running -= 1
        return ToolResponse(text="x" * 20), 0.5, {}


def test_parallel_calls_are_bounded_and_results_truncated(tmp_path):
    tools = [{"class_name": f"{__file__}:Slow", "config": {"type": "native"}, "tool_schema": schema("slow")}]
    three = "".join(call_text("slow") for _ in range(3))
    worker, server = worker_for(
        tmp_path,
        [three, "#### 1"],
        tools=tools,
        max_parallel_calls=2,
        max_tool_response_length=8,
        tool_response_truncate_side="right",
    )
    out = run(worker, [{"messages": QUESTION}])
    assert type(worker.tools[0]).peak == 2  # two calls ran, at the same time; the third was dropped
    m = out.meta_info["metrics"]
    assert m["agent/tool_calls"] == [2.0] and m["agent/tool_calls_dropped"] == [1.0]
    assert m["agent/tool_response_truncated"] == [2.0]
    text = TOK.decode(server.requests[1][1])
    assert text.count("<tool_response>\nxxxxxxxx...(truncated)\n</tool_response>") == 2
    assert out.non_tensor_batch["tool_extra_fields"][0]["tool_rewards"] == [0.5, 0.5]


def test_gsm8k_tool_gets_create_kwargs_and_step_rewards(tmp_path):
    gsm8k_schema = {
        "type": "function",
        "function": {
            "name": "calc_gsm8k_reward",
            "description": "d",
            "parameters": {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]},
        },
    }
    tools = [
        {"class_name": "verl.tools.gsm8k_tool.Gsm8kTool", "config": {"type": "native"}, "tool_schema": gsm8k_schema}
    ]
    replies = [call_text("calc_gsm8k_reward", answer="71"), call_text("calc_gsm8k_reward", answer="72"), "#### 72"]
    worker, server = worker_for(tmp_path, replies, tools=tools)
    kwargs = {"calc_gsm8k_reward": {"create_kwargs": {"ground_truth": "72"}}}
    out = run(worker, [{"messages": QUESTION, "tools_kwargs": kwargs}])
    text = TOK.decode(server.requests[2][1])
    assert "Current parsed answer='71' reward=0.0" in text and "Current parsed answer='72' reward=1.0" in text
    # each call creates a fresh instance (veRL's tool_agent does the same), whose previous reward is 0:
    # '71' scores 0, no improvement -> -0.05; '72' scores 1 > 0 -> 0.0
    assert out.non_tensor_batch["tool_extra_fields"][0]["tool_rewards"] == [-0.05, 0.0]
    from hybridflow.tools.gsm8k_tool import Gsm8kTool
    from hybridflow.tools.schemas import OpenAIFunctionToolSchema

    tool = Gsm8kTool({}, OpenAIFunctionToolSchema.model_validate(gsm8k_schema))

    async def twice():
        iid, _ = await tool.create(create_kwargs={"ground_truth": "72"})
        first = await tool.execute(iid, {"answer": "72"})
        second = await tool.execute(iid, {"answer": "72"})
        await tool.release(iid)
        return first[1], second[1], first[0].text

    # one instance called twice: 1 > 0 -> 0.0, then 1 is no improvement on 1 -> -0.05
    assert asyncio.run(twice()) == (0.0, -0.05, "Current parsed answer='72' reward=1.0")


def test_interaction_hint_after_a_wrong_answer(tmp_path):
    path = tmp_path / "interaction.yaml"
    path.write_text(
        "interaction:\n  - name: gsm8k\n    class_name: verl.interactions.gsm8k_interaction.Gsm8kInteraction\n"
        "    config: {}\n"
    )
    worker, server = worker_for(tmp_path, ["#### 71", "#### 72"], tools=[], interaction_config_path=str(path))
    out = run(worker, [{"messages": QUESTION, "interaction_kwargs": {"name": "gsm8k", "ground_truth": "72"}}])
    resp, mask = response_of(out)
    hint = "Your response is incorrect! You need to reflect on your answer and try again."
    user = ids(f"\n<|im_start|>user\n{hint}<|im_end|>\n<|im_start|>assistant\n")
    assert resp == ids("#### 71") + [EOS] + user + ids("#### 72") + [EOS]
    assert mask == [1] * 8 + [0] * len(user) + [1] * 8
    # the right answer ends it: no "correct!" turn is appended after the last model turn
    assert out.non_tensor_batch["tool_extra_fields"][0]["turn_scores"] == [0.0, 1.0]
    assert out.non_tensor_batch["num_turns"].tolist() == [4]  # user, assistant, user (hint), assistant
    assert worker.interactions["gsm8k"]._instances == {}  # finalized


def test_interaction_kwargs_without_an_interaction_config_are_ignored_and_bad_names_named(tmp_path):
    # veRL's gsm8k_tool_agent_loop rows carry interaction_kwargs (no name) for a run without interactions
    worker, server = worker_for(tmp_path, ["#### 1", "#### 2"], tools=[])
    out = run(worker, [{"messages": QUESTION, "interaction_kwargs": {"query": "q", "ground_truth": "2"}}])
    assert len(server.requests) == 1 and out.non_tensor_batch["num_turns"].tolist() == [2]
    path = tmp_path / "interaction.yaml"
    path.write_text(
        "interaction:\n  - {name: gsm8k, class_name: hybridflow.interactions.gsm8k_interaction.Gsm8kInteraction}\n"
    )
    worker, _ = worker_for(tmp_path, ["#### 1"], tools=[], interaction_config_path=str(path))
    with pytest.raises(ValueError, match="interaction 'other' is not configured; known: \\['gsm8k'\\]"):
        run(worker, [{"messages": QUESTION, "interaction_kwargs": {"name": "other"}}])
    with pytest.raises(ValueError, match="interaction_kwargs has no 'name'"):
        run(worker, [{"messages": QUESTION, "interaction_kwargs": {"ground_truth": "1"}}])


def test_use_inference_chat_template_sends_the_retemplated_conversation(tmp_path):
    call = '<tool_call>\n{"name":"calc","arguments":{"expr":"2*3"}}\n</tool_call>'  # compact JSON: renders differently
    worker, server = worker_for(
        tmp_path, [call, "#### 6"], use_inference_chat_template=True, tokenization_sanity_check_mode="disable"
    )
    out = run(worker, [{"messages": QUESTION}])
    second_prompt = TOK.decode(server.requests[1][1])
    # the engine saw the conversation re-rendered (calls as the template writes them) ...
    assert '{"name": "calc", "arguments": {"expr": "2*3"}}' in second_prompt
    # ... while the trained tokens are the sampled ones
    assert response_of(out)[0][: len(ids(call)) + 1] == ids(call) + [EOS]
