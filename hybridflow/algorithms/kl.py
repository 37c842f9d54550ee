"""KL estimators between the policy and the reference, the KL coefficient controllers, and the
KL-penalised reward.

Estimators (per token, x = logprob - ref_logprob, i.e. log pi/pi_ref on samples from pi):

- ``kl`` / ``k1``: x                         (unbiased, high variance, can be negative)
- ``abs``:         |x|
- ``mse`` / ``k2``: x^2 / 2
- ``low_var_kl`` / ``k3``: exp(-x) + x - 1   (unbiased, non-negative; clamped to [-10, 10])
- a ``+`` suffix (``k1+``, ``k3+``, ...) keeps the estimator's value but takes the gradient of
  ``k2`` (straight-through), which is the unbiased gradient of KL when used as a loss.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from hybridflow.config.access import cfg_get
from hybridflow.utils.registry import Registry
from hybridflow.utils.torch_functional import masked_mean

__all__ = [
    "KL_PENALTY_REGISTRY",
    "register_kl_penalty",
    "kl_penalty",
    "AdaptiveKLController",
    "FixedKLController",
    "get_kl_controller",
    "compute_rewards",
    "apply_kl_penalty_to_rewards",
]

KLFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
KL_PENALTY_REGISTRY: Registry[KLFn] = Registry("kl_penalty")


def register_kl_penalty(*names: str):
    """Decorator adding a KL estimator ``fn(logprob, ref_logprob) -> (B, T)`` under one or more names."""

    def add(fn: KLFn) -> KLFn:
        for name in names:
            KL_PENALTY_REGISTRY.register(name, fn)
        return fn

    return add


@register_kl_penalty("kl", "k1")
def _kl_k1(logprob, ref_logprob):
    return logprob - ref_logprob


@register_kl_penalty("abs")
def _kl_abs(logprob, ref_logprob):
    return (logprob - ref_logprob).abs()


@register_kl_penalty("mse", "k2")
def _kl_k2(logprob, ref_logprob):
    return 0.5 * (logprob - ref_logprob).square()


@register_kl_penalty("low_var_kl", "k3")
def _kl_k3(logprob, ref_logprob):
    # http://joschu.net/blog/kl-approx.html ; the clamps keep exp() finite on outliers.
    log_ratio = torch.clamp(ref_logprob - logprob, min=-20, max=20)
    kld = torch.exp(log_ratio) - log_ratio - 1
    return torch.clamp(kld, min=-10, max=10)


@register_kl_penalty("full")
def _kl_full(logprob, ref_logprob):
    raise NotImplementedError(
        "kl_penalty='full' needs the full vocabulary distributions of both models, which this "
        "function does not receive; use one of the sampled estimators: "
        + ", ".join(n for n in KL_PENALTY_REGISTRY.names() if n != "full")
    )


def kl_penalty(logprob: torch.Tensor, ref_logprob: torch.Tensor, kl_penalty: str) -> torch.Tensor:
    """Per-token KL estimate (B, T) of the named type (see the module docstring)."""
    straight_through = kl_penalty.endswith("+")
    name = kl_penalty[:-1] if straight_through else kl_penalty
    value = KL_PENALTY_REGISTRY[name](logprob, ref_logprob)
    if not straight_through or name in ("mse", "k2"):
        return value
    grad_path = _kl_k2(logprob, ref_logprob)
    return grad_path - grad_path.detach() + value.detach()


class AdaptiveKLController:
    """Adaptive KL coefficient (Ziegler et al. 2019, https://arxiv.org/abs/1909.08593): moves the
    coefficient towards keeping the observed KL near ``target_kl``, by at most 20% per horizon."""

    def __init__(self, init_kl_coef: float, target_kl: float, horizon: float):
        self.value = float(init_kl_coef)
        self.target = float(target_kl)
        self.horizon = float(horizon)

    def update(self, current_kl, n_steps: int) -> None:
        error = min(max(float(current_kl) / self.target - 1.0, -0.2), 0.2)
        self.value *= 1.0 + error * n_steps / self.horizon


class FixedKLController:
    """Constant KL coefficient; ``update`` does nothing (and never reads ``current_kl``)."""

    def __init__(self, kl_coef: float):
        self.value = float(kl_coef)

    def update(self, current_kl, n_steps: int) -> None:
        pass


def get_kl_controller(kl_ctrl: Any):
    """Build a controller from a section with ``type`` (fixed|adaptive), ``kl_coef`` and, for
    adaptive, ``target_kl`` and ``horizon`` (an object or a mapping, e.g. ``algorithm.kl_ctrl``)."""
    kind = cfg_get(kl_ctrl, "type", "fixed")
    kl_coef = cfg_get(kl_ctrl, "kl_coef", 0.001)
    if kind == "fixed":
        return FixedKLController(kl_coef=kl_coef)
    if kind == "adaptive":
        horizon = cfg_get(kl_ctrl, "horizon", 10000)
        target_kl = cfg_get(kl_ctrl, "target_kl", 0.1)
        if horizon <= 0:
            raise ValueError(f"kl_ctrl.horizon must be > 0, got {horizon}")
        return AdaptiveKLController(init_kl_coef=kl_coef, target_kl=target_kl, horizon=horizon)
    raise NotImplementedError(f"unknown kl_ctrl.type {kind!r}; known: adaptive, fixed")


def compute_rewards(token_level_scores, old_log_prob, ref_log_prob, kl_ratio):
    """scores - kl_ratio * (old_log_prob - ref_log_prob), per token (veRL's k1 reward shaping)."""
    return token_level_scores - kl_ratio * (old_log_prob - ref_log_prob)


def apply_kl_penalty_to_rewards(
    token_level_scores: torch.Tensor,
    old_log_prob: torch.Tensor,
    ref_log_prob: torch.Tensor,
    response_mask: torch.Tensor,
    kl_ctrl,
    kl_penalty: str = "kl",
) -> tuple[torch.Tensor, dict[str, Any]]:
    """rewards = scores - beta * KL per response token, then let ``kl_ctrl`` see the batch KL.

    Returns (token_level_rewards (B, T), metrics). ``actor/reward_kl_penalty`` (mean over
    sequences of the per-sequence mean KL) stays a 0-d tensor; the coefficient is the one used
    here, read before the controller update. Only an adaptive controller reads the KL value.
    """
    kld = _kl_estimate(old_log_prob, ref_log_prob, kl_penalty) * response_mask  # (B, T)
    beta = kl_ctrl.value
    token_level_rewards = token_level_scores - beta * kld
    current_kl = masked_mean(kld, response_mask, axis=-1).mean()  # mean over sequences
    kl_ctrl.update(current_kl=current_kl, n_steps=token_level_scores.shape[0])
    metrics = {"actor/reward_kl_penalty": current_kl.detach(), "actor/reward_kl_penalty_coeff": beta}
    return token_level_rewards, metrics


_kl_estimate = kl_penalty  # the parameter named like the function shadows it inside the function above
