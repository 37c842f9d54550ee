"""Running the tool calls of one model turn safely.

At most ``max_parallel_calls`` calls run, concurrently; each (create + execute) has a deadline (the
tool's ``config.timeout``, else ``multi_turn.tool_call_timeout``). Whatever goes wrong with a call, an
unknown tool name, arguments that are not a JSON object, a tool that raises or hangs, becomes an
error text for the model and a counted failure; it never fails the batch. A tool's text is cut to
``max_tool_response_length`` characters on ``tool_response_truncate_side`` (veRL 0.9.1's markers).
``release`` always runs (with the same deadline, failures only logged).

A tool must not block the event loop (put blocking work in ``run_in_executor``, as the code tool
does): the deadline can stop a coroutine that awaits, not a thread that never yields.
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass, field
from typing import Any

from hybridflow.agent_loop.tool_parser import FunctionCall
from hybridflow.utils.tool_schemas import ToolResponse

logger = logging.getLogger(__name__)


@dataclass
class ToolCallResult:
    name: str
    text: str
    reward: float | None = None
    failed: bool = False  # the model gets an error text instead of a result
    timed_out: bool = False
    truncated: bool = False
    tool_call_id: str | None = None
    metrics: dict = field(default_factory=dict)

    def message(self) -> dict:
        msg = {"role": "tool", "content": self.text}
        if self.tool_call_id is not None:
            msg["tool_call_id"] = self.tool_call_id
        return msg


def truncate_text(text: str, limit: int, side: str) -> tuple[str, bool]:
    """``text`` cut to ``limit`` characters: keep the end (left), the start (right) or both halves (middle)."""
    if len(text) <= limit:
        return text, False
    if side == "left":
        return "(truncated)..." + text[-limit:], True
    if side == "right":
        return text[:limit] + "...(truncated)", True
    half = limit // 2
    return text[:half] + "...(truncated)..." + text[len(text) - half :], True


class ToolCaller:
    """Runs calls against the worker's tools (``tools``: name -> BaseTool)."""

    def __init__(
        self,
        tools: dict[str, Any],
        max_parallel_calls: int,
        max_response_length: int,
        truncate_side: str,
        default_timeout: float,
    ):
        self.tools = tools
        self.max_parallel_calls = int(max_parallel_calls)
        self.max_response_length = int(max_response_length)
        self.truncate_side = truncate_side
        self.default_timeout = float(default_timeout)

    def timeout_of(self, tool) -> float:
        value = (getattr(tool, "config", None) or {}).get("timeout")
        return float(value) if value else self.default_timeout

    async def run(self, calls: list[FunctionCall], tools_kwargs: dict, **execute_kwargs) -> list[ToolCallResult]:
        """Results in call order, for the first ``max_parallel_calls`` calls."""
        picked = calls[: self.max_parallel_calls]
        return list(await asyncio.gather(*[self.call(c, tools_kwargs or {}, **execute_kwargs) for c in picked]))

    async def call(self, call: FunctionCall, tools_kwargs: dict, **execute_kwargs) -> ToolCallResult:
        tool = self.tools.get(call.name)
        if tool is None:
            return ToolCallResult(
                call.name,
                f"Unknown function '{call.name}'. Available tools: {sorted(self.tools)}",
                failed=True,
                tool_call_id=call.tool_call_id,
            )
        try:
            args = json.loads(call.arguments)
            if not isinstance(args, dict):
                raise ValueError(f"expected a JSON object, got {type(args).__name__}")
        except (ValueError, TypeError) as e:
            return ToolCallResult(
                call.name,
                f"Invalid JSON in arguments for '{call.name}': {e}",
                failed=True,
                tool_call_id=call.tool_call_id,
            )
        create_kwargs = (tools_kwargs.get(call.name) or {}).get("create_kwargs") or {}
        timeout = self.timeout_of(tool)
        holder: dict = {}
        try:
            response, reward, metrics = await asyncio.wait_for(
                self._create_and_execute(tool, args, create_kwargs, holder, execute_kwargs), timeout
            )
        except asyncio.TimeoutError:
            return ToolCallResult(
                call.name,
                f"Error executing tool '{call.name}': timed out after {timeout:g} s",
                failed=True,
                timed_out=True,
                tool_call_id=call.tool_call_id,
            )
        except Exception as e:  # a tool's own bug or bad arguments: the model learns it failed
            logger.debug("tool %s raised", call.name, exc_info=True)
            return ToolCallResult(
                call.name, f"Error executing tool '{call.name}': {e}", failed=True, tool_call_id=call.tool_call_id
            )
        finally:
            if "instance_id" in holder:
                await self._release(tool, holder["instance_id"], timeout)
        if not isinstance(response, ToolResponse):
            response = ToolResponse(text=str(response))
        if response.image or response.video:
            raise NotImplementedError(
                f"tool {call.name!r} returned an image or video: image tools are not supported "
                "(hybridflow's rollout is text-only)"
            )
        text, truncated = truncate_text(response.text or "", self.max_response_length, self.truncate_side)
        return ToolCallResult(
            call.name,
            text,
            None if reward is None else float(reward),
            truncated=truncated,
            tool_call_id=call.tool_call_id,
            metrics=dict(metrics or {}),
        )

    @staticmethod
    async def _create_and_execute(tool, args: dict, create_kwargs: dict, holder: dict, execute_kwargs: dict):
        instance_id, _ = await tool.create(create_kwargs=create_kwargs)
        holder["instance_id"] = instance_id
        return await tool.execute(instance_id, args, **execute_kwargs)

    @staticmethod
    async def _release(tool, instance_id: str, timeout: float) -> None:
        try:
            await asyncio.wait_for(tool.release(instance_id), timeout)
        except Exception:  # the call's result stands; a leaking tool is the tool's problem
            logger.warning("tool %s: release(%s) failed", getattr(tool, "name", tool), instance_id, exc_info=True)
