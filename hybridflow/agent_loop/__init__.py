"""The agent loop: one asyncio task per trajectory over the asynchronous rollout server.

``single_turn_agent`` (one generation) is the simplest loop, so single-turn and multi-turn rollouts
share one pipeline: ``AgentLoopManager`` (driver) -> ``AgentLoopWorker`` (one task per trajectory)
-> ``ServerManager`` -> the rollout servers hosted by the rollout workers.
"""

from hybridflow.agent_loop import single_turn_agent  # noqa: F401  (registers single_turn_agent)
from hybridflow.agent_loop.base import AGENT_LOOPS, AgentLoopBase, AgentLoopOutput, AgentLoopSettings, register
from hybridflow.agent_loop.server_manager import ServerManager
from hybridflow.agent_loop.worker import AgentLoopWorker

__all__ = ["AGENT_LOOPS", "AgentLoopBase", "AgentLoopOutput", "AgentLoopSettings", "AgentLoopWorker",
           "ServerManager", "register"]
