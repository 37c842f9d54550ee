"""``verl.experimental.agent_loop.tool_parser`` names."""

from hybridflow.agent_loop.tool_parser import (  # noqa: F401
    TOOL_PARSERS,
    FunctionCall,
    HermesToolParser,
    ToolParser,
    register_tool_parser,
)
