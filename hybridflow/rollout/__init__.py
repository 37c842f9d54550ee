"""What the agent loop needs to know about a rollout engine, and nothing more: the request
(``SamplingParams``), the answer (``TokenOutput``), the server interface (``AsyncRolloutServer``), the
event-loop thread a server lives on (``EngineLoop``) and the registry of server kinds.

The engines themselves (``hf``, ``vllm``) live in ``hybridflow.workers.rollout`` and register here. This
package sits below ``agent_loop`` so that the agent loop can drive any engine without importing the
workers, while the workers (whose ``generate_sequences`` runs an agent loop) sit above it.
"""

from hybridflow.rollout.sampling import SamplingParams
from hybridflow.rollout.server import (
    ROLLOUT_SERVERS,
    AsyncRolloutServer,
    EngineLoop,
    ServerSpec,
    TokenOutput,
    register_rollout_server,
    rollout_server_class,
)

__all__ = [
    "ROLLOUT_SERVERS",
    "AsyncRolloutServer",
    "EngineLoop",
    "SamplingParams",
    "ServerSpec",
    "TokenOutput",
    "register_rollout_server",
    "rollout_server_class",
]
