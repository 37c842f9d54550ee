"""``openai_agent``: train an agent written against the ``openai`` client, with its own loop and tools.

The user writes ``async def run(client, sample) -> float | None`` (a plain ``def`` gets a synchronous
client and runs in a thread) and names it in the loop's entry of ``rollout.agent.agent_loop_config_path``::

    - name: openai_agent
      _target_: hybridflow.agent_loop.openai_agent.OpenAIAgentLoop
      agent: my_agent.py:run      # the function (path relative to the yaml, or package.module.run)
      timeout_s: 300              # the agent's deadline per trajectory (default 600)
      failed_reward: 0.0          # the reward of a sample whose agent raised or timed out

``client`` is an ``openai.AsyncOpenAI`` bound to the sample's trajectory: its base url carries the
trajectory's id, its api key is the endpoint's token (``openai_endpoint.py``: 127.0.0.1 only, 401 without
the token); ``sample`` is the dataset row (``raw_prompt``, ``extra_info``, ``reward_model``, ...). The
return value is the sample's reward; None lets the reward function score the response.

Every call is recorded with its prompt ids, the engine's output ids and log-probs, into one chain, the
trained sequence: prompt = the first call's prompt, response = output ids (mask 1, their log-probs) and,
between calls, the tokens of what the agent added (mask 0). A chat call whose messages start with the
chain's conversation (earlier messages plus the assistant messages it was answered, compared without
tool-call ids) reuses the chain's tokens and appends only the chat template's delta for the new messages
(``ChatTokenizer.append_ids``, as ``tool_agent``): the engine is given exactly the trained tokens. The
same for ``/completions``: a text prompt that starts with the chain's text so far (prompt + returned
completions), or a token-id prompt that starts with the chain's ids, appends only the rest. A call that
does not extend the chain (other tools, edited history, a branch) starts a new chain and is handled as
``multi_turn.tokenization_sanity_check_mode`` says: ``strict`` fails the sample (its response mask all 0,
logged with the first differing message, counted in ``agent/tokenization_mismatch``),
``ignore_strippable`` the same unless the messages differ only in whitespace around their contents (then
it extends), ``disable`` keeps the new chain (the sample trains on the last chain). A finished chat chain
gets the same check as ``tool_agent`` (its tokens against the template applied to the whole conversation).

Responses: tool calls are parsed with ``multi_turn.format``'s parser and returned in OpenAI's format
(``tool_calls`` with JSON-text arguments, ``finish_reason="tool_calls"``). The run's sampling parameters
(rollout temperature, top_p, top_k; ``val_kwargs`` in validation) are used whatever the request says, so
that the recorded log-probs are the policy the trainer corrects for; ``max_tokens`` is honoured within the
trajectory's budget (``rollout.response_length`` over all calls); ``logprobs`` are not returned (the
trainer has them) and ``tool_choice`` is not enforced. Refused with 400: ``stream``, ``n > 1``,
``stop`` strings, a first prompt longer than the rollout prompt length, and a call whose added tokens do
not fit the budget (``context_length_exceeded``: the sample is kept, truncated, even if the agent then
raises). An agent that raises or passes ``timeout_s`` fails its own sample only (logged with its request
id, counted in ``agent/agent_failures``, response mask 0, reward ``failed_reward``); the step goes on.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import math
import os
import secrets
import time
from dataclasses import dataclass, field

import numpy as np

from hybridflow.agent_loop.base import AgentLoopBase, AgentLoopOutput, register
from hybridflow.agent_loop.openai_endpoint import EndpointError, endpoint_for_running_loop
from hybridflow.agent_loop.over_sample import TrajectoryAborted
from hybridflow.agent_loop.tool_parser import TOOL_PARSERS
from hybridflow.rollout.sampling import SamplingParams
from hybridflow.rollout.server import STOP
from hybridflow.utils.chat_tokens import ChatTokenizer, TokenizationMismatch
from hybridflow.utils.import_utils import load_class

logger = logging.getLogger(__name__)
MODEL_NAME = "hybridflow-policy"


def clean_message(message: dict, strip: bool = False) -> dict:
    """A chat message as the template renders it and as chains compare it: role, text content (parts
    joined), tool calls as {type, function: {name, arguments as an object where they are JSON}}, the
    tool-call id of a tool message; everything else (ids of calls, refusal, None fields) dropped."""
    if not isinstance(message, dict) or "role" not in message:
        raise EndpointError(400, f"each message needs a 'role': got {message!r}")
    content = message.get("content") or ""
    if isinstance(content, list):
        content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
    out = {"role": message["role"], "content": content.strip() if strip else content}
    calls = []
    for call in message.get("tool_calls") or []:
        fn = call.get("function") or {}
        arguments = fn.get("arguments")
        try:
            arguments = json.loads(arguments) if isinstance(arguments, str) else arguments
        except ValueError:
            pass
        calls.append({"type": "function", "function": {"name": fn.get("name"), "arguments": arguments}})
    if calls:
        out["tool_calls"] = calls
    if message.get("tool_call_id") is not None:
        out["tool_call_id"] = message["tool_call_id"]
    return out


@dataclass
class Chain:
    """The trained sequence of a trajectory (see the module docstring)."""

    kind: str  # "chat/completions" or "completions"
    prompt_ids: list[int]
    messages: list[dict] = field(default_factory=list)  # chat: the conversation, cleaned
    literal: list[dict] = field(default_factory=list)  # chat: assistant turns as the model's text (sanity check)
    tools: list | None = None
    text: str | None = None  # completions with text prompts: prompt + completions so far
    response_ids: list[int] = field(default_factory=list)
    response_mask: list[int] = field(default_factory=list)
    response_logprobs: list[float] = field(default_factory=list)
    last_model_ids: list[int] = field(default_factory=list)


class AgentTrajectory:
    """One sample's calls: answers them (``handle``, called by the endpoint) and builds its output."""

    def __init__(self, loop: OpenAIAgentLoop, sample: dict, params: SamplingParams):
        self.loop, self.sample, self.params = loop, sample, params
        self.request_id = str(sample["request_id"])
        self.chain: Chain | None = None
        self.lock = asyncio.Lock()  # calls of one trajectory are answered one at a time, in arrival order
        self.calls = 0
        self.failed = False  # no token of the sample is trained
        self.truncated = False
        self.logprobs_missing = False
        self.aborted: TrajectoryAborted | None = None
        self.metrics: dict[str, float] = {}

    def count(self, key: str, n: float = 1.0) -> None:
        self.metrics[key] = self.metrics.get(key, 0.0) + n

    async def handle(self, route: str, request: dict) -> dict:
        if route == "models":
            return {"object": "list", "data": [{"id": MODEL_NAME, "object": "model", "owned_by": "hybridflow"}]}
        for key, bad in (("stream", bool(request.get("stream"))), ("n", request.get("n") not in (None, 1))):
            if bad:
                raise EndpointError(400, f"{key}={request[key]!r} is not supported by the training endpoint")
        if request.get("stop"):
            raise EndpointError(400, "stop strings are not supported: the engine stops at the model's end of turn")
        async with self.lock:
            if route == "completions":
                return await self._completion(request)
            return await self._chat(request)

    # ------------------------------------------------------------------------------------------ chains
    def _extends(self, messages: list[dict], tools) -> bool:
        c = self.chain
        if c is None or c.kind != "chat/completions" or not c.last_model_ids or tools != c.tools:
            return False  # (a chain whose last call failed after its new messages ends without a model turn)
        if len(messages) <= len(c.messages):
            return False
        strip = self.loop.mode == "ignore_strippable"
        head = [clean_message(m, strip) for m in messages[: len(c.messages)]]
        return head == [clean_message(m, strip) for m in c.messages]

    def _start_chain(self, chain: Chain, why: str) -> None:
        if len(chain.prompt_ids) > self.loop.settings.prompt_length:
            raise EndpointError(
                400,
                f"the prompt is {len(chain.prompt_ids)} tokens, more than the rollout prompt length "
                f"{self.loop.settings.prompt_length} (data.max_prompt_length)",
                "context_length_exceeded",
            )
        if self.chain is not None:
            self.count("restarted_chains")
            if self.loop.mode != "disable":
                self._fail_check(f"call {self.calls} does not extend the earlier calls ({why})")
        self.chain = chain

    def _fail_check(self, why: str) -> None:
        if not self.failed:
            logger.warning(
                "openai_agent: sample %r is left out of the loss (response_mask 0): %s", self.request_id, why
            )
            self.count("tokenization_mismatch")
        self.failed = True

    def _append(self, ids: list[int]) -> None:
        c = self.chain
        if len(c.response_ids) + len(ids) >= self.loop.settings.response_length:
            self.truncated = True
            raise EndpointError(
                400,
                f"the trajectory's response budget is used up ({len(c.response_ids)} of "
                f"{self.loop.settings.response_length} tokens, rollout.response_length; {len(ids)} more asked)",
                "context_length_exceeded",
            )
        c.response_ids += ids
        c.response_mask += [0] * len(ids)
        c.response_logprobs += [0.0] * len(ids)
        c.last_model_ids = []  # the chain ends with appended turns

    async def _generate(self, request: dict) -> tuple[list[int], str]:
        """Sample from the chain's tokens; append the output (mask 1). Returns (ids, finish reason)."""
        c = self.chain
        budget = self.loop.settings.response_length - len(c.response_ids)
        asked = request.get("max_completion_tokens") or request.get("max_tokens")
        n = budget if asked is None else min(int(asked), budget)
        if n <= 0:
            self.truncated = True
            raise EndpointError(400, "the trajectory's response budget is used up", "context_length_exceeded")
        overrides: dict = {"response_length": n}
        if self.loop.parser.stop_token_ids:
            overrides["stop_token_ids"] = tuple(
                sorted(set(self.params.stop_token_ids or ()) | set(self.loop.parser.stop_token_ids))
            )
        try:
            out = await self.loop.server_manager.generate(
                self.request_id, c.prompt_ids + c.response_ids, self.params.with_overrides(overrides)
            )
        except TrajectoryAborted as e:
            self.aborted = e
            raise EndpointError(503, "the trainer cut this trajectory (rollout.over_sample_rate)") from e
        ids = list(out.token_ids)
        self.calls += 1
        self.logprobs_missing |= out.log_probs is None
        c.response_ids += ids
        c.response_mask += [1] * len(ids)
        c.response_logprobs += list(out.log_probs) if out.log_probs is not None else [0.0] * len(ids)
        c.last_model_ids = ids
        if len(c.response_ids) >= self.loop.settings.response_length:
            self.truncated = True
        return ids, "stop" if out.stop_reason == STOP else "length"

    async def _chat(self, request: dict) -> dict:
        messages, tools = request.get("messages"), request.get("tools") or None
        if not isinstance(messages, list) or not messages:
            raise EndpointError(400, "'messages' must be a non-empty list")
        chat = self.loop.chat
        if self._extends(messages, tools):
            c = self.chain
            new = [clean_message(m) for m in messages[len(c.messages) :]]
            self._append(chat.append_ids(new, c.last_model_ids, tools))
            c.messages += new
            c.literal += new
        else:
            cleaned = [clean_message(m) for m in messages]
            self._start_chain(
                Chain("chat/completions", chat.prompt_ids(cleaned, tools), cleaned, list(cleaned), tools), "messages"
            )
        ids, finish = await self._generate(request)
        parsed = self.loop.parser.parse_ids(ids, tools)
        self.count("malformed_tool_calls", parsed.malformed)
        calls = [
            {"id": f"call_{self.calls}_{i}", "type": "function", "function": {"name": f.name, "arguments": f.arguments}}
            for i, f in enumerate(parsed.calls)
        ]
        message = {"role": "assistant", "content": parsed.content, **({"tool_calls": calls} if calls else {})}
        self.chain.messages.append(clean_message(message))
        self.chain.literal.append({"role": "assistant", "content": chat.split_turn(ids)[0]})
        choice = {"index": 0, "message": message, "finish_reason": "tool_calls" if calls else finish, "logprobs": None}
        return self._response("chat.completion", choice, len(ids))

    async def _completion(self, request: dict) -> dict:
        prompt = request.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
            prompt = prompt[0]  # a batch of one
        c = self.chain if self.chain is not None and self.chain.kind == "completions" else None
        if isinstance(prompt, str):
            if c is not None and c.text is not None and prompt.startswith(c.text):
                self._append(self.loop.chat.encode(prompt[len(c.text) :]))
            else:
                self._start_chain(Chain("completions", self.loop.chat.encode(prompt)), "prompt text")
            self.chain.text = prompt
        elif isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
            done = c.prompt_ids + c.response_ids if c is not None else None
            if done is not None and prompt[: len(done)] == done:
                self._append(prompt[len(done) :])
            else:
                self._start_chain(Chain("completions", list(prompt)), "prompt ids")
            self.chain.text = None
        else:
            raise EndpointError(400, "'prompt' must be a string or a list of token ids (one prompt)")
        ids, finish = await self._generate(request)
        text = self.loop.tokenizer.decode(ids, skip_special_tokens=True)
        if self.chain.text is not None:
            self.chain.text += text
        return self._response("text_completion", {"index": 0, "text": text, "finish_reason": finish}, len(ids))

    def _response(self, kind: str, choice: dict, new_tokens: int) -> dict:
        c = self.chain
        prompt_tokens = len(c.prompt_ids) + len(c.response_ids) - new_tokens
        return {
            "id": f"{'chatcmpl' if kind == 'chat.completion' else 'cmpl'}-{self.request_id}-{self.calls}",
            "object": kind,
            "created": int(time.time()),
            "model": MODEL_NAME,
            "choices": [choice],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": new_tokens,
                "total_tokens": prompt_tokens + new_tokens,
            },
        }

    # ------------------------------------------------------------------------------------------ output
    def sanity_check(self) -> None:
        c = self.chain
        if c is None or c.kind != "chat/completions" or self.failed:
            return
        try:
            exact = self.loop.chat.check(
                c.prompt_ids + c.response_ids,
                c.literal,
                c.tools,
                self.loop.mode,
                c.last_model_ids or None,
                len(c.prompt_ids),
            )
        except TokenizationMismatch as e:
            self._fail_check(str(e))
            return
        if not exact:
            self.count("tokenization_whitespace_mismatch")

    def output(self, reward: float | None) -> AgentLoopOutput:
        c = self.chain or Chain("none", list(self.sample["prompt_ids"]))
        n = self.loop.settings.response_length
        self.metrics.update(agent_calls=float(self.calls), truncated=float(self.truncated))
        for key in ("agent_failures", "agent_timeouts", "tokenization_mismatch", "restarted_chains"):
            self.metrics.setdefault(key, 0.0)
        return AgentLoopOutput(
            prompt_ids=c.prompt_ids,
            response_ids=c.response_ids[:n],
            response_mask=[0] * len(c.response_mask[:n]) if self.failed else c.response_mask[:n],
            response_logprobs=None if self.logprobs_missing else c.response_logprobs[:n],
            num_turns=len(c.messages) if c.messages else 1 + self.calls,
            reward_score=reward,
            metrics=self.metrics,
        )


