"""A role's ``checkpoint`` section (veRL's CheckpointConfig): what a checkpoint holds and what is read back."""

from __future__ import annotations

from dataclasses import dataclass

from hybridflow.config.base import BaseConfig, doc
from hybridflow.config.errors import ConfigError

__all__ = ["CheckpointConfig", "CHECKPOINT_CONTENTS"]

CHECKPOINT_CONTENTS = ("model", "optimizer", "extra", "hf_model")


@dataclass
class CheckpointConfig(BaseConfig):
    """``<role>.checkpoint``."""

    _target_: str = doc("verl.trainer.config.CheckpointConfig", "the class this section is read into")
    save_contents: list[str] = doc(
        ["model", "optimizer", "extra"], "what a checkpoint holds; add hf_model for a HF directory"
    )
    load_contents: list[str] = doc(
        ["model", "optimizer", "extra"], "what is read back on resume", follows="${.save_contents}"
    )
    async_save: bool = doc(
        False,
        "save in the background (not implemented)",
        refused="asynchronous / non-strict checkpoints are not implemented",
    )
    strict: bool = doc(
        True,
        "refuse a checkpoint whose keys do not match the model",
        refused="asynchronous / non-strict checkpoints are not implemented",
    )
    save_lora_only: bool = doc(
        False,
        "with LoRA adapters, save only the adapter weights (veRL; not in its yaml)",
        refused="adapter-only checkpoints are not implemented (a checkpoint holds the whole model state)",
    )

    def check_values(self) -> None:  # veRL's CheckpointConfig checks nothing when built
        for key in ("save_contents", "load_contents"):
            unknown = sorted(set(getattr(self, key)) - set(CHECKPOINT_CONTENTS))
            if unknown:
                raise ConfigError(
                    f"checkpoint.{key} has unknown entries {unknown}; known: {', '.join(CHECKPOINT_CONTENTS)}"
                )
