"""A role's ``checkpoint`` section (veRL's CheckpointConfig): what a checkpoint holds and what is read back."""

from __future__ import annotations

from dataclasses import dataclass

from hybridflow.config.base import BaseConfig, doc
from hybridflow.config.errors import ConfigError

__all__ = ["CheckpointConfig", "CHECKPOINT_CONTENTS"]

CHECKPOINT_CONTENTS = ("model", "optimizer", "extra", "hf_model")
_ASYNC_STRICT = "asynchronous / non-strict checkpoints are not implemented (veRL: async_save with Megatron only)"


@dataclass
class CheckpointConfig(BaseConfig):
    """``<role>.checkpoint``."""

    _target_: str = doc("verl.trainer.config.CheckpointConfig", "the class this section is read into")
    save_contents: list[str] = doc(["model", "optimizer", "extra"], "what is saved; hf_model adds a HF directory")
    load_contents: list[str] = doc(["model", "optimizer", "extra"], "what is read back", follows="${.save_contents}")
    async_save: bool = doc(False, "save in the background", refused=_ASYNC_STRICT)
    strict: bool = doc(True, "refuse a checkpoint whose keys do not match the model", refused=_ASYNC_STRICT)
    save_lora_only: bool = doc(False, "save LoRA adapters only", refused="adapter-only checkpoints: not implemented")

    def check_values(self) -> None:  # veRL's CheckpointConfig checks nothing when built
        for key in ("save_contents", "load_contents"):
            unknown = sorted(set(getattr(self, key)) - set(CHECKPOINT_CONTENTS))
            if unknown:
                raise ConfigError(
                    f"checkpoint.{key} has unknown entries {unknown}; known: {', '.join(CHECKPOINT_CONTENTS)}"
                )
