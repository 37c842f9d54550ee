"""The policy's per-rank computations (veRL's ``DataParallelPPOActor``): log-probs of responses and
the PPO update, written against a plain ``torch.nn.Module`` so the same code runs whether the
module is wrapped by FSDP2 (``fully_shard``), FSDP1, DDP or nothing.

The update is normalised so that it equals the full-mini-batch gradient step whatever the
micro-batch size, token budget or data-parallel size (see ``workers/utils/micro_batches.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch

from hybridflow.trainer.ppo import core_algos
from hybridflow.trainer.ppo.algos.rollout_correction import RolloutCorrectionSettings, compute_policy_loss_bypass_mode
from hybridflow.utils.config_section import require
from hybridflow.workers.utils.logprob import forward_response_log_probs
from hybridflow.workers.utils.micro_batches import (
    MetricBuffer,
    accumulate,
    clip_grad_and_step,
    global_batch_info,
    grad_sync,
    response_mask_of,
    restore_order,
    split_by_token_budget,
    split_fixed,
    sync_group,
    take_rows,
)

__all__ = ["DataParallelPPOActor", "ActorSettings"]


@dataclass(frozen=True)
class ActorSettings:
    """The actor keys this class reads, parsed once."""

    ppo_mini_batch_size: int
    ppo_micro_batch_size_per_gpu: Optional[int]
    use_dynamic_bsz: bool
    ppo_max_token_len_per_gpu: int
    ppo_epochs: int
    shuffle: bool
    seed: int
    grad_clip: Optional[float]
    loss_agg_mode: str
    loss_scale_factor: Optional[float]
    entropy_coeff: float
    use_kl_loss: bool
    kl_loss_coef: float
    kl_loss_type: str
    loss_mode: str
    use_remove_padding: bool  # actor.use_remove_padding follows actor_rollout_ref.model.use_remove_padding

    @classmethod
    def from_config(cls, config: Any) -> "ActorSettings":
        """From the ``actor_rollout_ref.actor`` section (per-rank sizes, ``use_remove_padding`` copied
        in by the worker); every key is required: the defaults live in configs/ppo_trainer.yaml."""
        get = lambda key: require(config, key, "actor_rollout_ref.actor")  # noqa: E731
        mini = get("ppo_mini_batch_size")
        if mini is None or int(mini) < 1:
            raise ValueError(f"actor.ppo_mini_batch_size must be a positive per-rank sample count, got {mini!r}")
        settings = cls(
            ppo_mini_batch_size=int(mini),
            ppo_micro_batch_size_per_gpu=get("ppo_micro_batch_size_per_gpu"),
            use_dynamic_bsz=bool(get("use_dynamic_bsz")),
            ppo_max_token_len_per_gpu=int(get("ppo_max_token_len_per_gpu")),
            ppo_epochs=int(get("ppo_epochs")),
            shuffle=bool(get("shuffle")),
            seed=int(get("data_loader_seed")),
            grad_clip=get("grad_clip"),  # null or 0: no clipping
            loss_agg_mode=str(get("loss_agg_mode")),
            loss_scale_factor=get("loss_scale_factor"),
            entropy_coeff=float(get("entropy_coeff")),
            use_kl_loss=bool(get("use_kl_loss")),
            kl_loss_coef=float(get("kl_loss_coef")),
            kl_loss_type=str(get("kl_loss_type")),
            loss_mode=str(require(get("policy_loss"), "loss_mode", "actor_rollout_ref.actor.policy_loss")),
            use_remove_padding=bool(get("use_remove_padding")),
        )
        if not settings.use_dynamic_bsz and settings.ppo_micro_batch_size_per_gpu is None:
            raise ValueError("set actor.ppo_micro_batch_size_per_gpu, or use_dynamic_bsz=True with ppo_max_token_len_per_gpu")
        return settings


_PG_METRIC_NAMES = ("actor/pg_clipfrac", "actor/ppo_kl", "actor/pg_clipfrac_lower")


def _policy_loss_output(out, loss_mode: str) -> tuple[torch.Tensor, dict]:
    """(pg_loss, metrics) from a policy loss: veRL 0.9.1's ``(loss, metrics dict)`` or the older
    ``(loss, pg_clipfrac, ppo_kl, pg_clipfrac_lower)`` 4-tuple."""
    if isinstance(out, tuple) and len(out) == 2 and isinstance(out[1], dict):
        return out
    if isinstance(out, tuple) and len(out) == 4:
        return out[0], dict(zip(_PG_METRIC_NAMES, out[1:]))
    raise TypeError(
        f"policy loss {loss_mode!r} must return (pg_loss, metrics_dict) as in veRL 0.9.1 "
        f"(or the older 4-tuple), got {type(out).__name__}"
        + (f" of length {len(out)}" if isinstance(out, tuple) else "")
    )


def _meta(data, key: str):
    try:
        return data.meta_info[key]
    except KeyError:
        raise KeyError(f"data.meta_info[{key!r}] is required (set by the worker/trainer)") from None


class DataParallelPPOActor:
    """Policy computations on one data-parallel rank.

    ``config``: the ``actor_rollout_ref.actor`` section (mapping, DictConfig or object);
    ``ppo_mini_batch_size`` is per rank in samples (already multiplied by n and divided by the dp
    size by the worker). ``dp_group``: the process group whose ranks share a mini-batch (default:
    the whole world when torch.distributed is initialised). The lr scheduler is only read for the
    ``actor/lr`` metric; the worker steps it once per ``update_policy`` call, as in veRL.
    """

    def __init__(self, config: Any, actor_module: torch.nn.Module, actor_optimizer=None, lr_scheduler=None, dp_group=None):
        self.config = config
        self.settings = ActorSettings.from_config(config)
        self.actor_module = actor_module
        self.actor_optimizer = actor_optimizer
        self.lr_scheduler = lr_scheduler
        self.dp_group = dp_group
        self.policy_loss_fn = core_algos.get_policy_loss_fn(self.settings.loss_mode)  # fails early on a bad name
        self._shuffle_generator = torch.Generator().manual_seed(self.settings.seed)

    # ----------------------------------------------------------------------------------------
    # forward
    # ----------------------------------------------------------------------------------------

    def _forward_micro_batch(self, micro_batch, temperature: float, calculate_entropy: bool = False):
        batch = micro_batch.batch
        return forward_response_log_probs(
            self.actor_module,
            batch["input_ids"],
            batch["attention_mask"],
            batch["position_ids"],
            response_length=batch["responses"].shape[-1],
            temperature=temperature,
            calculate_entropy=calculate_entropy,
            use_remove_padding=self.settings.use_remove_padding,
        )

    def compute_log_prob(self, data, calculate_entropy: bool = False) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        """(log_probs (B, R), entropys (B, R) or None) of ``data.batch['responses']``.

        meta_info: ``temperature`` (required: a wrong one silently biases every ratio),
        ``micro_batch_size`` or ``use_dynamic_bsz`` + ``max_token_len``.
        """
        temperature = _meta(data, "temperature")
        data = data.select(batch_keys=["responses", "input_ids", "attention_mask", "position_ids"])
        if data.meta_info.get("use_dynamic_bsz", False):
            # same micro-batch count on every rank: FSDP all-gathers inside each forward must pair up
            micro_batches, indices = split_by_token_budget(data, _meta(data, "max_token_len"),
                                                           dp_group=sync_group(self.dp_group))
        else:
            micro_batches, indices = split_fixed(data, _meta(data, "micro_batch_size")), None

        self.actor_module.eval()
        log_probs, entropys = [], []
        with torch.no_grad():
            for micro in micro_batches:
                log_prob, entropy = self._forward_micro_batch(micro, temperature, calculate_entropy)
                log_probs.append(log_prob)
                entropys.append(entropy)

        def merge(parts):
            return restore_order(parts, indices) if indices is not None else torch.cat(parts, dim=0)

        return merge(log_probs), (merge(entropys) if calculate_entropy else None)

    # ----------------------------------------------------------------------------------------
    # update
    # ----------------------------------------------------------------------------------------

    def _micro_batches(self, mini_batch) -> list:
        s = self.settings
        if s.use_dynamic_bsz:
            # every rank must run the same number of micro-batches (collectives inside forward/backward)
            return split_by_token_budget(mini_batch, s.ppo_max_token_len_per_gpu, dp_group=sync_group(self.dp_group))[0]
        return split_fixed(mini_batch, s.ppo_micro_batch_size_per_gpu)

    def _registered_pg_loss(self, batch, **kwargs):
        """The configured ``policy_loss.loss_mode``, with the driver's importance weights (decoupled
        rollout correction) when the batch carries them."""
        weights = batch["rollout_is_weights"] if "rollout_is_weights" in batch.keys() else None
        return self.policy_loss_fn(rollout_is_weights=weights, **kwargs)

    def _pg_loss_fn(self, correction: Optional[RolloutCorrectionSettings]):
        """Chosen once per update: bypass-mode rollout correction replaces the configured loss (its
        weights and masks need the current log-probs, so they are made here, per micro-batch)."""
        if correction is None or not correction.bypass_mode:
            return self._registered_pg_loss
        return lambda batch, **kwargs: compute_policy_loss_bypass_mode(settings=correction, **kwargs)

    def _micro_batch_loss(self, micro, temperature: float, info, local_tokens: torch.Tensor, metrics: dict,
                          pg_loss_fn=None) -> torch.Tensor:
        """This micro-batch's share of the mini-batch loss (times dp size), adding to ``metrics``."""
        s = self.settings
        batch = micro.batch
        response_mask = response_mask_of(batch)
        # veRL's global_batch_info: every agg_loss returns its share of the mini-batch loss times
        # dp_size (FSDP/DDP average gradients over ranks; we want their sum).
        agg = {**info.agg_kwargs(), "loss_scale_factor": s.loss_scale_factor}

        log_prob, entropy = self._forward_micro_batch(micro, temperature, calculate_entropy=s.entropy_coeff != 0)
        pg_loss, pg_metrics = _policy_loss_output((pg_loss_fn or self._registered_pg_loss)(
            batch,
            old_log_prob=batch["old_log_probs"],
            log_prob=log_prob,
            advantages=batch["advantages"],
            response_mask=response_mask,
            loss_agg_mode=s.loss_agg_mode,
            config=core_algos.ConfigWithBatchInfo(self.config, agg),
        ), s.loss_mode)
        policy_loss = pg_loss
        accumulate(metrics, "actor/pg_loss", pg_loss.detach())
        # ratio-type statistics: token-weighted mean over this rank's mini-batch
        weight = response_mask.sum() / local_tokens
        for key, value in pg_metrics.items():
            accumulate(metrics, key, torch.as_tensor(value, device=weight.device).detach() * weight)

        if entropy is not None:
            entropy_loss = core_algos.agg_loss(entropy, response_mask, s.loss_agg_mode, **agg)
            policy_loss = policy_loss - s.entropy_coeff * entropy_loss  # a bonus: higher entropy, lower loss
            accumulate(metrics, "actor/entropy", entropy_loss.detach())

        if s.use_kl_loss:
            kld = core_algos.kl_penalty(log_prob, batch["ref_log_prob"], s.kl_loss_type)  # (B, R)
            kl_loss = core_algos.agg_loss(kld, response_mask, s.loss_agg_mode, **agg)
            policy_loss = policy_loss + s.kl_loss_coef * kl_loss
            accumulate(metrics, "actor/kl_loss", kl_loss.detach())

        return policy_loss

    def _update_mini_batch(self, mini_batch, temperature: float, buffer: MetricBuffer, pg_loss_fn=None) -> None:
        response_mask = response_mask_of(mini_batch.batch)
        info = global_batch_info(response_mask, self.dp_group)
        local_tokens = response_mask.sum().clamp(min=1)
        metrics: dict[str, torch.Tensor] = {}

        micro_batches = self._micro_batches(mini_batch)
        self.actor_optimizer.zero_grad(set_to_none=True)
        for i, micro in enumerate(micro_batches):
            with grad_sync(self.actor_module, sync=i == len(micro_batches) - 1):
                loss = self._micro_batch_loss(micro, temperature, info, local_tokens, metrics, pg_loss_fn)
                loss.backward()
        grad_norm, skipped = clip_grad_and_step(self.actor_module, self.actor_optimizer, self.settings.grad_clip)

        buffer.add_all(metrics)
        if self.settings.use_kl_loss:
            buffer.add("actor/kl_coef", self.settings.kl_loss_coef)
        buffer.add("actor/grad_norm", grad_norm)
        buffer.add("actor/skipped_steps", skipped)

    def update_policy(self, data) -> dict[str, list[float]]:
        """PPO epochs over mini-batches, one optimizer step per mini-batch; returns veRL's metrics
        (one value per mini-batch step; ``actor/lr`` once)."""
        if self.actor_optimizer is None:
            raise RuntimeError("update_policy needs an optimizer; this actor was built for inference only")
        s = self.settings
        temperature = _meta(data, "temperature")
        # meta_info["rollout_correction"]: the driver's settings when bypass mode is on (else absent)
        pg_loss_fn = self._pg_loss_fn(data.meta_info.get("rollout_correction"))
        keys = ["responses", "input_ids", "attention_mask", "position_ids", "old_log_probs", "advantages"]
        for optional in ("response_mask", "rollout_is_weights"):
            if optional in data.batch.keys():
                keys.append(optional)
        if s.use_kl_loss:
            keys.append("ref_log_prob")
        data = data.select(batch_keys=keys)

        self.actor_module.train()
        buffer = MetricBuffer()
        for _ in range(s.ppo_epochs):
            epoch_data = data
            if s.shuffle:
                epoch_data = take_rows(data, torch.randperm(len(data), generator=self._shuffle_generator))
            for mini_batch in epoch_data.split(s.ppo_mini_batch_size):
                self._update_mini_batch(mini_batch, temperature, buffer, pg_loss_fn)
        if self.lr_scheduler is not None:
            buffer.add("actor/lr", self.lr_scheduler.get_last_lr()[0])
        return buffer.to_floats()
