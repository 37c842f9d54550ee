"""Policy-gradient losses.

Registered losses share veRL 0.9.1's signature and return shape:
``fn(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config, rollout_is_weights)
-> (pg_loss, pg_metrics)``. ``config`` is the actor section (object or mapping: ``clip_ratio``,
``clip_ratio_low``, ``clip_ratio_high``, ``clip_ratio_c``); its ``global_batch_info`` (``dp_size``,
``batch_num_tokens``, ``global_batch_size``, ``loss_scale_factor``; set by the actor for each
mini-batch) is handed to ``agg_loss``, so a loss written for veRL gets the same normalisation here.
``pg_metrics`` maps veRL's metric names (``actor/pg_clipfrac``, ``actor/ppo_kl``,
``actor/pg_clipfrac_lower``) to detached 0-d tensors: veRL returns Python floats, we avoid the host
sync (``float(v)`` works on both). The older ``compute_policy_loss`` keeps veRL's 4-tuple.

Here: vanilla (clipped PPO), gspo, gpg. veRL 0.9.1's other losses live beside it: clip_cov and kl_cov
(``policy_loss_cov.py``), cispo, dppo_tv, dppo_kl and dro (``policy_loss_logprob.py``), geo_mean and
sapo (``policy_loss_ratio.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from hybridflow.algorithms.loss_agg import agg_loss
from hybridflow.config.access import cfg_get
from hybridflow.utils.registry import Registry
from hybridflow.utils.torch_functional import masked_mean

__all__ = [
    "POLICY_LOSS_REGISTRY",
    "ConfigWithBatchInfo",
    "register_policy_loss",
    "get_policy_loss_fn",
    "compute_policy_loss",
    "compute_policy_loss_vanilla",
    "compute_policy_loss_gspo",
    "compute_policy_loss_gpg",
    "compute_policy_loss_reinforce",
]

PolicyLossFn = Callable[..., tuple[torch.Tensor, dict[str, Any]]]
POLICY_LOSS_REGISTRY: Registry[PolicyLossFn] = Registry("policy loss", unknown="Unsupported loss mode: {name}")


def register_policy_loss(name: str):
    """Decorator registering a policy loss under ``name`` (``actor.policy_loss.loss_mode``); as in veRL, a
    loss registered under a taken name replaces the earlier one."""
    return POLICY_LOSS_REGISTRY.register(name, override=True)


def get_policy_loss_fn(name: str) -> PolicyLossFn:
    return POLICY_LOSS_REGISTRY[name]


class ConfigWithBatchInfo(Mapping):
    """A read-only view of an actor config with ``global_batch_info`` set, so a policy loss written
    for veRL (which reads ``config.global_batch_info``) normalises over the global mini-batch
    without the config itself being mutated. Attribute, item and ``.get`` access all work."""

    def __init__(self, config: Any, global_batch_info: dict):
        object.__setattr__(self, "_config", config)
        object.__setattr__(self, "global_batch_info", dict(global_batch_info))

    def __getattr__(self, name: str):
        config = object.__getattribute__(self, "_config")
        if isinstance(config, Mapping):
            try:
                return config[name]
            except KeyError:
                raise AttributeError(name) from None
        return getattr(config, name)

    def __setattr__(self, name, value):
        raise AttributeError("ConfigWithBatchInfo is read-only")

    def __getitem__(self, key: str):
        if key == "global_batch_info":
            return self.global_batch_info
        try:
            return getattr(self, key)
        except AttributeError:
            raise KeyError(key) from None

    def _keys(self) -> list:
        config = self._config
        keys = list(config.keys()) if isinstance(config, Mapping) else list(vars(config))
        return keys + ([] if "global_batch_info" in keys else ["global_batch_info"])

    def __iter__(self):
        return iter(self._keys())

    def __len__(self) -> int:
        return len(self._keys())


def _agg_kwargs(config: Any, global_token_count=None, global_seq_count=None) -> dict:
    """agg_loss keyword arguments: the config's ``global_batch_info`` (veRL), else its
    ``loss_scale_factor``; the keyword counts (older hybridflow callers) fill what is missing."""
    info = cfg_get(config, "global_batch_info")
    kwargs = dict(info) if info else {"loss_scale_factor": cfg_get(config, "loss_scale_factor")}
    if global_token_count is not None and kwargs.get("batch_num_tokens") is None:
        kwargs["batch_num_tokens"] = global_token_count
    if global_seq_count is not None and kwargs.get("global_batch_size") is None:
        kwargs["global_batch_size"] = global_seq_count
    return kwargs


def _metrics(pg_clipfrac, ppo_kl, pg_clipfrac_lower) -> dict[str, torch.Tensor]:
    return {
        "actor/pg_clipfrac": pg_clipfrac.detach(),
        "actor/ppo_kl": ppo_kl.detach(),
        "actor/pg_clipfrac_lower": pg_clipfrac_lower.detach(),
    }


def _log_ratio(log_prob: torch.Tensor, old_log_prob: torch.Tensor) -> torch.Tensor:
    # Clamped so that exp() stays finite for wildly off-policy tokens.
    return torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0)


def _clipped_ppo(
    old_log_prob,
    log_prob,
    advantages,
    response_mask,
    clip_low,
    clip_high,
    clip_ratio_c,
    loss_agg_mode,
    weights=None,
    **agg_kwargs,
):
    if clip_low is None or clip_high is None:
        raise ValueError("clipped PPO needs a clip range (cliprange / clip_ratio)")
    if not clip_ratio_c > 1.0:
        raise ValueError(f"clip_ratio_c (dual-clip bound) must be > 1.0, got {clip_ratio_c}")

    log_ratio = _log_ratio(log_prob, old_log_prob)  # (B, T)
    ratio = torch.exp(log_ratio)
    ppo_kl = masked_mean(-log_ratio, response_mask)

    loss_unclipped = -advantages * ratio
    loss_clipped = -advantages * torch.clamp(ratio, 1 - clip_low, 1 + clip_high)
    loss_ppo = torch.maximum(loss_unclipped, loss_clipped)  # pessimistic of the two
    pg_clipfrac = masked_mean(torch.gt(loss_clipped, loss_unclipped).float(), response_mask)

    # Dual clip (https://arxiv.org/abs/1912.09729): for A < 0 the loss is capped at -A * c, so a huge
    # ratio on a bad action cannot dominate the update.
    loss_cap = -advantages * clip_ratio_c
    negative = advantages < 0
    pg_losses = torch.where(negative, torch.minimum(loss_ppo, loss_cap), loss_ppo)
    pg_clipfrac_lower = masked_mean((torch.gt(loss_ppo, loss_cap) & negative).float(), response_mask)

    if weights is not None:
        pg_losses = pg_losses * weights
    pg_loss = agg_loss(pg_losses, response_mask, loss_agg_mode, **agg_kwargs)
    return pg_loss, pg_clipfrac.detach(), ppo_kl.detach(), pg_clipfrac_lower.detach()


def compute_policy_loss(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    cliprange: float | None = None,
    cliprange_low: float | None = None,
    cliprange_high: float | None = None,
    clip_ratio_c: float = 3.0,
    loss_agg_mode: str = "token-mean",
    *,
    global_token_count=None,
    global_seq_count=None,
    loss_scale_factor=None,
):
    """Clipped PPO (https://arxiv.org/abs/1707.06347) with clip-higher and dual clip.

    ratio = exp(log_prob - old_log_prob); per token
    loss = max(-A * ratio, -A * clip(ratio, 1 - cliprange_low, 1 + cliprange_high)), and for A < 0
    additionally min(loss, -A * clip_ratio_c). ``cliprange_low``/``cliprange_high`` default to
    ``cliprange``. Returns (pg_loss, pg_clipfrac, ppo_kl, pg_clipfrac_lower).
    """
    low = cliprange if cliprange_low is None else cliprange_low
    high = cliprange if cliprange_high is None else cliprange_high
    return _clipped_ppo(
        old_log_prob,
        log_prob,
        advantages,
        response_mask,
        low,
        high,
        clip_ratio_c,
        loss_agg_mode,
        global_token_count=global_token_count,
        global_seq_count=global_seq_count,
        loss_scale_factor=loss_scale_factor,
    )


def _clip_range(config: Any) -> tuple[float, float]:
    clip_ratio = cfg_get(config, "clip_ratio", 0.2)
    return cfg_get(config, "clip_ratio_low", clip_ratio), cfg_get(config, "clip_ratio_high", clip_ratio)


@register_policy_loss("vanilla")
def compute_policy_loss_vanilla(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any | None = None,
    rollout_is_weights: torch.Tensor | None = None,
    *,
    global_token_count=None,
    global_seq_count=None,
):
    """``compute_policy_loss`` with its clip ranges read from the actor config (clip_ratio 0.2 and
    clip_ratio_c 3.0 when absent); ``rollout_is_weights`` (B, T) rescale the per-token losses.
    Returns (pg_loss, {actor/pg_clipfrac, actor/ppo_kl, actor/pg_clipfrac_lower})."""
    low, high = _clip_range(config)
    pg_loss, clipfrac, ppo_kl, clipfrac_lower = _clipped_ppo(
        old_log_prob,
        log_prob,
        advantages,
        response_mask,
        low,
        high,
        cfg_get(config, "clip_ratio_c", 3.0),
        loss_agg_mode,
        weights=rollout_is_weights,
        **_agg_kwargs(config, global_token_count, global_seq_count),
    )
    return pg_loss, _metrics(clipfrac, ppo_kl, clipfrac_lower)


@register_policy_loss("gspo")
def compute_policy_loss_gspo(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "seq-mean-token-mean",
    config: Any | None = None,
    rollout_is_weights: torch.Tensor | None = None,
    *,
    global_token_count=None,
    global_seq_count=None,
):
    """GSPO (https://arxiv.org/abs/2507.18071): one importance ratio per sequence, the geometric
    mean of its token ratios, s_i = exp(mean_t log(pi/pi_old)), clipped like PPO.

    Per token the value is s_i while the gradient flows through that token's own log-prob
    (s_i,t = sg[s_i] * pi_t / sg[pi_t]), as in the paper. Meant for ``seq-mean-token-mean``.
    """
    low, high = _clip_range(config)
    log_ratio = log_prob - old_log_prob  # (B, T)
    lengths = response_mask.sum(dim=-1).clamp(min=1)  # (B,)
    seq_log_ratio = (log_ratio * response_mask).sum(dim=-1) / lengths  # (B,)
    token_log_ratio = log_prob - log_prob.detach() + seq_log_ratio.detach().unsqueeze(-1)  # (B, T)
    ratio = torch.exp(torch.clamp(token_log_ratio, max=10.0))

    loss_unclipped = -advantages * ratio
    loss_clipped = -advantages * torch.clamp(ratio, 1 - low, 1 + high)
    pg_losses = torch.maximum(loss_unclipped, loss_clipped)
    if rollout_is_weights is not None:
        pg_losses = pg_losses * rollout_is_weights
    pg_loss = agg_loss(
        pg_losses, response_mask, loss_agg_mode, **_agg_kwargs(config, global_token_count, global_seq_count)
    )
    pg_clipfrac = masked_mean(torch.gt(loss_clipped, loss_unclipped).float(), response_mask)
    ppo_kl = masked_mean(-log_ratio, response_mask)
    return pg_loss, _metrics(pg_clipfrac, ppo_kl, torch.zeros_like(pg_clipfrac))


@register_policy_loss("gpg")
def compute_policy_loss_gpg(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any | None = None,
    rollout_is_weights: torch.Tensor | None = None,
    *,
    global_token_count=None,
    global_seq_count=None,
):
    """GPG (https://arxiv.org/abs/2504.02546): plain policy gradient, -log_prob * A, no ratio.
    Returns (pg_loss, {})."""
    pg_losses = -log_prob * advantages
    if rollout_is_weights is not None:
        pg_losses = pg_losses * rollout_is_weights
    pg_loss = agg_loss(
        pg_losses, response_mask, loss_agg_mode, **_agg_kwargs(config, global_token_count, global_seq_count)
    )
    return pg_loss, {}  # veRL's gpg reports no ratio statistics (there is no ratio)


def compute_policy_loss_reinforce(
    rollout_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "seq-mean-token-sum",
    config: Any | None = None,
    rollout_is_weights: torch.Tensor | None = None,
    *,
    global_token_count=None,
    global_seq_count=None,
):
    """REINFORCE with optional importance weights: per token -w * A * log_prob, no ratio, no clip.

    The rollout correction's bypass mode uses it (``loss_type=reinforce``, as in veRL, where it is not
    a registered ``loss_mode`` either): ``w`` = truncated π_θ/π_rollout, detached, so the gradient is
    the importance-weighted policy gradient. ``actor/ppo_kl`` is mean(log π_rollout - log π_θ).
    Returns (pg_loss, metrics)."""
    pg_losses = -advantages * log_prob
    if rollout_is_weights is not None:
        pg_losses = pg_losses * rollout_is_weights
    pg_loss = agg_loss(
        pg_losses, response_mask, loss_agg_mode, **_agg_kwargs(config, global_token_count, global_seq_count)
    )
    ppo_kl = masked_mean(rollout_log_prob - log_prob, response_mask).detach()
    zero = torch.zeros_like(ppo_kl)
    return pg_loss, _metrics(zero, ppo_kl, zero)
