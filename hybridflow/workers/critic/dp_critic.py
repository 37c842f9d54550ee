"""The value function's per-rank computations (veRL's ``DataParallelPPOCritic``), written against a
plain ``torch.nn.Module`` (FSDP2, FSDP1, DDP or unwrapped).

The critic is a token-classification model with one label: its output at position t is the value
of the state made of the tokens up to t, so the value before response token j sits at position
-R-1+j (the same positions as the policy's logits).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch

from hybridflow.trainer.ppo import core_algos
from hybridflow.utils.config_section import require
from hybridflow.workers.utils.logprob import forward_response_logits
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

__all__ = ["DataParallelPPOCritic", "CriticSettings"]


@dataclass(frozen=True)
class CriticSettings:
    """The critic keys this class reads, parsed once."""

    ppo_mini_batch_size: int
    ppo_micro_batch_size_per_gpu: Optional[int]
    forward_micro_batch_size_per_gpu: Optional[int]
    use_dynamic_bsz: bool
    ppo_max_token_len_per_gpu: int
    forward_max_token_len_per_gpu: int
    ppo_epochs: int
    shuffle: bool
    seed: int
    grad_clip: Optional[float]
    cliprange_value: float
    loss_agg_mode: str
    loss_scale_factor: Optional[float]
    use_remove_padding: bool  # critic.model.use_remove_padding, copied in by the worker

    @classmethod
    def from_config(cls, config: Any) -> "CriticSettings":
        """From the ``critic`` section (per-rank sizes, ``use_remove_padding`` copied in from
        critic.model by the worker); every key is required: the defaults live in the yaml."""
        get = lambda key: require(config, key, "critic")  # noqa: E731
        mini = get("ppo_mini_batch_size")
        if mini is None or int(mini) < 1:
            raise ValueError(f"critic.ppo_mini_batch_size must be a positive per-rank sample count, got {mini!r}")
        settings = cls(
            ppo_mini_batch_size=int(mini),
            ppo_micro_batch_size_per_gpu=get("ppo_micro_batch_size_per_gpu"),
            forward_micro_batch_size_per_gpu=get("forward_micro_batch_size_per_gpu"),
            use_dynamic_bsz=bool(get("use_dynamic_bsz")),
            ppo_max_token_len_per_gpu=int(get("ppo_max_token_len_per_gpu")),
            forward_max_token_len_per_gpu=int(get("forward_max_token_len_per_gpu")),
            ppo_epochs=int(get("ppo_epochs")),
            shuffle=bool(get("shuffle")),
            seed=int(get("data_loader_seed")),
            grad_clip=get("grad_clip"),  # null or 0: no clipping
            cliprange_value=float(get("cliprange_value")),
            loss_agg_mode=str(get("loss_agg_mode")),
            loss_scale_factor=get("loss_scale_factor"),
            use_remove_padding=bool(get("use_remove_padding")),
        )
        if not settings.use_dynamic_bsz and settings.ppo_micro_batch_size_per_gpu is None:
            raise ValueError("set critic.ppo_micro_batch_size_per_gpu, or use_dynamic_bsz=True with ppo_max_token_len_per_gpu")
        return settings


class DataParallelPPOCritic:
    """Value computations on one data-parallel rank; same normalisation and NaN-skip rules as
    ``DataParallelPPOActor`` (see ``workers/utils/micro_batches.py``). The lr scheduler is only read
    for ``critic/lr``; the worker steps it."""

    def __init__(self, config: Any, critic_module: torch.nn.Module, critic_optimizer=None, lr_scheduler=None, dp_group=None):
        self.config = config
        self.settings = CriticSettings.from_config(config)
        self.critic_module = critic_module
        self.critic_optimizer = critic_optimizer
        self.lr_scheduler = lr_scheduler
        self.dp_group = dp_group
        self._shuffle_generator = torch.Generator().manual_seed(self.settings.seed)

    def _forward_micro_batch(self, micro_batch) -> torch.Tensor:
        batch = micro_batch.batch
        values = forward_response_logits(
            self.critic_module,
            batch["input_ids"],
            batch["attention_mask"],
            batch["position_ids"],
            response_length=batch["responses"].shape[-1],
            use_remove_padding=self.settings.use_remove_padding,
        )  # (B, R, 1)
        return values.squeeze(-1).float()  # (B, R)

    def compute_values(self, data) -> torch.Tensor:
        """Values (B, R) of the states before each response token, 0 outside the response mask.

        meta_info may override ``micro_batch_size``, ``use_dynamic_bsz`` and ``max_token_len``
        (defaults: the forward_* keys of the critic section)."""
        s = self.settings
        keys = ["responses", "input_ids", "attention_mask", "position_ids"]
        if "response_mask" in data.batch.keys():
            keys.append("response_mask")
        data = data.select(batch_keys=keys)
        if data.meta_info.get("use_dynamic_bsz", s.use_dynamic_bsz):
            max_token_len = data.meta_info.get("max_token_len", s.forward_max_token_len_per_gpu)
            # same micro-batch count on every rank: FSDP all-gathers inside each forward must pair up
            micro_batches, indices = split_by_token_budget(data, max_token_len, dp_group=sync_group(self.dp_group))
        else:
            micro_size = data.meta_info.get("micro_batch_size", s.forward_micro_batch_size_per_gpu)
            micro_batches, indices = split_fixed(data, micro_size), None

        self.critic_module.eval()
        with torch.no_grad():
            values = [self._forward_micro_batch(micro) for micro in micro_batches]
        values = restore_order(values, indices) if indices is not None else torch.cat(values, dim=0)
        return values * response_mask_of(data.batch)

    def _update_mini_batch(self, mini_batch, buffer: MetricBuffer) -> None:
        s = self.settings
        response_mask = response_mask_of(mini_batch.batch)
        info = global_batch_info(response_mask, self.dp_group)
        local_tokens = response_mask.sum().clamp(min=1)
        if s.use_dynamic_bsz:
            micro_batches = split_by_token_budget(mini_batch, s.ppo_max_token_len_per_gpu, dp_group=sync_group(self.dp_group))[0]
        else:
            micro_batches = split_fixed(mini_batch, s.ppo_micro_batch_size_per_gpu)

        metrics: dict[str, torch.Tensor] = {}
        self.critic_optimizer.zero_grad(set_to_none=True)
        for i, micro in enumerate(micro_batches):
            batch = micro.batch
            mask = response_mask_of(batch)
            with grad_sync(self.critic_module, sync=i == len(micro_batches) - 1):
                vpreds = self._forward_micro_batch(micro)  # (B, R)
                vf_loss, vf_clipfrac = core_algos.compute_value_loss(
                    vpreds=vpreds,
                    returns=batch["returns"],
                    values=batch["values"],
                    response_mask=mask,
                    cliprange_value=s.cliprange_value,
                    loss_agg_mode=s.loss_agg_mode,
                    # the micro-batch's share of the mini-batch loss, x dp size (FSDP/DDP average)
                    **info.agg_kwargs(),
                    loss_scale_factor=s.loss_scale_factor,
                )
                vf_loss.backward()
            accumulate(metrics, "critic/vf_loss", vf_loss.detach())
            weight = mask.sum() / local_tokens  # token-weighted statistics over this rank's mini-batch
            accumulate(metrics, "critic/vf_clipfrac", vf_clipfrac * weight)
            accumulate(metrics, "critic/vpred_mean", core_algos.masked_mean(vpreds.detach(), mask) * weight)
        grad_norm, skipped = clip_grad_and_step(self.critic_module, self.critic_optimizer, s.grad_clip)

        buffer.add_all(metrics)
        buffer.add("critic/grad_norm", grad_norm)
        buffer.add("critic/skipped_steps", skipped)

    def update_critic(self, data) -> dict[str, list[float]]:
        """Value-loss epochs over mini-batches, one optimizer step per mini-batch; returns veRL's
        critic metrics (one value per step; ``critic/lr`` once)."""
        if self.critic_optimizer is None:
            raise RuntimeError("update_critic needs an optimizer; this critic was built for inference only")
        s = self.settings
        keys = ["responses", "input_ids", "attention_mask", "position_ids", "values", "returns"]
        if "response_mask" in data.batch.keys():
            keys.append("response_mask")
        data = data.select(batch_keys=keys)

        self.critic_module.train()
        buffer = MetricBuffer()
        for _ in range(s.ppo_epochs):
            epoch_data = data
            if s.shuffle:
                epoch_data = take_rows(data, torch.randperm(len(data), generator=self._shuffle_generator))
            for mini_batch in epoch_data.split(s.ppo_mini_batch_size):
                self._update_mini_batch(mini_batch, buffer)
        if self.lr_scheduler is not None:
            buffer.add("critic/lr", self.lr_scheduler.get_last_lr()[0])
        return buffer.to_floats()
