"""``verl.experimental.agent_loop.agent_loop`` names (see the package docstring)."""

from hybridflow.agent_loop.base import AGENT_LOOPS, AgentLoopBase, AgentLoopOutput, register  # noqa: F401
from hybridflow.agent_loop.manager import AgentLoopManager  # noqa: F401
from hybridflow.agent_loop.server_manager import ServerManager as AsyncLLMServerManager  # noqa: F401
from hybridflow.agent_loop.worker import AgentLoopWorker  # noqa: F401


async def get_trajectory_info(step: int, index: list, validate: bool) -> list[dict]:
    """Per sample: step, its dataset index, which of the ``n`` samples of that index it is, validate (veRL's helper)."""
    out, rollout_n = [], 0
    for i, idx in enumerate(index):
        rollout_n = rollout_n + 1 if i > 0 and index[i - 1] == idx else 0
        out.append({"step": step, "sample_index": idx, "rollout_n": rollout_n, "validate": validate})
    return out