@register("openai_agent")
class OpenAIAgentLoop(AgentLoopBase):
    def __init__(
        self,
        settings,
        server_manager,
        tokenizer,
        tools=None,
        interactions=None,
        agent=None,
        timeout_s: float = 600.0,
        failed_reward: float = 0.0,
        **kwargs,
    ):
        super().__init__(settings, server_manager, tokenizer, tools=tools, interactions=interactions, **kwargs)
        if agent is None:
            raise ValueError(
                "openai_agent needs the agent function: 'agent: path/to/file.py:run' in its entry of "
                "actor_rollout_ref.rollout.agent.agent_loop_config_path"
            )
        if isinstance(agent, str):  # a file path is relative to the agent loop yaml that names it
            base = os.path.dirname(os.path.abspath(settings.agent_loop_config_path or "."))
            agent = load_class(agent, "openai agent function", base_dir=base)
        self.agent = agent
        self.timeout_s, self.failed_reward = float(timeout_s), float(failed_reward)
        self.chat = ChatTokenizer(tokenizer, settings.chat_template_kwargs)
        self.parser = TOOL_PARSERS[settings.multi_turn.format](tokenizer)
        self.mode = settings.multi_turn.tokenization_sanity_check_mode

    async def run(self, sampling_params: SamplingParams, **sample) -> AgentLoopOutput:
        endpoint = await endpoint_for_running_loop()
        trajectory = AgentTrajectory(self, sample, sampling_params)
        trajectory_id = secrets.token_hex(8)
        is_async = inspect.iscoroutinefunction(self.agent)
        client = openai_client(endpoint.base_url(trajectory_id), endpoint.token, self.timeout_s, is_async)
        endpoint.trajectories[trajectory_id] = trajectory
        try:
            row = {k: v.tolist() if isinstance(v, np.ndarray) else v for k, v in sample.items()}
            call = self.agent(client, row) if is_async else asyncio.to_thread(self.agent, client, row)
            reward = agent_reward(await asyncio.wait_for(call, self.timeout_s))
        except Exception as e:  # the agent's failure (or timeout) fails its own sample, never the step
            reward = self._failed(trajectory, e)
        finally:
            endpoint.trajectories.pop(trajectory_id, None)
            closing = client.close()
            if inspect.isawaitable(closing):
                await closing
        if trajectory.aborted is not None:
            raise trajectory.aborted
        trajectory.sanity_check()
        return trajectory.output(reward)

    def _failed(self, trajectory: AgentTrajectory, error: Exception) -> float | None:
        if trajectory.truncated:  # it ran out of budget: the tokens stand, the reward function scores them
            return None
        timed_out = isinstance(error, asyncio.TimeoutError)
        what = f"timed out after {self.timeout_s:g} s" if timed_out else f"raised {type(error).__name__}: {error}"
        logger.warning(
            "openai_agent: the agent %s on sample %r; the sample is left out of the loss with reward %s",
            what,
            trajectory.request_id,
            self.failed_reward,
            exc_info=not timed_out,
        )
        trajectory.failed = True
        trajectory.count("agent_failures")
        trajectory.count("agent_timeouts", float(timed_out))
        return self.failed_reward


def agent_reward(value) -> float | None:
    """The agent's return value as the sample's reward: a finite number, or None (the reward function scores)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise TypeError(f"the agent returned {value!r}; it must return a finite number (the reward) or None")
    return float(value)


def openai_client(base_url: str, token: str, timeout_s: float, is_async: bool):
    """An ``openai`` client for one trajectory: no retries (errors reach the agent), no proxy from the
    environment (the endpoint is on 127.0.0.1)."""
    try:
        import openai
    except ImportError as e:
        raise ImportError("openai_agent needs the openai package: pip install 'hybridflow[agent]'") from e
    if is_async:
        http = openai.DefaultAsyncHttpxClient(trust_env=False)
        return openai.AsyncOpenAI(base_url=base_url, api_key=token, max_retries=0, timeout=timeout_s, http_client=http)
    http = openai.DefaultHttpxClient(trust_env=False)
    return openai.OpenAI(base_url=base_url, api_key=token, max_retries=0, timeout=timeout_s, http_client=http)
