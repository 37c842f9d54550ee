"""``verl.experimental.agent_loop``'s public names, served by ``hybridflow.agent_loop``.

Code written against veRL 0.9.1 changes only the package name::

    from hybridflow.experimental.agent_loop import AgentLoopBase, AgentLoopOutput
    from hybridflow.experimental.agent_loop.agent_loop import register

Differences from veRL: a loop is built as ``cls(settings, server_manager, tokenizer, tools=..., interactions=...,
**kwargs)`` (``self.rollout_config`` gives the rollout section with attribute access) and ``run`` receives
``SamplingParams`` (``server_manager.generate`` also takes veRL's dict of sampling keys).
"""

from hybridflow.experimental.agent_loop.agent_loop import (
    AgentLoopBase,
    AgentLoopManager,
    AgentLoopOutput,
    AgentLoopWorker,
    get_trajectory_info,
    register,
)
from hybridflow.experimental.agent_loop.single_turn_agent_loop import SingleTurnAgentLoop
from hybridflow.experimental.agent_loop.tool_agent_loop import ToolAgentLoop

__all__ = [
    "AgentLoopBase",
    "AgentLoopManager",
    "AgentLoopOutput",
    "AgentLoopWorker",
    "SingleTurnAgentLoop",
    "ToolAgentLoop",
    "get_trajectory_info",
    "register",
]
