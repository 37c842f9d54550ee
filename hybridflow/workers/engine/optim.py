"""Optimizer and learning-rate schedule (veRL's actor.optim / critic.optim keys)."""

from __future__ import annotations

import math

import torch

from hybridflow.config.optimizer import FSDPOptimizerConfig


def build_optimizer(
    params, lr: float, betas=(0.9, 0.999), weight_decay: float = 0.01, eps: float = 1e-8, overrides=None
):
    """AdamW over the trainable ``params``; ``overrides`` (``optim.override_optimizer_config``, veRL's) replace
    or add keyword arguments, as veRL's builder applies them."""
    params = [p for p in params if p.requires_grad]
    kwargs = {"lr": lr, "betas": tuple(betas), "weight_decay": weight_decay, "eps": eps, **dict(overrides or {})}
    if "betas" in kwargs:
        kwargs["betas"] = tuple(kwargs["betas"])
    return torch.optim.AdamW(params, **kwargs)


def lr_multiplier(
    step: int,
    warmup_steps: int,
    total_steps: int,
    style: str = "constant",
    min_lr_ratio: float = 0.0,
    num_cycles: float = 0.5,
) -> float:
    """Linear warmup over ``warmup_steps``, then constant or cosine decay to ``min_lr_ratio``."""
    if warmup_steps > 0 and step < warmup_steps:
        return (step + 1) / warmup_steps
    if style == "constant":
        return 1.0
    if style == "cosine":
        progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
        cosine = 0.5 * (1.0 + math.cos(math.pi * 2.0 * num_cycles * min(progress, 1.0)))
        return min_lr_ratio + (1.0 - min_lr_ratio) * cosine
    raise ValueError(f"optim.lr_scheduler_type must be 'constant' or 'cosine', got {style!r}")


def resolve_warmup_steps(lr_warmup_steps, lr_warmup_steps_ratio, total_steps: int) -> int:
    """veRL: a non-negative lr_warmup_steps wins; otherwise ratio * total steps."""
    if lr_warmup_steps is not None and int(lr_warmup_steps) >= 0:
        return int(lr_warmup_steps)
    return int(float(lr_warmup_steps_ratio or 0.0) * total_steps)


def build_lr_scheduler(optimizer, optim_cfg: FSDPOptimizerConfig, total_steps: int):
    """From the typed ``optim`` section (the deprecated warmup_style is mapped onto lr_scheduler_type when
    the config is loaded)."""
    warmup = resolve_warmup_steps(optim_cfg.lr_warmup_steps, optim_cfg.lr_warmup_steps_ratio, total_steps)
    style = optim_cfg.lr_scheduler_type
    min_ratio = float(optim_cfg.min_lr_ratio or 0.0)  # veRL: null is no floor
    cycles = float(optim_cfg.num_cycles)
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: lr_multiplier(step, warmup, total_steps, style, min_ratio, cycles)
    )
