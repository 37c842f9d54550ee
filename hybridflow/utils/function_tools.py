"""veRL's ``@function_tool``: a plain Python function as a tool of the multi-turn rollout (registry, schema,
file loading; in utils because the agent loop's tools and the datasets' prompt-length filter both read it).

A file named by ``actor_rollout_ref.rollout.multi_turn.function_tool_path`` (and ``data.function_tool_path``,
which follows it, for the prompt-length filter) defines functions such as::

    from hybridflow.tools.function_tool import function_tool   # veRL: verl.tools.function_tool

    @function_tool
    def add(a: int, b: int) -> int:
        \"\"\"Add two integers.

        Args:
            a: the first number
            b: the second number
        \"\"\"
        return a + b

The tool's OpenAI schema comes from the type hints and the Google-style docstring
(``transformers.utils.get_json_schema``, as veRL builds it). The tool is stateless: the loop calls it with
the model's arguments (``tools_kwargs`` of the sample are not passed; write a ``BaseTool`` for state), a
plain function in a thread, a coroutine function awaited. Its value becomes the tool message: a string as it
is, a dict as JSON, ``(response, reward[, metrics])`` for a step reward, a ``ToolResponse`` as it is.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hybridflow.utils.import_utils import load_module_from_file
from hybridflow.utils.tool_schemas import OpenAIFunctionToolSchema, ToolResponse

logger = logging.getLogger(__name__)

__all__ = ["FunctionSpec", "function_tool", "function_schema", "tool_result", "load_function_tools"]

FUNCTION_TOOLS: dict[str, FunctionSpec] = {}  # every function tool registered in this process, by name
_LOADED: dict[str, list[FunctionSpec]] = {}  # a file's tools, by its absolute path (a file runs once)
DEFAULT_KEY = "actor_rollout_ref.rollout.multi_turn.function_tool_path"


@dataclass(frozen=True)
class FunctionSpec:
    """A registered function: its tool name, the function and its OpenAI schema (``hybridflow.tools.function_tool``
    wraps it as the agent loop's tool; the datasets read only the schema)."""

    name: str
    fn: Callable[..., Any]
    tool_schema: OpenAIFunctionToolSchema

    @property
    def is_async(self) -> bool:
        return inspect.iscoroutinefunction(self.fn)

    async def call(self, parameters: dict[str, Any]) -> tuple[ToolResponse, float, dict]:
        """The function on the model's arguments (a plain one in a thread), its value as ``tool_result`` gives it."""
        value = await self.fn(**parameters) if self.is_async else await asyncio.to_thread(self.fn, **parameters)
        return tool_result(value)


def function_schema(fn: Callable[..., Any], name: str) -> OpenAIFunctionToolSchema:
    """The OpenAI schema of ``fn`` under ``name``, from its type hints and Google-style docstring."""
    from transformers.utils import get_json_schema

    variadic = [
        p.name
        for p in inspect.signature(fn).parameters.values()
        if p.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    ]
    if variadic:
        raise ValueError(
            f"@function_tool {name!r} ({fn.__module__}.{fn.__qualname__}) takes {variadic}, which an OpenAI tool "
            "schema cannot describe; name each parameter"
        )
    raw = get_json_schema(fn)  # raises naming the missing docstring / Args entry / type hint
    raw["function"]["name"] = name
    return OpenAIFunctionToolSchema.model_validate(raw)


def function_tool(
    name: str | Callable[..., Any] | None = None, *, schema: OpenAIFunctionToolSchema | dict | None = None
):
    """Register a function as a tool: ``@function_tool``, ``@function_tool("name")`` or
    ``@function_tool(schema={...})`` (a schema written out instead of inferred). Returns the function itself;
    a name taken by another function is an error."""

    def register(fn: Callable[..., Any], tool_name: str | None) -> Callable[..., Any]:
        tool_name = tool_name or fn.__name__
        if schema is None:
            built = function_schema(fn, tool_name)
        else:
            built = (
                schema
                if isinstance(schema, OpenAIFunctionToolSchema)
                else OpenAIFunctionToolSchema.model_validate(schema)
            )
        taken = FUNCTION_TOOLS.get(tool_name)
        if taken is not None and taken.fn is not fn:
            raise ValueError(
                f"function tool {tool_name!r} is already {taken.fn.__module__}.{taken.fn.__qualname__}; "
                f"{fn.__module__}.{fn.__qualname__} needs another name"
            )
        FUNCTION_TOOLS[tool_name] = FunctionSpec(tool_name, fn, built)
        return fn

    if callable(name):  # the bare decorator
        return register(name, None)
    return lambda fn: register(fn, name)


def tool_result(value: Any) -> tuple[ToolResponse, float, dict]:
    """A function's return value as the loop's (response, step reward, metrics), in veRL's shapes."""
    if isinstance(value, tuple):
        if not 1 <= len(value) <= 3:
            raise TypeError(
                f"a function tool returned a tuple of {len(value)}: return (response,), (response, reward) or "
                f"(response, reward, metrics); got {value!r}"
            )
        reward = 0.0 if len(value) < 2 or value[1] is None else float(value[1])
        metrics = {} if len(value) < 3 or value[2] is None else dict(value[2])
        return _response(value[0]), reward, metrics
    return _response(value), 0.0, {}


def _response(value: Any) -> ToolResponse:
    if isinstance(value, ToolResponse):
        return value
    if isinstance(value, dict):
        return ToolResponse(text=json.dumps(value, ensure_ascii=False))
    return ToolResponse(text=value if isinstance(value, str) else str(value))


def load_function_tools(path: str, key: str = DEFAULT_KEY) -> list[FunctionSpec]:
    """Run the Python file ``path`` once and return the tools it registered, in name order; errors name ``key``."""
    full = os.path.abspath(os.path.expanduser(str(path)))
    if full in _LOADED:
        return _LOADED[full]
    if not os.path.isfile(full):
        raise FileNotFoundError(f"{key}={path!r}: no such file")
    before = set(FUNCTION_TOOLS)
    load_module_from_file(full)  # once per process; its decorators register into FUNCTION_TOOLS
    names = sorted(set(FUNCTION_TOOLS) - before)
    if not names:
        raise ValueError(f"{key}={path!r}: the file defines no @function_tool function")
    logger.info("function tools from %s: %s", full, names)
    _LOADED[full] = tools = [FUNCTION_TOOLS[n] for n in names]
    return tools
