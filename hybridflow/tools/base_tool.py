"""``BaseTool``: what a tool is to the agent loop (veRL's ``verl.tools.base_tool.BaseTool`` contract).

One tool object serves every trajectory of an agent loop worker; per-trajectory state lives under an
instance id. For each call the ``tool_agent`` loop runs, in order:

1. ``create(create_kwargs=...)`` -> (instance_id, ToolResponse): ``create_kwargs`` comes from the
   sample's ``extra_info.tools_kwargs[<tool name>].create_kwargs`` (e.g. a ground truth);
2. ``execute(instance_id, parameters)`` -> (ToolResponse, step reward, metrics dict): ``parameters`` is
   the decoded JSON arguments of the model's call; the step reward becomes one of the trajectory's
   ``tool_rewards`` (turn-level scores, handed to the reward function in ``extra_info``);
3. ``release(instance_id)``.

``calc_reward(instance_id)`` is the tool's own view of how well the trajectory did so far. Tools
know text and arguments, never engines; the loop applies the timeout, the concurrency bound and the
error handling around them (a tool that raises or hangs gives the model an error message).
"""

from __future__ import annotations

from typing import Any
from uuid import uuid4

from hybridflow.utils.tool_schemas import OpenAIFunctionToolSchema, ToolResponse


class BaseTool:
    def __init__(self, config: dict, tool_schema: OpenAIFunctionToolSchema | None):
        self.config = dict(config or {})
        self.tool_schema = tool_schema or self.get_openai_tool_schema()
        if self.tool_schema is None:
            raise ValueError(f"{type(self).__name__}: no tool_schema given and get_openai_tool_schema() returned None")
        self.name = self.tool_schema.function.name

    def get_openai_tool_schema(self) -> OpenAIFunctionToolSchema | None:
        return getattr(self, "tool_schema", None)

    async def create(self, instance_id: str | None = None, **kwargs) -> tuple[str, ToolResponse]:
        return (instance_id or str(uuid4())), ToolResponse()

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs) -> tuple[ToolResponse, float, dict]:
        return ToolResponse(text="Updated the tool state."), 0.0, {}

    async def calc_reward(self, instance_id: str, **kwargs) -> float:
        return 0.0

    async def release(self, instance_id: str, **kwargs) -> None:
        pass
