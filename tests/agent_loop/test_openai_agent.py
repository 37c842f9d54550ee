"""openai_agent: agents written against the real ``openai`` client, driven through the local endpoint
against a scripted engine (tiny chat tokenizer): the trajectory's tokens and mask by hand, token reuse,
prompts that do not extend the chain (each sanity-check mode), tool calls in OpenAI's format, errors as
HTTP errors, 401 without the token, and an agent that raises or hangs failing only its own sample."""

from __future__ import annotations

import asyncio
import json
import logging
import urllib.error
import urllib.request

import pytest

from hybridflow.agent_loop import AgentLoopWorker
from tests.agent_loop.chat_helpers import (
    CALC_SCHEMA,
    EOS,
    TOK,
    ScriptedChat,
    batch_of,
    call_text,
    ids,
    objects,
    response_of,
    run,
    settings,
)

openai = pytest.importorskip("openai")  # the [agent] extra (requirements-cpu.txt pins it)

QUESTION = [{"role": "user", "content": "What is 347*82?"}]
PROMPT = "<|im_start|>system\n# Tools\n<tools>\ncalc(expr)\n</tools><|im_end|>\n"
PROMPT += "<|im_start|>user\nWhat is 347*82?<|im_end|>\n<|im_start|>assistant\n"
TOOL_DELTA = "\n<|im_start|>user\n<tool_response>\n28454\n</tool_response><|im_end|>\n<|im_start|>assistant\n"


def worker_for(agent, replies, response_length=256, **loop_kwargs):
    server = ScriptedChat(replies)
    worker = AgentLoopWorker(
        settings(response_length=response_length, **loop_kwargs.pop("mt", {})),
        [server],
        TOK,
        pad_token_id=0,
        loop_kwargs={"openai_agent": {"agent": agent, **loop_kwargs}},
    )
    return worker, server


def samples(n=1):
    return [{"messages": QUESTION, "agent_name": "openai_agent"} for _ in range(n)]


def run_with_info(worker, extra_infos: list[dict]):
    """One sample per ``extra_info`` (the agent reads it: the dataset row's column)."""
    batch = batch_of(samples(len(extra_infos)), worker.settings.prompt_length)
    batch.non_tensor_batch["extra_info"] = objects(extra_infos)
    return asyncio.run(worker.generate_sequences(batch))


async def calculator_agent(client, sample):
    """The pattern of an agent with its own tool loop: call, run the tools it asked for, call again."""
    messages = list(sample["raw_prompt"])
    for _ in range(4):
        reply = await client.chat.completions.create(model="policy", messages=messages, tools=[CALC_SCHEMA])
        message = reply.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            return float(message.content.strip() == "#### 28454")
        for call in message.tool_calls:
            result = str(eval(json.loads(call.function.arguments)["expr"]))  # the agent's own tool
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})


def test_tool_calls_come_back_in_openai_format_and_the_trajectory_is_one_sequence():
    call = call_text("calc", expr="347*82")
    seen = {}

    async def agent(client, sample):
        first = await client.chat.completions.create(model="m", messages=sample["raw_prompt"], tools=[CALC_SCHEMA])
        seen["first"] = first
        return await calculator_agent(client, sample)

    worker, server = worker_for(agent, [call, call, "#### 28454"])
    out = run(worker, samples())
    first = seen["first"].choices[0]
    assert first.finish_reason == "tool_calls" and first.message.content == ""
    (tool_call,) = first.message.tool_calls
    assert tool_call.type == "function" and tool_call.function.name == "calc"
    assert json.loads(tool_call.function.arguments) == {"expr": "347*82"}
    # the first call of `agent` started a chain that calculator_agent's calls did not extend (its first
    # call repeats the question): strict mode fails the sample; the reward is the agent's
    assert out.non_tensor_batch["reward_score"].tolist() == [1.0]
    assert response_of(out)[1] == [0] * len(response_of(out)[1])
    assert out.meta_info["metrics"]["agent/tokenization_mismatch"] == [1.0]

    worker, server = worker_for(calculator_agent, [call, "#### 28454"])
    out = run(worker, samples())
    resp, mask = response_of(out)
    turn1, turn2, tool = ids(call) + [EOS], ids("#### 28454") + [EOS], ids(TOOL_DELTA)
    assert resp == turn1 + tool + turn2
    assert mask == [1] * len(turn1) + [0] * len(tool) + [1] * len(turn2)
    assert out.batch["rollout_log_probs"][0, : len(resp)].tolist() == [-0.5] * len(turn1) + [0.0] * len(tool) + [
        -0.5
    ] * len(turn2)
    p = out.batch["prompts"].size(1)
    assert out.batch["prompts"][0, p - len(ids(PROMPT)) :].tolist() == ids(PROMPT)
    assert server.requests[1][1] == ids(PROMPT) + turn1 + tool  # the engine saw exactly the trained tokens
    assert [r[0] for r in server.requests] == ["train0:0/0", "train0:0/1"]
    assert out.non_tensor_batch["reward_score"].tolist() == [1.0]
    metrics = out.meta_info["metrics"]
    assert metrics["agent/agent_calls"] == [2.0] and metrics["agent/tokenization_mismatch"] == [0.0]
    assert out.non_tensor_batch["num_turns"].tolist() == [4]  # user, assistant, tool, assistant


