"""``verl.experimental.agent_loop.single_turn_agent_loop`` names."""

from hybridflow.agent_loop.single_turn_agent import SingleTurnAgentLoop  # noqa: F401
