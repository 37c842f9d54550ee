"""The value function's per-rank computations (veRL's ``DataParallelPPOCritic``), written against a
plain ``torch.nn.Module`` (FSDP2, FSDP1, DDP or unwrapped).

The critic is a token-classification model with one label: its output at position t is the value
of the state made of the tokens up to t, so the value before response token j sits at position
-R-1+j (the same positions as the policy's logits).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Optional

import torch

from hybridflow.algorithms import compute_value_loss
from hybridflow.config.access import require
from hybridflow.utils.torch_functional import masked_mean
from hybridflow.workers.utils.logprob import forward_response_logits
from hybridflow.workers.utils.micro_batches import response_mask_of, restore_order, split_for_forward
from hybridflow.workers.utils.ulysses import SequenceParallel
from hybridflow.workers.utils.update_loop import MiniBatchContext, UpdateLoop, UpdateSettings

__all__ = ["DataParallelPPOCritic", "CriticSettings"]


@dataclass(frozen=True)
class CriticSettings(UpdateSettings):
    """The critic keys this class reads, parsed once: the update schedule (``UpdateSettings``), the
    forward pass's micro-batching and the value loss's clip range."""

    forward_micro_batch_size_per_gpu: Optional[int]
    forward_max_token_len_per_gpu: int
    cliprange_value: float

    @classmethod
    def from_config(cls, config: Any) -> "CriticSettings":
        """From the ``critic`` section (per-rank sizes, ``use_remove_padding`` copied in from
        critic.model by the worker); every key is required: the defaults live in the yaml."""
        get = lambda key: require(config, key, "critic")  # noqa: E731
        return cls(
            **UpdateSettings.read(get, "critic"),
            forward_micro_batch_size_per_gpu=get("forward_micro_batch_size_per_gpu"),
            forward_max_token_len_per_gpu=int(get("forward_max_token_len_per_gpu")),
            cliprange_value=float(get("cliprange_value")),
        )


class DataParallelPPOCritic:
    """Value computations on one data-parallel rank; same update loop, normalisation and NaN-skip
    rules as ``DataParallelPPOActor`` (``workers/utils/update_loop.py``). The lr scheduler is only
    read for ``critic/lr``; the worker steps it. ``sp``: the Ulysses sequence-parallel group, as for
    the actor (token budgets grow by its size)."""

    def __init__(self, config: Any, critic_module: torch.nn.Module, critic_optimizer=None, lr_scheduler=None, dp_group=None,
                 sp: Optional[SequenceParallel] = None):
        self.config = config
        self.settings = CriticSettings.from_config(config)
        self.sp = sp
        if sp is not None:
            if not self.settings.use_remove_padding:
                raise ValueError("critic.ulysses_sequence_parallel_size > 1 needs critic.model.use_remove_padding=True")
            s = self.settings
            self.settings = dataclasses.replace(s, ppo_max_token_len_per_gpu=s.ppo_max_token_len_per_gpu * sp.size,
                                                forward_max_token_len_per_gpu=s.forward_max_token_len_per_gpu * sp.size)
        self.critic_module = critic_module
        self.critic_optimizer = critic_optimizer
        self.lr_scheduler = lr_scheduler
        self.dp_group = dp_group
        self.update_loop = UpdateLoop(self.settings, critic_module, critic_optimizer, dp_group, prefix="critic")

    def _forward_micro_batch(self, micro_batch) -> torch.Tensor:
        batch = micro_batch.batch
        values = forward_response_logits(
            self.critic_module,
            batch["input_ids"],
            batch["attention_mask"],
            batch["position_ids"],
            response_length=batch["responses"].shape[-1],
            use_remove_padding=self.settings.use_remove_padding,
            sp=self.sp,
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
        micro_batches, indices = split_for_forward(
            data,
            use_dynamic_bsz=data.meta_info.get("use_dynamic_bsz", s.use_dynamic_bsz),
            max_token_len=(data.meta_info["max_token_len"] * (self.sp.size if self.sp else 1)
                           if "max_token_len" in data.meta_info else s.forward_max_token_len_per_gpu),
            micro_batch_size=data.meta_info.get("micro_batch_size", s.forward_micro_batch_size_per_gpu),
            dp_group=self.dp_group,
        )

        self.critic_module.eval()
        with torch.no_grad():
            values = [self._forward_micro_batch(micro) for micro in micro_batches]
        return restore_order(values, indices) * response_mask_of(data.batch)

    def _micro_batch_loss(self, micro, ctx: MiniBatchContext) -> torch.Tensor:
        """This micro-batch's share of the mini-batch's clipped value loss (times dp size)."""
        s = self.settings
        batch = micro.batch
        mask = response_mask_of(batch)
        vpreds = self._forward_micro_batch(micro)  # (B, R)
        vf_loss, vf_clipfrac = compute_value_loss(
            vpreds=vpreds,
            returns=batch["returns"],
            values=batch["values"],
            response_mask=mask,
            cliprange_value=s.cliprange_value,
            loss_agg_mode=s.loss_agg_mode,
            **ctx.agg_kwargs(),
        )
        ctx.add("critic/vf_loss", vf_loss)
        ctx.add_token_weighted("critic/vf_clipfrac", vf_clipfrac, mask)
        ctx.add_token_weighted("critic/vpred_mean", masked_mean(vpreds.detach(), mask), mask)
        return vf_loss

    def update_critic(self, data) -> dict[str, list[float]]:
        """Value-loss epochs over mini-batches, one optimizer step per mini-batch (``UpdateLoop``);
        returns veRL's critic metrics (one value per step; ``critic/lr`` once)."""
        if self.critic_optimizer is None:
            raise RuntimeError("update_critic needs an optimizer; this critic was built for inference only")
        keys = ["responses", "input_ids", "attention_mask", "position_ids", "values", "returns"]
        if "response_mask" in data.batch.keys():
            keys.append("response_mask")
        data = data.select(batch_keys=keys)
        buffer = self.update_loop.run(data, self._micro_batch_loss)
        if self.lr_scheduler is not None:
            buffer.add("critic/lr", self.lr_scheduler.get_last_lr()[0])
        return buffer.to_floats()