def test_a_later_call_reuses_the_sampled_ids_instead_of_re_tokenizing_them():
    # the model spelled '<|im_end|>' in characters: re-tokenizing its text would give the special token
    spelled = ids("x") + TOK.convert_tokens_to_ids(list("<|im_end|>")) + [EOS]
    assert ids(TOK.decode(spelled, skip_special_tokens=False)) != spelled

    async def agent(client, sample):
        messages = list(sample["raw_prompt"])
        reply = await client.chat.completions.create(model="m", messages=messages)
        messages += [reply.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "again"}]
        await client.chat.completions.create(model="m", messages=messages)

    worker, server = worker_for(agent, [spelled, "#### 1"], mt={"tokenization_sanity_check_mode": "disable"})
    out = run(worker, samples())
    prompt = ids("<|im_start|>user\nWhat is 347*82?<|im_end|>\n<|im_start|>assistant\n")
    delta = ids("\n<|im_start|>user\nagain<|im_end|>\n<|im_start|>assistant\n")
    assert server.requests[1][1] == prompt + spelled + delta
    resp, mask = response_of(out)
    assert resp == spelled + delta + ids("#### 1") + [EOS] and sum(mask) == len(spelled) + 7
    assert "reward_score" not in out.non_tensor_batch  # None: the reward function scores the sample


@pytest.mark.parametrize("mode", ["strict", "ignore_strippable", "disable"])
def test_a_call_that_does_not_extend_the_chain_is_handled_as_the_sanity_check_mode_says(mode, caplog):
    async def agent(client, sample):
        reply = await client.chat.completions.create(model="m", messages=sample["raw_prompt"])
        edited = [{"role": "user", "content": " What is 347*82? "}]  # the question, whitespace added
        if sample["extra_info"]["rewrite"]:
            edited = [{"role": "user", "content": "What is 347*83?"}]
        edited += [reply.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "sure?"}]
        await client.chat.completions.create(model="m", messages=edited)
        return 0.5

    worker, server = worker_for(agent, ["#### 1"] * 4, mt={"tokenization_sanity_check_mode": mode})
    with caplog.at_level(logging.WARNING):
        out = run_with_info(worker, [{"rewrite": False}, {"rewrite": True}])
    whitespace_mask, rewritten_mask = response_of(out, 0)[1], response_of(out, 1)[1]
    if mode == "ignore_strippable":  # the whitespace edit extends the chain: its own tokens go on
        first_prompt = ids("<|im_start|>user\nWhat is 347*82?<|im_end|>\n<|im_start|>assistant\n")
        (extended,) = [r[1] for r in server.requests if r[0] == "train0:0/1"]
        assert extended[: len(first_prompt)] == first_prompt
    if mode == "disable":  # no check: the sample trains on its last chain, the rewritten one
        assert TOK.decode(out.batch["prompts"][1].tolist()).endswith(
            "What is 347*83?<|im_end|>\n<|im_start|>assistant\n#### 1<|im_end|>\n<|im_start|>user\nsure?<|im_end|>\n"
            "<|im_start|>assistant\n"
        )
        assert sum(rewritten_mask) == 7 and out.meta_info["metrics"]["agent/restarted_chains"] == [1.0]
    else:
        assert sum(rewritten_mask) == 0 and "sample 'train0:1' is left out of the loss" in caplog.text
        assert "call 1 does not extend the earlier calls" in caplog.text
    assert (sum(whitespace_mask) == 0) == (mode == "strict")
    assert out.non_tensor_batch["reward_score"].tolist() == [0.5, 0.5]


