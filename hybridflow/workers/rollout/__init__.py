"""Rollout engines behind one interface (``BaseRollout``), selected by name from ``ROLLOUT_ENGINES``.

``hf``: transformers generate, runs everywhere. ``vllm``: GPU; vLLM is imported only when one is built.
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
from hybridflow.workers.rollout.vllm_rollout import VLLMRollout

__all__ = [
    "ROLLOUT_ENGINES",
    "BaseRollout",
    "HFRollout",
    "SamplingParams",
    "VLLMRollout",
    "assemble_rollout_output",
    "get_rollout_class",
    "register_rollout",
    "response_mask_through_eos",
]
