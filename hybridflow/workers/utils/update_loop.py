"""The PPO update loop shared by the actor and the critic: epochs -> mini-batches (one optimizer step
each) -> micro-batches (gradient accumulation). The actor and the critic only supply their loss.

    for epoch in range(ppo_epochs):
        for mini_batch in (shuffled) data.split(ppo_mini_batch_size):   # one optimizer step
            with compute_weights():                                   # one rank: bf16 copies of fp32 masters
                for micro in split_for_update(mini_batch):            # fixed size or token budget
                    loss(micro, ctx).backward()                       # ctx: the mini-batch's totals
            clip, step (skipped when the gradient norm is not finite)

Each micro-batch loss is normalised with the whole mini-batch's token / sequence counts over all
data-parallel ranks (``ctx.agg_kwargs()``), so the step equals the full-mini-batch gradient step
whatever the micro-batch size, token budget or data-parallel size (see ``micro_batches.py``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any

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

__all__ = ["MiniBatchContext", "UpdateLoop", "MicroBatchLoss"]


@dataclass
class MiniBatchContext:
    """What a micro-batch loss needs to know about the mini-batch it belongs to."""

    batch_info: GlobalBatchInfo  # totals over all micro-batches and data-parallel ranks
    local_tokens: torch.Tensor  # valid response tokens of this rank's mini-batch (>= 1)
    loss_scale_factor: float | None
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

    ``config``: the role's typed section with per-rank batch sizes (``ActorConfig`` / ``CriticConfig``
    after ``per_rank``); the loop reads its schedule keys (``ppo_mini_batch_size``,
    ``ppo_micro_batch_size_per_gpu``, ``use_dynamic_bsz``, ``ppo_epochs``, ``shuffle``,
    ``data_loader_seed``, ``loss_scale_factor``, ``optim.clip_grad``). ``max_token_len``: the token
    budget per micro-batch (``ppo_max_token_len_per_gpu`` times the Ulysses size). ``path`` names the
    section in errors; ``prefix`` the step metrics (``{prefix}/grad_norm``, ``{prefix}/skipped_steps``).
    The shuffle generator lives as long as the loop, so successive updates see different but
    reproducible permutations. ``compute_weights``: the block the micro-batches of a mini-batch run in
    (the engine's ``precision.active``: half-precision copies of the weights on one rank; by default none).
    """

    def __init__(
        self,
        config,
        module: torch.nn.Module,
        optimizer,
        dp_group,
        prefix: str,
        path: str,
        max_token_len: int,
        compute_weights: Callable[[], AbstractContextManager] = contextlib.nullcontext,
    ):
        if not config.use_dynamic_bsz and not config.ppo_micro_batch_size_per_gpu:
            raise ValueError(
                f"set {path}.ppo_micro_batch_size_per_gpu, or {path}.use_dynamic_bsz=True with "
                f"{path}.ppo_max_token_len_per_gpu"
            )
        self.config = config
        self.module = module
        self.optimizer = optimizer
        self.dp_group = dp_group
        self.prefix = prefix
        self.max_token_len = max_token_len
        self.compute_weights = compute_weights
        self.shuffle_generator = torch.Generator().manual_seed(config.data_loader_seed)
        self.after_mini_batch: Callable[[], None] = lambda: None  # the worker's profiler schedule steps here

    def run(self, data, loss: MicroBatchLoss, step_constants: dict | None = None) -> MetricBuffer:
        """All epochs and mini-batches of ``data``; ``step_constants`` are logged once per step."""
        c = self.config
        self.module.train()
        buffer = MetricBuffer()
        for _ in range(c.ppo_epochs):
            epoch_data = data
            if c.shuffle:
                epoch_data = take_rows(data, torch.randperm(len(data), generator=self.shuffle_generator))
            for mini_batch in epoch_data.split(c.ppo_mini_batch_size):  # one optimizer step each
                response_mask = response_mask_of(mini_batch.batch)
                ctx = MiniBatchContext(
                    batch_info=global_batch_info(response_mask, self.dp_group),
                    local_tokens=response_mask.sum().clamp(min=1),
                    loss_scale_factor=c.loss_scale_factor,
                )
                micro_batches = split_for_update(
                    mini_batch, c.use_dynamic_bsz, self.max_token_len, c.ppo_micro_batch_size_per_gpu, self.dp_group
                )
                self.optimizer.zero_grad(set_to_none=True)
                with self.compute_weights():
                    for i, micro in enumerate(micro_batches):
                        # DDP: all-reduce only after the last micro-batch's backward
                        with grad_sync(self.module, sync=i == len(micro_batches) - 1):
                            loss(micro, ctx).backward()
                grad_norm, skipped = clip_grad_and_step(self.module, self.optimizer, c.optim.clip_grad)
                buffer.add_all(ctx.metrics)
                for key, value in (step_constants or {}).items():
                    buffer.add(key, value)
                buffer.add(f"{self.prefix}/grad_norm", grad_norm)
                buffer.add(f"{self.prefix}/skipped_steps", skipped)
                self.after_mini_batch()
        return buffer
