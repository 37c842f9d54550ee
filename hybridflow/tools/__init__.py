"""Tools the multi-turn ``tool_agent`` loop can call (veRL's ``verl.tools`` module paths).

``BaseTool`` (``base_tool``) is the contract; tools are configured by a veRL-format yaml
(``hybridflow.utils.tool_config``; the schema types: ``hybridflow.utils.tool_schemas``; both sit below the
datasets and the agent loop, which read them too). Built in: ``gsm8k_tool.Gsm8kTool`` (veRL's demo),
``calculator_tool.CalculatorTool``, ``code_tool.CodeInterpreterTool`` (local sandbox; also under veRL's
``sandbox_fusion_tools.SandboxFusionTool``, which runs the code in a SandboxFusion service when its
config names one).
"""

from hybridflow.tools.base_tool import BaseTool
from hybridflow.utils.tool_config import initialize_tools_from_config
from hybridflow.utils.tool_schemas import OpenAIFunctionToolSchema, ToolResponse

__all__ = ["BaseTool", "OpenAIFunctionToolSchema", "ToolResponse", "initialize_tools_from_config"]
