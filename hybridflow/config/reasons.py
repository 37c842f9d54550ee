"""Reasons that several config keys give for their status (``doc(..., refused=VLM)``); a reason
that only one place gives is written at that place."""

from __future__ import annotations

from hybridflow.config.refused import MEGATRON

__all__ = [
    "MEGATRON",
    "PROFILER",
    "PROFILER_TOOLS",
    "VLM",
    "TARGET",
    "NO_SP",
    "SP",
    "NPU",
    "VLLM_ENGINE",
    "JUDGE",
    "JUDGE_VLLM",
    "speed_only",
]


def speed_only(what: str) -> str:
    """The reason of a speed/memory setting that hybridflow accepts with a note."""
    return f"{what}: a speed/memory setting hybridflow does not apply (results are the same)"


PROFILER = "profiling is not implemented (the timing_s/* metrics time every phase)"
PROFILER_TOOLS = (
    "torch: torch.profiler traces; nsys needs NVIDIA Nsight Systems on CUDA and npu an Ascend NPU, "
    "neither of which hybridflow drives; torch_memory and precision_debugger are not implemented"
)
VLM = "vision-language (multi-modal) models and data are not supported"
TARGET = "a veRL dataclass path; hybridflow validates the config into its own types"
NO_SP = "Ulysses sequence parallelism is implemented for the PPO actor, reference policy and critic only"
SP = (
    "Ulysses sequence parallelism: ranks form dp x sp groups, each group runs a slice of every packed sequence "
    "(needs model.use_remove_padding=True; the number of ranks and the attention heads must divide by it; token "
    "budgets are multiplied by it, as in veRL); the top-level key wins when > 1"
)
NPU = "hybridflow does not run on Ascend NPUs (CUDA GPUs and cpu only)"
VLLM_ENGINE = "read by the vllm rollout; the hf rollout ignores it (config checks print a note)"
JUDGE = (
    "the engine that serves a generative reward model (reward.reward_manager.name=genrm); a discriminative "
    "reward model (any other reward manager) is scored by hybridflow's FSDP worker, which does not read it "
    "(config checks print a note)"
)
# every vLLM engine (policy, judge, teacher) goes through workers/rollout/vllm_settings.py
CPU_NO_CHUNKED_PREFILL = "vLLM on cpu runs without it (its CPU generators cannot resume a seeded prompt cut in chunks)"
JUDGE_VLLM = "read by the vllm judge engine (reward.reward_manager.name=genrm); the hf engine ignores it"
