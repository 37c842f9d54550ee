"""``tool_agent``: the multi-turn loop. Generate, run the tool calls, ask the simulated user, repeat.

    prompt (template + tool schemas) -> model turn -> tool calls?  -> tool results -> model turn -> ...
                                                   -> interaction? -> user reply   -> model turn -> ...
                                                   -> neither      -> stop

Stops when the model ends a turn with neither a tool call nor an interaction to answer it, when the
interaction ends the conversation, at ``max_assistant_turns`` / ``max_user_turns`` (user turns count
tool results and interaction replies), when the response budget (``rollout.response_length`` tokens
over all turns) is used up, or when the engine aborts the request.

Tokens (see ``chat_tokens``): each model turn appends exactly the sampled ids (mask 1, their
log-probs); tool results and user replies append the chat template's delta (mask 0, log-prob 0).
Appended turns that would not fit in the budget are not appended (the trajectory stops, counted as a
truncation). The sample's ``raw_prompt`` (chat messages) is rendered with the tool schemas; with
``use_inference_chat_template`` each turn's engine prompt is the template re-applied to the
conversation (as an inference server would), while the trained tokens stay the incremental ones.

Per sample: ``tools_kwargs`` (tool name -> {create_kwargs: ...}) and ``interaction_kwargs`` ({name: <the
interaction>, ...}); a sample without ``interaction_kwargs``, or any sample when no interaction is
configured (``multi_turn.interaction_config_path``), has no simulated user. Scores: each tool
call's step reward goes to ``extra_fields["tool_rewards"]``, each interaction turn's score to
``extra_fields["turn_scores"]``; the reward manager hands both to the reward function in
``extra_info`` (veRL's behaviour). Metrics per trajectory: assistant/user turns, tool calls, failures,
timeouts, malformed calls, dropped calls, truncated tool responses, truncation, sanity-check results.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from hybridflow.agent_loop.base import AgentLoopBase, AgentLoopOutput, register
from hybridflow.agent_loop.tool_calls import ToolCaller
from hybridflow.agent_loop.tool_parser import TOOL_PARSERS, FunctionCall
from hybridflow.rollout.sampling import SamplingParams
from hybridflow.rollout.server import ABORT
from hybridflow.utils.chat_tokens import ChatTokenizer, TokenizationMismatch
from hybridflow.utils.tool_schemas import OpenAIFunctionCallSchema, OpenAIFunctionParsedSchema

logger = logging.getLogger(__name__)
_mismatches_logged = 0


def _warn_mismatch(message: str) -> None:
    """The first few mismatches of a process in full, then every 100th (a bad template fails them all)."""
    global _mismatches_logged
    _mismatches_logged += 1
    if _mismatches_logged <= 5 or _mismatches_logged % 100 == 0:
        logger.warning("[%d so far] %s", _mismatches_logged, message)


@dataclass
class Trajectory:
    """The state of one conversation (tools may read it: it is passed to ``execute`` as ``agent_data``)."""

    request_id: str
    messages: list[dict]  # structured (assistant tool_calls as objects): for tools, interactions, inference template
    literal: list[dict]  # assistant turns as the text the model produced: for the sanity check
    tools_kwargs: dict
    interaction_kwargs: dict
    prompt_ids: list[int] = field(default_factory=list)
    response_ids: list[int] = field(default_factory=list)
    response_mask: list[int] = field(default_factory=list)
    response_logprobs: list[float] = field(default_factory=list)
    last_model_ids: list[int] | None = None  # the final turn, when the conversation ends with the model's
    logprobs_missing: bool = False  # the engine gave no log-probs (rollout.calculate_log_probs=False)
    failed_check: bool = False  # the tokenization sanity check failed: no token of it is trained
    assistant_turns: int = 0
    user_turns: int = 0
    turn_scores: list[float] = field(default_factory=list)
    tool_rewards: list[float] = field(default_factory=list)
    metrics: dict[str, float] = field(default_factory=dict)
    extra_fields: dict[str, Any] = field(default_factory=dict)

    def count(self, key: str, n: float = 1.0) -> None:
        self.metrics[key] = self.metrics.get(key, 0.0) + n


@register("tool_agent")
class ToolAgentLoop(AgentLoopBase):
    def __init__(self, settings, server_manager, tokenizer, tools=None, interactions=None, **kwargs):
        super().__init__(settings, server_manager, tokenizer, tools=tools, interactions=interactions, **kwargs)
        if tokenizer is None:
            raise ValueError("tool_agent needs the tokenizer (its chat template renders tools and tool results)")
        mt = settings.multi_turn
        self.mt = mt
        self.tools = {tool.name: tool for tool in self.tool_list}
        self.tool_schemas = [t.tool_schema.model_dump(exclude_unset=True, exclude_none=True) for t in self.tool_list]
        self.parser = TOOL_PARSERS[mt.format](tokenizer)
        self.chat = ChatTokenizer(tokenizer, settings.chat_template_kwargs)
        self.caller = ToolCaller(
            self.tools,
            mt.max_parallel_calls,
            mt.max_tool_response_length,
            mt.tool_response_truncate_side,
            mt.tool_call_timeout,
        )
        self.response_length = settings.response_length

    # ------------------------------------------------------------------------------------------ run
    async def run(self, sampling_params: SamplingParams, **sample) -> AgentLoopOutput:
        if sample.get("raw_prompt") is None:
            raise ValueError("tool_agent needs the sample's chat messages (raw_prompt); the RL dataset returns them")
        extra_info = sample.get("extra_info") or {}
        t = Trajectory(
            request_id=sample["request_id"],
            messages=[dict(m) for m in sample["raw_prompt"]],
            literal=[dict(m) for m in sample["raw_prompt"]],
            tools_kwargs=dict(sample.get("tools_kwargs") or extra_info.get("tools_kwargs") or {}),
            interaction_kwargs=dict(sample.get("interaction_kwargs") or extra_info.get("interaction_kwargs") or {}),
        )
        interaction = await self._start_interaction(t)
        try:
            t.prompt_ids = self.chat.prompt_ids(t.messages, self.tool_schemas)
            if len(t.prompt_ids) > self.settings.prompt_length:
                raise ValueError(
                    f"the prompt with the tool schemas is {len(t.prompt_ids)} tokens, more than the rollout "
                    f"prompt length {self.settings.prompt_length}; raise data.max_prompt_length"
                )
            await self._converse(t, sampling_params, interaction)
        finally:
            if interaction is not None:
                await interaction.finalize_interaction(t.request_id)
        self._sanity_check(t)
        return self._output(t)

    async def _converse(self, t: Trajectory, params: SamplingParams, interaction) -> None:
        while True:
            calls = await self._model_turn(t, params)
            if calls is None:
                return
            if calls:
                results = await self.caller.run(calls, t.tools_kwargs, agent_data=t)
                self._record_tool_results(t, results)
                if not self._append(t, [r.message() for r in results]):
                    return
                t.user_turns += 1
            elif interaction is not None:
                done, reply, score, _ = await interaction.generate_response(
                    t.request_id, t.messages, **t.interaction_kwargs
                )
                t.count("interaction_turns")
                if score is not None:
                    t.turn_scores.append(float(score))
                # a reply that ends the conversation is not appended (nothing would answer it)
                if done or not self._append(t, [{"role": "user", "content": reply}]):
                    return
                t.user_turns += 1
            else:
                return

    # ------------------------------------------------------------------------------------------ turns
    async def _model_turn(self, t: Trajectory, params: SamplingParams) -> list[FunctionCall] | None:
        """One generation. Returns the tool calls to run ([] for none), or None when the trajectory stops."""
        budget = self.response_length - len(t.response_ids)
        overrides: dict[str, Any] = {"response_length": min(budget, params.response_length)}
        if self.parser.stop_token_ids:
            overrides["stop_token_ids"] = tuple(
                sorted(set(params.stop_token_ids or ()) | set(self.parser.stop_token_ids))
            )
        context = (
            self.chat.prompt_ids(t.messages, self.tool_schemas)
            if self.mt.use_inference_chat_template
            else t.prompt_ids + t.response_ids
        )
        out = await self.server_manager.generate(t.request_id, context, params.with_overrides(overrides))
        ids = list(out.token_ids)
        t.assistant_turns += 1
        t.response_ids += ids
        t.response_mask += [1] * len(ids)
        if out.log_probs is None:
            t.logprobs_missing = True
        t.response_logprobs += list(out.log_probs) if out.log_probs is not None else [0.0] * len(ids)
        t.last_model_ids = ids
        parsed = self.parser.parse_ids(ids, self.tool_schemas)
        content, _ = self.chat.split_turn(ids)
        t.literal.append({"role": "assistant", "content": content})
        t.messages.append(self._assistant_message(parsed.content, parsed.calls))
        if parsed.malformed:
            t.count("malformed_tool_calls", parsed.malformed)
        if out.stop_reason == ABORT:
            t.count("aborted")
            return None
        if len(t.response_ids) >= self.response_length:
            t.count("truncated")
            return None
        mt = self.mt
        if mt.max_assistant_turns and t.assistant_turns >= mt.max_assistant_turns:
            return None
        if mt.max_user_turns and t.user_turns >= mt.max_user_turns:
            return None
        if len(parsed.calls) > mt.max_parallel_calls:
            t.count("tool_calls_dropped", len(parsed.calls) - mt.max_parallel_calls)
        return parsed.calls[: mt.max_parallel_calls]

    def _append(self, t: Trajectory, messages: list[dict]) -> bool:
        """Append tool / user messages as tokens with mask 0; False (nothing appended) when they do not fit."""
        ids = self.chat.append_ids(messages, t.last_model_ids or [], self.tool_schemas)
        if len(t.response_ids) + len(ids) >= self.response_length:
            t.count("truncated")
            return False
        t.messages += messages
        t.literal += messages
        t.response_ids += ids
        t.response_mask += [0] * len(ids)
        t.response_logprobs += [0.0] * len(ids)
        t.last_model_ids = None
        return True

    def _assistant_message(self, content: str, calls: list[FunctionCall]) -> dict:
        """veRL's structured assistant message: content without the call blocks, calls as objects."""
        message: dict[str, Any] = {"role": "assistant", "content": content or ""}
        if not calls:
            return message
        tool_calls = []
        for call in calls[: self.mt.max_parallel_calls]:
            decoded, bad = OpenAIFunctionCallSchema.from_openai_function_parsed_schema(
                OpenAIFunctionParsedSchema(name=call.name, arguments=call.arguments)
            )
            function = {"name": call.name, "arguments": call.arguments} if bad else decoded.model_dump()
            entry: dict[str, Any] = {"type": "function", "function": function}
            if call.tool_call_id is not None:
                entry["id"] = call.tool_call_id
            tool_calls.append(entry)
        message["tool_calls"] = tool_calls
        return message

    def _record_tool_results(self, t: Trajectory, results) -> None:
        t.count("tool_calls", len(results))
        for r in results:
            if r.reward is not None:
                t.tool_rewards.append(r.reward)
            t.count("tool_failures", float(r.failed))
            t.count("tool_timeouts", float(r.timed_out))
            t.count("tool_response_truncated", float(r.truncated))

    # ------------------------------------------------------------------------------------------ helpers
    async def _start_interaction(self, t: Trajectory):
        if not t.interaction_kwargs or not self.interaction_map:
            return None  # as veRL: without an interaction config, a row's interaction_kwargs are not used
        name = t.interaction_kwargs.get("name")
        if name is None:
            raise ValueError("interaction_kwargs has no 'name' (which interaction of the config file to use)")
        if name not in self.interaction_map:
            raise ValueError(f"interaction {name!r} is not configured; known: {sorted(self.interaction_map)}")
        interaction = self.interaction_map[name]
        await interaction.start_interaction(t.request_id, **t.interaction_kwargs)
        return interaction

    def _sanity_check(self, t: Trajectory) -> None:
        """A mismatch fails the sample, not the run: it stays in the batch (its GRPO group keeps its size)
        with every response token masked out, the message (first differing position) is logged and
        ``agent/tokenization_mismatch`` counts it per step."""
        try:
            exact = self.chat.check(
                t.prompt_ids + t.response_ids,
                t.literal,
                self.tool_schemas,
                self.mt.tokenization_sanity_check_mode,
                t.last_model_ids,
                len(t.prompt_ids),
            )
        except TokenizationMismatch as e:
            t.failed_check = True
            t.count("tokenization_mismatch")
            _warn_mismatch(f"sample {t.request_id!r} is left out of the loss (response_mask 0): {e}")
            return
        if not exact:
            t.count("tokenization_whitespace_mismatch")

    def _output(self, t: Trajectory) -> AgentLoopOutput:
        n = self.response_length
        t.metrics.update(assistant_turns=float(t.assistant_turns), user_turns=float(t.user_turns))
        for key in ("tool_calls", "tool_failures", "truncated"):
            t.metrics.setdefault(key, 0.0)
        if self.mt.tokenization_sanity_check_mode != "disable":
            t.metrics.setdefault("tokenization_mismatch", 0.0)
        extra = dict(t.extra_fields)
        extra.update(turn_scores=list(t.turn_scores), tool_rewards=list(t.tool_rewards))
        mask = [0] * len(t.response_mask[:n]) if t.failed_check else t.response_mask[:n]
        return AgentLoopOutput(
            prompt_ids=t.prompt_ids,
            response_ids=t.response_ids[:n],
            response_mask=mask,
            response_logprobs=None if t.logprobs_missing else t.response_logprobs[:n],
            num_turns=t.user_turns + t.assistant_turns + 1,
            metrics=t.metrics,
            extra_fields=extra,
        )
