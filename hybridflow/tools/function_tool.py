"""veRL's ``verl.tools.function_tool``: ``@function_tool`` functions as the agent loop's tools.

The registry, the schema and the file loading are ``hybridflow.utils.function_tools`` (the datasets read the
schemas too); here a registered function becomes a ``BaseTool`` without state, so the ``tool_agent`` loop runs
it like any tool of the yaml (``create`` and ``release`` do nothing, ``tools_kwargs`` are not passed).
"""

from __future__ import annotations

from typing import Any

from hybridflow.tools.base_tool import BaseTool
from hybridflow.utils.function_tools import FunctionSpec, function_schema, function_tool, tool_result
from hybridflow.utils.tool_config import rollout_tools
from hybridflow.utils.tool_schemas import ToolResponse

__all__ = ["FunctionTool", "function_tool", "function_schema", "tool_result", "load_tools"]


class FunctionTool(BaseTool):
    """A registered function as the agent loop's tool."""

    def __init__(self, spec: FunctionSpec):
        super().__init__({}, spec.tool_schema)
        self.spec = spec

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs) -> tuple[ToolResponse, float, dict]:
        return await self.spec.call(parameters)


def load_tools(tool_config_path: str | None, function_tool_path: str | None = None) -> list[BaseTool]:
    """The multi-turn rollout's tools: the yaml's (``multi_turn.tool_config_path``), then the ``@function_tool``
    functions of a Python file (``multi_turn.function_tool_path``); a name in both is an error."""
    tools, functions = rollout_tools(tool_config_path, function_tool_path)
    return [*tools, *(FunctionTool(spec) for spec in functions)]
