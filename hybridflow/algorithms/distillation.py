"""On-policy distillation losses (veRL 0.9.1's ``distillation.distillation_loss``), looked up by ``loss_mode``.

Two kinds, as veRL registers them. The estimators of the reverse KL (``kl``/``k1``, ``abs``,
``mse``/``k2``, ``low_var_kl``/``k3``) read one log-prob per token: the sampled token's under the
student and under the teacher (the teacher is the reference of ``kl_penalty``). ``forward_kl_topk``
reads the teacher's top-k log-probs and the student's log-probs of those same tokens and sums
p_t (log p_t - log p_s) over them, clamped at 0 (top-k masses do not sum to 1), after clamping both
log-probs from below at ``log_prob_min_clamp``.

``distillation_objective`` turns per-token losses into the scalar the actor adds: clamped to
±``loss_max_clamp``, then either aggregated as a supervised loss or, with ``use_policy_gradient``,
used as the advantage ``-loss`` of the vanilla PPO loss with the section's clip ratios
(Thinking Machines' on-policy distillation). ``combine_with_task_loss`` mixes it with the task's
policy loss (``use_task_rewards``, ``distillation_loss_coef``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from hybridflow.algorithms.kl import kl_penalty
from hybridflow.algorithms.loss_agg import agg_loss
from hybridflow.algorithms.policy_loss import ConfigWithBatchInfo, get_policy_loss_fn
from hybridflow.utils.registry import Registry

__all__ = [
    "DistillationLoss",
    "DISTILLATION_LOSS_REGISTRY",
    "get_distillation_loss",
    "forward_kl_topk",
    "distillation_objective",
    "combine_with_task_loss",
]


@dataclass(frozen=True)
class DistillationLoss:
    """``fn(student, teacher, log_prob_min_clamp) -> (B, R)`` per-token losses. ``use_topk``: the
    inputs are (B, R, K) log-probs of the teacher's top-k tokens; else (B, R) sampled-token log-probs."""

    fn: Callable[[torch.Tensor, torch.Tensor, float | None], torch.Tensor]
    use_topk: bool


DISTILLATION_LOSS_REGISTRY: Registry[DistillationLoss] = Registry("distillation loss_mode")


def get_distillation_loss(name: str) -> DistillationLoss:
    return DISTILLATION_LOSS_REGISTRY[name]


def _estimator(name: str) -> DistillationLoss:
    # veRL applies no log-prob clamp to the estimators (kl_penalty's own k3 clamps stay)
    return DistillationLoss(lambda student, teacher, _clamp: kl_penalty(student, teacher, name), use_topk=False)


for _name in ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3"):
    DISTILLATION_LOSS_REGISTRY.register(_name, _estimator(_name))


def forward_kl_topk(student: torch.Tensor, teacher: torch.Tensor, log_prob_min_clamp: float | None) -> torch.Tensor:
    """sum_k p_t,k (log p_t,k - log p_s,k) over the teacher's top-k tokens, at least 0; (B, R, K) -> (B, R)."""
    student, teacher = student.float(), teacher.float()
    if log_prob_min_clamp is not None:
        student, teacher = student.clamp_min(log_prob_min_clamp), teacher.clamp_min(log_prob_min_clamp)
    return (teacher.exp() * (teacher - student)).sum(-1).clamp_min(0.0)


DISTILLATION_LOSS_REGISTRY.register("forward_kl_topk", DistillationLoss(forward_kl_topk, use_topk=True))


def distillation_objective(
    token_losses: torch.Tensor,
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    response_mask: torch.Tensor,
    loss_config: Any,
    loss_agg_mode: str,
    global_batch_info: dict,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The distillation term (scalar) and, with use_policy_gradient, the PPO loss's metrics renamed
    ``distillation/*`` (tensors); ``loss_config``: the ``distillation_loss`` section."""
    metrics: dict = {}
    bound = loss_config.loss_max_clamp
    if bound is not None:  # both sides: k1 can be negative
        token_losses = token_losses.clamp(min=-bound, max=bound)
    if not loss_config.use_policy_gradient:
        return agg_loss(token_losses, response_mask, loss_agg_mode, **global_batch_info), metrics
    out = get_policy_loss_fn(loss_config.policy_loss_mode)(
        old_log_prob=old_log_prob,
        log_prob=log_prob,
        advantages=-token_losses.detach(),
        response_mask=response_mask,
        loss_agg_mode=loss_agg_mode,
        config=ConfigWithBatchInfo(loss_config, global_batch_info),
        rollout_is_weights=rollout_is_weights,
    )
    loss, pg_metrics = out[0], out[1]
    metrics.update({f"distillation/{k.removeprefix('actor/')}": v for k, v in pg_metrics.items()})
    return loss, metrics


def combine_with_task_loss(task_loss: torch.Tensor | float, distill_loss: torch.Tensor, loss_config: Any):
    """veRL's mix: task + coef * distillation with ``use_task_rewards``, else the distillation term alone."""
    if not loss_config.use_task_rewards:
        return distill_loss
    return task_loss + loss_config.distillation_loss_coef * distill_loss
