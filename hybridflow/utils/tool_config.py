"""Tools from a veRL-format yaml file (``actor_rollout_ref.rollout.multi_turn.tool_config_path``); in utils
because the tools, the agent loop and the datasets all read it::

    tools:
      - class_name: hybridflow.tools.calculator_tool.CalculatorTool   # or verl.tools..., or file.py:Class
        config: {type: native, timeout: 5}
        tool_schema: {type: function, function: {name: calc, description: ..., parameters: ...}}

Each entry becomes ``cls(config=<config>, tool_schema=OpenAIFunctionToolSchema)``. Class names follow
``hybridflow.utils.import_utils.load_class`` (veRL module paths map to hybridflow's). What hybridflow
does not implement fails here with a message that says so: MCP tools (``config.type: mcp``) and
veRL's tools that need images or outside services.
"""

from __future__ import annotations

import os
from typing import Any

import yaml

from hybridflow.utils.import_utils import load_class
from hybridflow.utils.tool_schemas import OpenAIFunctionToolSchema

# veRL tool classes hybridflow does not provide, and why
UNSUPPORTED_VERL_TOOLS = {
    "MCPBaseTool": "MCP tools are not supported by hybridflow",
    "MCPSearchTool": "MCP tools are not supported by hybridflow",
    "ImageZoomInTool": "image tools are not supported: hybridflow's rollout is text-only",
    "Geo3kTool": "geo3k is a vision-language task and image inputs are not supported: hybridflow's rollout is text-only",  # noqa: E501
    "SearchTool": "veRL's SearchTool calls a retrieval server that hybridflow does not provide; "
    "write a BaseTool subclass that calls your service",
}
TOOL_TYPES = ("native",)


def _entries(tools_config_file: str) -> list:
    path = os.path.expanduser(str(tools_config_file))
    if not os.path.isfile(path):
        raise FileNotFoundError(
            f"tool config file not found: {path} (actor_rollout_ref.rollout.multi_turn.tool_config_path)"
        )
    with open(path) as f:
        text = f.read()
    if "${" in text:  # veRL reads these files with OmegaConf; a tool list has no use for interpolation
        raise ValueError(f"tool config {path}: ${{...}} interpolations are not supported in tool config files")
    cfg = yaml.safe_load(text)
    tools = cfg.get("tools") if isinstance(cfg, dict) else None
    if tools is None:
        raise ValueError(f"tool config {path}: expected a top-level 'tools:' list")
    return list(tools)


def check_tool_entry(entry, path: str, index: int) -> None:
    """Refuse what hybridflow does not implement, naming the file and the entry."""
    where = f"tool config {path}, tools[{index}]"
    if not isinstance(entry, dict) or "class_name" not in entry:
        raise ValueError(f"{where}: no class_name")
    tool_type = str((entry.get("config") or {}).get("type", "native"))
    if tool_type == "mcp":
        raise NotImplementedError(
            f"{where} ({entry['class_name']}): config.type=mcp: MCP tools are not supported by hybridflow"
        )
    if tool_type not in TOOL_TYPES:
        raise ValueError(f"{where} ({entry['class_name']}): config.type={tool_type!r} is not one of {TOOL_TYPES}")
    short = str(entry["class_name"]).rsplit(".", 1)[-1].rsplit(":", 1)[-1]
    if str(entry["class_name"]).startswith("verl.") and short in UNSUPPORTED_VERL_TOOLS:
        raise NotImplementedError(f"{where} ({entry['class_name']}): {UNSUPPORTED_VERL_TOOLS[short]}")


def get_tool_class(cls_name: str, base_dir: str | None = None) -> type:
    return load_class(cls_name, "tool class", base_dir=base_dir)


def check_tool_config(tools_config_file: str) -> list[str]:
    """Validate the file without building the tools (config checks at start-up); returns the tool names."""
    path = os.path.expanduser(str(tools_config_file))
    names = []
    for i, entry in enumerate(_entries(path)):
        check_tool_entry(entry, path, i)
        get_tool_class(entry["class_name"], os.path.dirname(os.path.abspath(path)))
        schema = entry.get("tool_schema")
        if schema is not None:
            names.append(OpenAIFunctionToolSchema.model_validate(schema).function.name)
    return names


def initialize_tools_from_config(tools_config_file: str) -> list[Any]:
    """The tool objects of a tool yaml, in file order; duplicate tool names are an error."""
    path = os.path.expanduser(str(tools_config_file))
    tools, seen = [], {}
    for i, entry in enumerate(_entries(path)):
        check_tool_entry(entry, path, i)
        cls = get_tool_class(entry["class_name"], os.path.dirname(os.path.abspath(path)))
        schema_cfg = entry.get("tool_schema")
        schema = OpenAIFunctionToolSchema.model_validate(schema_cfg) if schema_cfg is not None else None
        config = dict(entry.get("config") or {})
        tool = cls(config=config, tool_schema=schema)
        if tool.name in seen:
            raise ValueError(
                f"tool config {path}: tool name {tool.name!r} is used by tools[{seen[tool.name]}] and tools[{i}]"
            )
        seen[tool.name] = i
        tools.append(tool)
    return tools


def rollout_tools(tool_config_path: str | None, function_tool_path: str | None = None) -> tuple[list[Any], list[Any]]:
    """The multi-turn rollout's tools: the yaml's tool objects (``multi_turn.tool_config_path``) and the
    ``@function_tool`` functions of a Python file (``multi_turn.function_tool_path``, as ``FunctionSpec``s); a
    name in both is an error. The agent loop wraps the functions as tools, the datasets read the schemas."""
    from hybridflow.utils.function_tools import load_function_tools

    tools = initialize_tools_from_config(tool_config_path) if tool_config_path else []
    functions = load_function_tools(function_tool_path) if function_tool_path else []
    clash = sorted(set(t.name for t in tools) & set(f.name for f in functions))
    if clash:
        raise ValueError(
            f"tool name(s) {clash} are both in multi_turn.tool_config_path={tool_config_path!r} and in "
            f"multi_turn.function_tool_path={function_tool_path!r}; rename one"
        )
    return tools, functions


def tool_schemas(tool_config_path: str | None, function_tool_path: str | None = None) -> list[dict]:
    """The OpenAI schemas of the rollout's tools (the yaml's, then the functions'), as the chat template gets them."""
    tools, functions = rollout_tools(tool_config_path, function_tool_path)
    return [t.tool_schema.model_dump(exclude_unset=True, exclude_none=True) for t in [*tools, *functions]]


def check_function_tools(function_tool_path: str) -> list[str]:
    """The function tools' names (config checks at start-up: the file runs, as the workers will run it)."""
    from hybridflow.utils.function_tools import load_function_tools

    return [t.name for t in load_function_tools(function_tool_path)]
