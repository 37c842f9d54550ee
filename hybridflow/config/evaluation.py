"""configs/evaluation.yaml as a declaration: offline scoring of generated responses
(``python -m hybridflow.main_eval``; veRL 0.9.1's evaluation.yaml keys)."""

from __future__ import annotations

from dataclasses import dataclass

from hybridflow.config.base import BaseConfig, doc, section
from hybridflow.config.legacy import LegacyRayInitConfig
from hybridflow.config.ray import RayKwargsConfig
from hybridflow.config.reward import CustomRewardFunctionConfig

__all__ = ["EvaluationDataConfig", "EvaluationConfig"]


@dataclass
class EvaluationDataConfig(BaseConfig):
    """``data`` of evaluation.yaml: the generated responses and the columns read."""

    path: str = doc("/tmp/math_Qwen2-7B-Instruct.parquet", "parquet written by main_generation")
    prompt_key: str = doc("prompt", "column holding the prompt")
    response_key: str = doc("responses", "column holding the list of responses of each prompt")
    data_source_key: str = doc("data_source", "scores are reported per value of this column")
    reward_model_key: str = doc("reward_model", "column holding {style, ground_truth}")


@dataclass
class EvaluationConfig(BaseConfig):
    """configs/evaluation.yaml."""

    data: EvaluationDataConfig = section(EvaluationDataConfig, "the responses to score")
    custom_reward_function: CustomRewardFunctionConfig = section(CustomRewardFunctionConfig, "your scoring function")
    ray_kwargs: RayKwargsConfig = section(
        RayKwargsConfig,
        "accepted; scoring runs in this process",
        absent=("ray_init.runtime_env", "ray_init.address", "ray_init.include_dashboard"),
        note="main_eval scores in its own process and does not start Ray",
    )
    ray_init: LegacyRayInitConfig = section(
        LegacyRayInitConfig, "earlier spelling of ray_kwargs (null: not set)", absent=("address", "include_dashboard")
    )