def test_errors_reach_the_agent_as_http_errors_and_requests_without_the_token_get_401():
    errors = {}

    async def agent(client, sample):
        url = f"{client.base_url}chat/completions"
        assert client.base_url.host == "127.0.0.1"
        for name, headers in (("none", {}), ("wrong", {"Authorization": "Bearer nope"})):
            request = urllib.request.Request(url, data=b"{}", headers=headers, method="POST")
            try:
                await asyncio.to_thread(urllib.request.build_opener(urllib.request.ProxyHandler({})).open, request)
            except urllib.error.HTTPError as e:
                errors[name] = (e.code, json.loads(e.read())["error"]["message"])
        bad = openai.AsyncOpenAI(base_url=str(client.base_url), api_key="guess", max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            await bad.models.list()
        await bad.close()
        assert [m.id for m in (await client.models.list()).data] == ["hybridflow-policy"]
        for kwargs, wanted in (
            ({"stream": True}, "stream=True is not supported"),
            ({"n": 2}, "n=2 is not supported"),
            ({"stop": ["\n"]}, "stop strings are not supported"),
            ({"messages": []}, "'messages' must be a non-empty list"),
        ):
            with pytest.raises(openai.BadRequestError, match=wanted):
                await client.chat.completions.create(model="m", **{"messages": sample["raw_prompt"], **kwargs})
        return 1.0

    worker, server = worker_for(agent, [])
    out = run(worker, samples())
    assert errors["none"][0] == 401 and errors["wrong"][0] == 401 and "run's token" in errors["none"][1]
    assert out.non_tensor_batch["reward_score"].tolist() == [1.0] and server.requests == []


def test_an_agent_that_raises_or_hangs_fails_only_its_own_sample(caplog):
    async def agent(client, sample):
        reply = await client.chat.completions.create(model="m", messages=sample["raw_prompt"])
        behaviour = sample["extra_info"]["behaviour"]
        if behaviour == "raise":
            raise RuntimeError("my agent's bug")
        if behaviour == "hang":
            await asyncio.sleep(60)
        return float(len(reply.choices[0].message.content))

    worker, _ = worker_for(agent, ["#### 1"] * 3, timeout_s=2, failed_reward=-1.0)
    with caplog.at_level(logging.WARNING):
        out = run_with_info(worker, [{"behaviour": b} for b in ("ok", "raise", "hang")])
    assert out.non_tensor_batch["reward_score"].tolist() == [6.0, -1.0, -1.0]
    assert sum(response_of(out, 0)[1]) == 7 and sum(response_of(out, 1)[1]) == sum(response_of(out, 2)[1]) == 0
    assert "raised RuntimeError: my agent's bug on sample 'train0:1'" in caplog.text
    assert "timed out after 2 s on sample 'train0:2'" in caplog.text
    metrics = out.meta_info["metrics"]
    assert metrics["agent/agent_failures"] == [pytest.approx(2 / 3)]
    assert metrics["agent/agent_timeouts"] == [pytest.approx(1 / 3)]


def test_completions_reuse_the_chain_and_a_used_up_budget_is_a_400_that_keeps_the_sample():
    async def agent(client, sample):
        first = await client.completions.create(model="m", prompt="Q: 1+1=")
        prompt = "Q: 1+1=" + first.choices[0].text + "\nQ: 2+2="
        second = await client.completions.create(model="m", prompt=prompt, max_tokens=3)
        assert second.usage.completion_tokens == 3
        with pytest.raises(openai.BadRequestError, match="response budget is used up"):
            await client.completions.create(model="m", prompt=prompt + second.choices[0].text + "x" * 40)
        raise RuntimeError("gave up")  # after the budget ran out: a truncated sample, not a failed one

    worker, server = worker_for(agent, ["2", "4444"], response_length=16)
    out = run(worker, samples())
    assert server.requests[1][1] == ids("Q: 1+1=") + ids("2") + [EOS] + ids("\nQ: 2+2=")
    resp, mask = response_of(out)
    assert resp == ids("2") + [EOS] + ids("\nQ: 2+2=") + ids("444")
    assert mask == [1, 1] + [0] * 8 + [1, 1, 1]
    assert "reward_score" not in out.non_tensor_batch
    assert out.meta_info["metrics"]["agent/truncated"] == [1.0]
    assert out.meta_info["metrics"]["agent/agent_failures"] == [0.0]


def test_a_plain_function_gets_a_synchronous_client_and_runs_in_a_thread():
    def agent(client, sample):
        assert isinstance(client, openai.OpenAI)
        reply = client.chat.completions.create(model="m", messages=sample["raw_prompt"])
        return float(reply.choices[0].message.content == "#### 1")

    worker, server = worker_for(agent, ["#### 1", "#### 1"])
    out = run(worker, samples(2))
    assert out.non_tensor_batch["reward_score"].tolist() == [1.0, 1.0] and len(server.requests) == 2
