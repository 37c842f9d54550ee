"""The ``data`` section (veRL's legacy_data.yaml; veRL reads it as a plain mapping): which parquet files,
how prompts are read and cut, and the batch of prompts drawn per step."""

from __future__ import annotations

from dataclasses import dataclass

from hybridflow.config.base import BaseConfig, doc, section
from hybridflow.config.module import ModuleConfig
from hybridflow.config.reasons import VLM, speed_only
from hybridflow.config.rules import Problems

__all__ = ["DataSamplerConfig", "DataConfig"]

_LOADER_SPEED = speed_only("shared-memory copies, loader/filter processes")
_NO_CUSTOM = "custom sampler and data-generator classes are not implemented"

_MT = "actor_rollout_ref.rollout.multi_turn"
TRUNCATIONS = ("error", "left", "right", "middle")


@dataclass
class DataSamplerConfig(BaseConfig):
    """``data.sampler``: a Sampler class of your own (veRL main's key; e.g. a curriculum)."""

    class_path: str | None = doc(None, "file or module of the sampler class")
    class_name: str | None = doc(None, "the sampler class")


@dataclass
class DataConfig(BaseConfig):
    """``data``: the training and validation prompts."""

    tokenizer: str | None = doc(None, "tokenizer directory; null: the tokenizer of actor_rollout_ref.model.path")
    use_shm: bool = doc(False, "copy the files to shared memory first (speed only)", note=_LOADER_SPEED)
    train_files: str | list[str] = doc("~/data/rlhf/gsm8k/train.parquet", "a parquet path or a list of paths")
    val_files: str | list[str] = doc("~/data/rlhf/gsm8k/test.parquet", "validation parquet path(s)")
    train_max_samples: int = doc(
        -1, "rows of the training files used (the first ones; drawn with data.seed when data.shuffle); -1: every row"
    )
    val_max_samples: int = doc(-1, "rows of the validation files used (chosen as train_max_samples's); -1: every row")
    prompt_key: str = doc("prompt", "column holding the chat messages")
    reward_fn_key: str = doc("data_source", "column that selects the reward scorer")
    max_prompt_length: int = doc(512, "prompts are left-padded to this many tokens")
    max_response_length: int = doc(512, "generation stops after this many tokens")
    train_batch_size: int = doc(1024, "prompts per training step")
    gen_batch_size: int | None = doc(
        None,
        "prompts per generation batch under algorithm.filter_groups (DAPO: a few times train_batch_size, so one "
        "batch usually holds a step's informative groups; the surplus is trimmed); null: data.train_batch_size",
    )
    val_batch_size: int | None = doc(
        None, "deprecated", note="deprecated in veRL; validation runs the whole validation set as one batch"
    )
    tool_config_path: str | None = doc(
        None,
        "tool schemas counted in the prompt length",
        follows=f"${{{_MT}.tool_config_path}}",
        reason="the tool schemas counted in the prompt length when data.filter_overlong_prompts is set (default: "
        "the rollout's tools)",
    )
    function_tool_path: str | None = doc(
        None,
        "@function_tool functions counted in the prompt length",
        follows=f"${{{_MT}.function_tool_path}}",
        reason="their schemas are counted in the prompt length when data.filter_overlong_prompts is set (default: "
        "the rollout's)",
    )
    return_raw_input_ids: bool = doc(
        False,
        "also the untemplated prompt ids",
        note="veRL 0.9 reads it nowhere; a reward model gets the conversation in its own template and tokenizer "
        "(reward_model.model.input_tokenizer decodes the response)",
    )
    return_raw_chat: bool = doc(True, "also return the chat messages (the agent loop templates them)")
    return_full_prompt: bool = doc(False, "also return the templated prompt text")
    shuffle: bool = doc(True, "shuffle the training prompts every epoch")
    seed: int | None = doc(1, "hybridflow: 1 (veRL: null, an unseeded sampler), so runs are reproducible")
    dataloader_num_workers: int = doc(8, "processes reading the data", note=_LOADER_SPEED)
    image_patch_size: int = doc(14, "vision models' patch size", refused=VLM)
    validation_shuffle: bool = doc(
        False, "validate the prompts in an order drawn from data.seed and the step (default: file order)"
    )
    filter_overlong_prompts: bool = doc(False, "drop prompts longer than max_prompt_length")
    filter_overlong_prompts_workers: int = doc(1, "processes measuring the prompts", note=_LOADER_SPEED)
    truncation: str = doc("error", "error | left | right | middle, for prompts that are too long")
    image_key: str = doc("images", "column of the images (vision models are not supported)", refused=VLM)
    video_key: str = doc("videos", "column of the videos (not supported)", refused=VLM)
    audio_key: str = doc("audios", "column of the audio clips (not supported)", refused=VLM)
    trust_remote_code: bool = doc(
        False,
        "allow the tokenizer's own Python code",
        reason="the tokenizer trusts remote code when this key or actor_rollout_ref.model.trust_remote_code is true",
    )
    custom_cls: ModuleConfig = section(ModuleConfig, "a Dataset class of your own: file path + class name")
    sampler: DataSamplerConfig = section(DataSamplerConfig, "a Sampler class of your own", refused=_NO_CUSTOM)
    datagen: ModuleConfig = section(ModuleConfig, "a dynamic data generator (veRL main's key)", refused=_NO_CUSTOM)
    return_multi_modal_inputs: bool = doc(
        True, "the processor's multi-modal inputs", note="hybridflow reads text only and never returns them"
    )
    apply_chat_template_kwargs: dict = doc({}, "extra arguments of the tokenizer's apply_chat_template")
    mm_processor_kwargs: dict = doc({}, "extra arguments of the multi-modal processor", refused=VLM)

    def validate(self) -> list[str]:
        p = Problems()
        if self.truncation not in TRUNCATIONS:
            p.errors.append(f"data.truncation={self.truncation!r} is not one of {', '.join(TRUNCATIONS)}")
        p.positive("data.train_batch_size", self.train_batch_size)
        return p.raise_errors()
