"""The agent loop: one asyncio task per trajectory over the asynchronous rollout server.

``single_turn_agent`` (one generation) is the simplest loop and ``tool_agent`` the multi-turn one (tools,
simulated users); single-turn and multi-turn rollouts share one pipeline: ``AgentLoopManager`` (driver) ->
``AgentLoopWorker`` (one task per trajectory)
-> ``ServerManager`` -> the rollout servers hosted by the rollout workers.
"""

from hybridflow.agent_loop import openai_agent, single_turn_agent, tool_agent, tool_formats  # noqa: F401  (register the built-in loops and tool-call formats)
from hybridflow.agent_loop.base import (
    AGENT_LOOPS,
    AgentLoopBase,
    AgentLoopOutput,
    AgentLoopSettings,
    agent_loop_settings,
    register,
)
from hybridflow.agent_loop.server_manager import ServerManager
from hybridflow.agent_loop.tool_agent import ToolAgentLoop
from hybridflow.agent_loop.tool_parser import TOOL_PARSERS, ToolParser, register_tool_parser
from hybridflow.agent_loop.worker import AgentLoopWorker

__all__ = [
    "AGENT_LOOPS",
    "TOOL_PARSERS",
    "AgentLoopBase",
    "AgentLoopOutput",
    "AgentLoopSettings",
    "AgentLoopWorker",
    "agent_loop_settings",
    "ServerManager",
    "ToolAgentLoop",
    "ToolParser",
    "register",
    "register_tool_parser",
]
