"""The PPO update loop shared by the actor and the critic: epochs -> mini-batches (one optimizer step
each) -> micro-batches (gradient accumulation). The actor and the critic only supply their loss.

    for epoch in range(ppo_epochs):
        for mini_batch in (shuffled) data.split(ppo_mini_batch_size):   # one optimizer step
            for micro in split_for_update(mini_batch):                # fixed size or token budget
                loss(micro, ctx).backward()                           # ctx: the mini-batch's totals
            clip, step (skipped when the gradient norm is not finite)

Each micro-batch loss is normalised with the whole mini-batch's token / sequence counts over all
data-parallel ranks (``ctx.agg_kwargs()``), so the step equals the full-mini-batch gradient step
whatever the micro-batch size, token budget or data-parallel size (see ``micro_batches.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import torch

from hybridflow.workers.utils.micro_batches import (
    GlobalBatchInfo,
    MetricBuffer,
    accumulate,
    clip_grad_and_step,
    global_batch_info,
    grad_sync,
    response_mask_of,
    split_for_update,
    take_rows,
)

__all__ = ["UpdateSettings", "MiniBatchContext", "UpdateLoop", "MicroBatchLoss"]


@dataclass(frozen=True)
class UpdateSettings:
    """The keys that say how a batch becomes optimizer steps (the same for actor and critic)."""

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
    use_remove_padding: bool

    @staticmethod
    def read(get: Callable[[str], Any], role: str) -> dict:
        """The shared fields from a section (``get(key)`` raises on a missing key), checked; ``role``
        ("actor" or "critic") names the section in errors."""
        mini = get("ppo_mini_batch_size")
        if mini is None or int(mini) < 1:
            raise ValueError(f"{role}.ppo_mini_batch_size must be a positive per-rank sample count, got {mini!r}")
        fields = dict(
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
            use_remove_padding=bool(get("use_remove_padding")),
        )
        if not fields["use_dynamic_bsz"] and fields["ppo_micro_batch_size_per_gpu"] is None:
            raise ValueError(f"set {role}.ppo_micro_batch_size_per_gpu, or use_dynamic_bsz=True with "
                             f"ppo_max_token_len_per_gpu")
        return fields


@dataclass
class MiniBatchContext:
    """What a micro-batch loss needs to know about the mini-batch it belongs to."""

    batch_info: GlobalBatchInfo  # totals over all micro-batches and data-parallel ranks
    local_tokens: torch.Tensor  # valid response tokens of this rank's mini-batch (>= 1)
    loss_scale_factor: Optional[float]
    metrics: dict = field(default_factory=dict)  # summed over the micro-batches of the step

    def agg_kwargs(self) -> dict:
        """Keyword arguments for ``agg_loss`` / ``compute_value_loss``: the micro-batch's loss comes
        out as its share of the mini-batch loss times dp size (FSDP/DDP average over ranks)."""
        return {**self.batch_info.agg_kwargs(), "loss_scale_factor": self.loss_scale_factor}

    def add(self, key: str, value: torch.Tensor) -> None:
        """Sum ``value`` into the step's metric ``key`` (per-micro-batch shares of a loss)."""
        accumulate(self.metrics, key, value.detach())

    def add_token_weighted(self, key: str, value, response_mask: torch.Tensor) -> None:
        """Add a per-micro-batch statistic weighted by its share of the rank's valid tokens, so that
        the step's value is the token-weighted mean over this rank's mini-batch."""
        weight = response_mask.sum() / self.local_tokens
        accumulate(self.metrics, key, torch.as_tensor(value, device=weight.device).detach() * weight)


MicroBatchLoss = Callable[[Any, MiniBatchContext], torch.Tensor]  # (micro-batch DataProto, ctx) -> loss


class UpdateLoop:
    """Runs ``ppo_epochs`` over a rank's batch for one module and its optimizer.

    The shuffle generator lives as long as the loop (seeded with ``data_loader_seed``), so successive
    updates see different but reproducible permutations. ``prefix`` names the step metrics
    (``{prefix}/grad_norm``, ``{prefix}/skipped_steps``).
    """

    def __init__(self, settings: UpdateSettings, module: torch.nn.Module, optimizer, dp_group, prefix: str):
        self.settings = settings
        self.module = module
        self.optimizer = optimizer
        self.dp_group = dp_group
        self.prefix = prefix
        self.shuffle_generator = torch.Generator().manual_seed(settings.seed)

    def run(self, data, loss: MicroBatchLoss, step_constants: Optional[dict] = None) -> MetricBuffer:
        """All epochs and mini-batches of ``data``; ``step_constants`` are logged once per step."""
        s = self.settings
        self.module.train()
        buffer = MetricBuffer()
        for _ in range(s.ppo_epochs):
            epoch_data = data
            if s.shuffle:
                epoch_data = take_rows(data, torch.randperm(len(data), generator=self.shuffle_generator))
            for mini_batch in epoch_data.split(s.ppo_mini_batch_size):
                self.step(mini_batch, loss, buffer, step_constants or {})
        return buffer

    def step(self, mini_batch, loss: MicroBatchLoss, buffer: MetricBuffer, step_constants: dict) -> None:
        """One optimizer step from one mini-batch, accumulated over its micro-batches."""
        response_mask = response_mask_of(mini_batch.batch)
        ctx = MiniBatchContext(
            batch_info=global_batch_info(response_mask, self.dp_group),
            local_tokens=response_mask.sum().clamp(min=1),
            loss_scale_factor=self.settings.loss_scale_factor,
        )
        micro_batches = split_for_update(mini_batch, self.settings, self.dp_group)
        self.optimizer.zero_grad(set_to_none=True)
        for i, micro in enumerate(micro_batches):
            # DDP: all-reduce only after the last micro-batch's backward
            with grad_sync(self.module, sync=i == len(micro_batches) - 1):
                loss(micro, ctx).backward()
        grad_norm, skipped = clip_grad_and_step(self.module, self.optimizer, self.settings.grad_clip)

        buffer.add_all(ctx.metrics)
        for key, value in step_constants.items():
            buffer.add(key, value)
        buffer.add(f"{self.prefix}/grad_norm", grad_norm)
        buffer.add(f"{self.prefix}/skipped_steps", skipped)
