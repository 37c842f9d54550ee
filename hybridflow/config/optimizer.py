"""Optimizer sections (``actor.optim``, ``critic.optim``; veRL's optim/fsdp.yaml): AdamW's settings and
the learning-rate schedule (linear warmup, then constant or cosine)."""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import ClassVar

from hybridflow.config.base import BaseConfig, doc
from hybridflow.config.errors import ConfigError, check_one_of
from hybridflow.config.status import honoured

__all__ = ["ADAMW_ARGUMENTS", "LR_SCHEDULERS", "OptimizerConfig", "FSDPOptimizerConfig"]

LR_SCHEDULERS = ("constant", "cosine")
_ADAMW = "hybridflow trains with torch.optim.AdamW"
# torch.optim.AdamW's keyword arguments (torch 2.x), the ones override_optimizer_config may set
ADAMW_ARGUMENTS = frozenset(
    "lr betas eps weight_decay amsgrad maximize foreach capturable differentiable fused decoupled_weight_decay".split()
)


@dataclass
class OptimizerConfig(BaseConfig):
    """The optimizer keys every training engine reads."""

    # the trainer fills in the step counts once it knows the dataset size
    _mutable_fields = {"clip_grad", "total_training_steps", "lr_warmup_steps"}

    lr: float = doc(1e-3, "learning rate")
    lr_warmup_steps_ratio: float = doc(0.0, "warmup steps as a fraction of total_training_steps")
    total_training_steps: int = doc(-1, "steps of the schedule; filled in by the trainer at run time")
    weight_decay: float = doc(0.01, "AdamW weight decay")
    lr_warmup_steps: int | None = doc(-1, "warmup steps; >= 0 wins over lr_warmup_steps_ratio")
    betas: tuple[float, float] = doc((0.9, 0.999), "AdamW betas")
    clip_grad: float | None = doc(1.0, "gradient-norm clip (null or 0: none)")
    grad_clip: float | None = doc(None, "deprecated spelling of clip_grad, which it replaces when set (veRL)")

    def __post_init__(self):
        if self.grad_clip is not None:  # veRL: the deprecated key wins, with a warning
            warnings.warn("`grad_clip` is deprecated, use `clip_grad` instead.", DeprecationWarning, stacklevel=3)
            self.clip_grad = self.grad_clip

    def check_values(self) -> None:  # veRL's OptimizerConfig only needs lr set when built
        if self.lr < 0:
            raise ConfigError(f"optim.lr must be >= 0, got {self.lr}")
        if len(self.betas) != 2:
            raise ConfigError(f"optim.betas must be two numbers, got {self.betas!r}")


@dataclass
class FSDPOptimizerConfig(OptimizerConfig):
    """``optim`` of the FSDP/DDP engine: the optimizer class and the schedule's shape."""

    _mutable_fields = OptimizerConfig._mutable_fields | {"lr_scheduler_type"}
    # the schedules the engine of this section implements (a class attribute, not a key)
    lr_schedulers: ClassVar[tuple[str, ...]] = LR_SCHEDULERS

    _target_: str = doc("verl.workers.config.FSDPOptimizerConfig", "the class this section is read into")
    optimizer: str = doc("AdamW", "optimizer class name in optimizer_impl", values=("AdamW",), reason=_ADAMW)
    optimizer_impl: str = doc("torch.optim", "module of the optimizer class", values=("torch.optim",), reason=_ADAMW)
    min_lr_ratio: float | None = doc(None, "cosine: the floor of the schedule, as a fraction of lr")
    num_cycles: float = doc(0.5, "cosine: number of cosine cycles over the decay (0.5: one half-wave down)")
    lr_scheduler_type: str = doc("constant", "constant | cosine (after the warmup)", values=("constant", "cosine"))
    zero_indexed_step: bool = doc(
        True, "count the schedule's steps from 0", values=(True,), reason="hybridflow's schedule does"
    )
    warmup_style: str | None = doc(None, "deprecated spelling of lr_scheduler_type (wins when set)")
    override_optimizer_config: dict | None = doc(
        None,
        "keyword arguments of torch.optim.AdamW that replace or add to the above (eps, amsgrad, fused, ...)",
        keys={"**": honoured()},  # its entries are AdamW's arguments, checked when the section is built
    )

    def __post_init__(self):
        """veRL's checks when built: the deprecated ``warmup_style``, when set, is a known schedule and
        replaces ``lr_scheduler_type`` (with a DeprecationWarning); the schedule is one this engine has;
        ``override_optimizer_config`` names only AdamW's arguments."""
        super().__post_init__()
        unknown = sorted(set(self.override_optimizer_config or {}) - ADAMW_ARGUMENTS)
        if unknown:
            raise ConfigError(
                f"optim.override_optimizer_config has {unknown}, which torch.optim.AdamW does not take; "
                f"it takes: {', '.join(sorted(ADAMW_ARGUMENTS))}"
            )
        if self.warmup_style is not None:
            if self.warmup_style not in self.lr_schedulers:
                raise ConfigError(
                    f"optim.warmup_style={self.warmup_style!r} (deprecated spelling of "
                    f"optim.lr_scheduler_type) is not one of {', '.join(self.lr_schedulers)}"
                )
            if self.warmup_style != self.lr_scheduler_type:
                warnings.warn(
                    "optim.warmup_style is deprecated; use optim.lr_scheduler_type", DeprecationWarning, stacklevel=3
                )
                self.lr_scheduler_type = self.warmup_style
        check_one_of("optim.lr_scheduler_type", self.lr_scheduler_type, self.lr_schedulers)

    def check_values(self) -> None:
        super().check_values()
        if self.min_lr_ratio is not None and not 0.0 <= self.min_lr_ratio <= 1.0:
            raise ConfigError(f"optim.min_lr_ratio must be in [0, 1], got {self.min_lr_ratio}")
