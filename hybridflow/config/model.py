"""The model sections (``actor_rollout_ref.model``, ``critic.model``; veRL's hf_model.yaml): which
Hugging Face model and tokenizer, how it is loaded, and LoRA."""

from __future__ import annotations

from dataclasses import dataclass

from hybridflow.config.base import BaseConfig, doc, section
from hybridflow.config.errors import ConfigError
from hybridflow.config.reasons import MEGATRON, speed_only

__all__ = ["MtpConfig", "HFModelConfig", "CriticModelConfig"]

_KERNELS_SPEED = speed_only("fused CUDA/Triton kernels, tiled MLP")
_PEFT = "LoRA needs the [lora] extra (peft)"

_MEGATRON_LORA = {
    "type": "lora",
    "merge": False,
    "rank": 0,
    "alpha": 32,
    "dropout": 0.0,
    "target_modules": ["linear_qkv", "linear_proj", "linear_fc1", "linear_fc2"],
    "exclude_modules": [],
    "dropout_position": "pre",
    "lora_A_init_method": "xavier",
    "lora_B_init_method": "zero",
    "a2a_experimental": False,
    "dtype": None,
    "adapter_path": None,
    "freeze_vision_model": True,
    "freeze_vision_projection": True,
    "freeze_language_model": True,
}

# the pre-0.9.1 spelling of critic.fsdp: every key null (not set)
_LEGACY_FSDP = {
    **dict.fromkeys(("_target_",)),
    "wrap_policy": {"min_num_params": None},
    **dict.fromkeys(
        "param_offload optimizer_offload offload_policy reshard_after_forward fsdp_size forward_prefetch model_dtype "
        "use_orig_params seed full_determinism ulysses_sequence_parallel_size entropy_from_logits_with_chunking "
        "use_torch_compile entropy_checkpointing forward_only strategy dtype".split()
    ),
    "mixed_precision": dict.fromkeys(("param_dtype", "reduce_dtype", "buffer_dtype")),
}


@dataclass
class MtpConfig(BaseConfig):
    """``model.mtp``: multi-token prediction layers (not implemented by hybridflow)."""

    _target_: str = doc("verl.workers.config.MtpConfig", "the class this section is read into")
    enable: bool = doc(False, "load and save the MTP parameters")
    enable_train: bool = doc(False, "train with the MTP layers")
    enable_rollout: bool = doc(False, "speculative decoding with the MTP layers")
    detach_encoder: bool = doc(False, "detach the encoder in MTP training")
    mtp_loss_scaling_factor: float = doc(0.1, "weight of the MTP loss")
    speculative_algorithm: str = doc("EAGLE", "SGLang's speculative algorithm")
    speculative_num_steps: int = doc(3, "SGLang's speculative steps")
    speculative_eagle_topk: int = doc(1, "SGLang's EAGLE top-k")
    speculative_num_draft_tokens: int = doc(4, "SGLang's draft tokens")
    method: str = doc("mtp", "vLLM's speculative method")
    num_speculative_tokens: int = doc(1, "vLLM's speculative tokens")


@dataclass
class HFModelConfig(BaseConfig):
    """A Hugging Face model directory and how it is loaded (the policy's and the critic's)."""

    _target_: str = doc("verl.workers.config.HFModelConfig", "the class this section is read into")
    path: str = doc("~/models/deepseek-llm-7b-chat", "model directory (or hub name) of the weights")
    hf_config_path: str | None = doc(
        None,
        "a folder whose config.json the trained model (and the hf rollout's copy) is built from, the weights still "
        "from path; null: path's. vLLM reads path's config, as veRL's rollout does",
    )
    tokenizer_path: str | None = doc(
        None,
        "tokenizer directory; null: model.path's",
        reason="the policy's tokenizer (workers, and the driver unless data.tokenizer names one); null: model.path's",
    )
    use_shm: bool = doc(False, "copy the model to shared memory first", note="it only speeds up loading")
    trust_remote_code: bool = doc(False, "allow the model's own Python code")
    custom_chat_template: str | None = doc(
        None,
        "a chat template replacing the tokenizer's",
        reason="replaces the tokenizer's chat template (prompts, multi-turn messages, saved checkpoints), as veRL does",
    )
    external_lib: str | None = doc(None, "a module imported first, e.g. to register a custom architecture")
    override_config: dict = doc({}, "entries that replace the model's config.json values")
    enable_gradient_checkpointing: bool = doc(True, "recompute activations in backward to save memory")
    enable_activation_offload: bool = doc(
        False, "offload activations to host memory", reason="CUDA only; on cpu activations already live in host memory"
    )
    use_remove_padding: bool = doc(True, "pack sequences without padding in forward passes")
    lora_rank: int = doc(0, "LoRA rank; > 0 turns LoRA on", reason=_PEFT)
    lora_alpha: int = doc(16, "LoRA scaling", reason=_PEFT)
    target_modules: str | list[str] = doc("all-linear", "LoRA targets: all-linear or a list of names", reason=_PEFT)
    exclude_modules: str | None = doc(None, "modules LoRA leaves out", reason=_PEFT)
    lora_adapter_path: str | None = doc(None, "a saved LoRA adapter", reason="a peft adapter to continue training")
    use_liger: bool = doc(False, "Liger kernels (CUDA)", note=_KERNELS_SPEED)
    use_fused_kernels: bool = doc(False, "fused log-prob/entropy kernels (CUDA)", note=_KERNELS_SPEED)
    fused_kernel_options: dict = doc({"impl_backend": "torch"}, "options of the fused kernels", note=_KERNELS_SPEED)
    tiled_mlp: dict = doc({"enabled": False, "num_shards": 4}, "tiled MLP", note=_KERNELS_SPEED)
    mtp: MtpConfig = section(MtpConfig, "multi-token prediction", refused="multi-token prediction is not implemented")
    lora: dict = doc(
        _MEGATRON_LORA,
        "Megatron's LoRA settings (merge: how LoRA weights reach a vllm rollout)",
        refused=MEGATRON + "; LoRA is configured with model.lora_rank/lora_alpha/target_modules",
    )

    def __post_init__(self):
        modules = self.target_modules
        if not (isinstance(modules, str) or (isinstance(modules, list) and all(isinstance(m, str) for m in modules))):
            raise ConfigError(f"model.target_modules must be a string or a list of strings, got {modules!r}")


@dataclass
class CriticModelConfig(HFModelConfig):
    """``critic.model``: the value model, plus the pre-0.9.1 spelling of ``critic.fsdp``."""

    fsdp_config: dict = doc(_LEGACY_FSDP, "before veRL 0.9.1: critic.fsdp (mapped onto it at load time); null: not set")
