"""configs/generation.yaml as a declaration: offline sampling of n responses per prompt
(``python -m hybridflow.main_generation``; veRL 0.9.1 has none, the keys are veRL main's). Its sections
are the ppo_trainer classes at another place: their generation defaults, less the keys this file lacks."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from hybridflow.config.actor import FSDPActorConfig
from hybridflow.config.base import BaseConfig, doc, placed, section
from hybridflow.config.engine import FSDPEngineConfig
from hybridflow.config.errors import ConfigError
from hybridflow.config.legacy import LegacyRayInitConfig
from hybridflow.config.model import HFModelConfig
from hybridflow.config.ray import RayKwargsConfig, timeline_problem
from hybridflow.config.rollout import NOT_ENGINES, SGLANG, RolloutConfig, rollout_as_in_yaml
from hybridflow.config.status import noted, refused
from hybridflow.config.trainer import TrainerConfig

__all__ = ["GenerationDataConfig", "GenerationConfig"]


_ENTROPY = ("entropy_from_logits_with_chunking", "entropy_checkpointing")


def _all_but(cls: type, *keep: str) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls) if f.name not in keep)


@dataclass
class GenerationDataConfig(BaseConfig):
    """``data`` of generation.yaml: the prompts and where the responses go."""

    path: str | list[str] = doc("~/data/rlhf/math/test.parquet", "parquet of the prompts (hybridflow: or a list)")
    prompt_key: str = doc("prompt", "column holding the chat messages")
    n_samples: int = doc(5, "responses per prompt")
    output_path: str = doc("/opt/tiger/math_Qwen2-7B-Instruct.parquet", "the prompts plus a responses column")
    batch_size: int = doc(128, "prompts per generation call")
    apply_chat_template_kwargs: dict = doc({}, "hybridflow: extra arguments of the tokenizer's chat template")


_ROLLOUT_KEYS = (
    "_target_ name mode temperature top_k top_p prompt_length response_length dtype gpu_memory_utilization ignore_eos "
    "enforce_eager free_cache_engine load_format tensor_model_parallel_size data_parallel_size max_num_batched_tokens "
    "max_model_len max_num_seqs seed engine_kwargs log_prob_micro_batch_size log_prob_micro_batch_size_per_gpu "
    "do_sample disable_log_stats enable_chunked_prefill n calculate_log_probs"
).split()

# generation.yaml's rollout values where they differ from ppo_trainer.yaml's
_ROLLOUT_VALUES = dict(mode="sync", top_k=50, top_p=0.7, prompt_length=1536, enforce_eager=True, load_format="auto")
_ROLLOUT_VALUES.update(max_num_seqs=1024, engine_kwargs={"vllm": {"kv_cache_memory_bytes": None}})
_ROLLOUT_VALUES.update(log_prob_micro_batch_size_per_gpu=8, calculate_log_probs=False)


@dataclass
class GenerationConfig(BaseConfig):
    """configs/generation.yaml."""

    trainer: TrainerConfig = section(
        TrainerConfig, "the devices", absent=_all_but(TrainerConfig, "nnodes", "n_gpus_per_node", "device", "backend")
    )
    data: GenerationDataConfig = section(GenerationDataConfig, "the prompts and the output file")
    model: HFModelConfig = section(
        placed(HFModelConfig, path="~/models/Qwen2-7B-Instruct"),
        "the policy model",
        absent=_all_but(HFModelConfig, "path", "external_lib", "trust_remote_code", "override_config"),
    )
    rollout: RolloutConfig = section(
        placed(rollout_as_in_yaml, **_ROLLOUT_VALUES),
        "the inference engine and its sampling",
        absent=_all_but(RolloutConfig, *_ROLLOUT_KEYS),
        keys={
            **dict.fromkeys(
                ("log_prob_micro_batch_size", "log_prob_micro_batch_size_per_gpu"),
                noted("no log-probs are computed here"),
            ),
            **dict.fromkeys(("engine_kwargs.sglang.**", "engine_kwargs.trtllm.**"), refused(NOT_ENGINES)),
            **dict.fromkeys(("server.**", "sglang_rollout_mode"), refused(SGLANG)),
        },
    )
    actor: FSDPActorConfig = section(
        FSDPActorConfig,
        "veRL keeps this section for backward compatibility; generation does not train",
        absent=(
            *_all_but(FSDPActorConfig, *"strategy ulysses_sequence_parallel_size fsdp_config".split(), *_ENTROPY),
            *(f"fsdp_config.{k}" for k in _all_but(FSDPEngineConfig, "fsdp_size", "forward_prefetch")),
        ),
        note="main_generation does not train (veRL keeps this section for backward compatibility)",
    )
    ray_kwargs: RayKwargsConfig = section(RayKwargsConfig, "Ray start-up", absent=("ray_init.runtime_env",))
    ray_init: LegacyRayInitConfig = section(LegacyRayInitConfig, "earlier spelling of ray_kwargs (null: not set)")

    def validate(self) -> list[str]:
        """Raises ConfigError for sizes below 1; returns notes."""
        d = self.data
        if problem := timeline_problem(self.ray_kwargs, self.trainer.backend):
            raise ConfigError(problem)
        if d.n_samples < 1 or d.batch_size < 1:
            raise ConfigError(f"data.n_samples and data.batch_size must be >= 1, got {d.n_samples}, {d.batch_size}")
        if not self.rollout.do_sample and d.n_samples > 1:
            return [f"rollout.do_sample=False with data.n_samples={d.n_samples}: the responses will be identical"]
        return []
