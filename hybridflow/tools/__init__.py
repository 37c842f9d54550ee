"""Tools the multi-turn ``tool_agent`` loop can call (veRL's ``verl.tools`` module paths).

``BaseTool`` (``base_tool``) is the contract; tools are configured by a veRL-format yaml
(``tool_registry``). Built in: ``gsm8k_tool.Gsm8kTool`` (veRL's demo), ``calculator_tool.CalculatorTool``,
``code_tool.CodeInterpreterTool`` (local sandbox; also under veRL's ``sandbox_fusion_tools.SandboxFusionTool``).
"""

from hybridflow.tools.base_tool import BaseTool
from hybridflow.tools.schemas import OpenAIFunctionToolSchema, ToolResponse
from hybridflow.tools.tool_registry import initialize_tools_from_config

__all__ = ["BaseTool", "OpenAIFunctionToolSchema", "ToolResponse", "initialize_tools_from_config"]
