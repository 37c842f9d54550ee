"""``verl.experimental.agent_loop.tool_agent_loop`` names."""

from hybridflow.agent_loop.tool_agent import ToolAgentLoop  # noqa: F401
