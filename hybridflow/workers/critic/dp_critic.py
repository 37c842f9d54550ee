"""The value function's per-rank computations (veRL's ``DataParallelPPOCritic``), written against a
plain ``torch.nn.Module`` (FSDP2, FSDP1, DDP or unwrapped).

The critic is a token-classification model with one label: its output at position t is the value
of the state made of the tokens up to t, so the value before response token j sits at position
-R-1+j (the same positions as the policy's logits).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from hybridflow.algorithms import compute_value_loss
from hybridflow.config.convert import as_section
from hybridflow.config.critic import CriticConfig, FSDPCriticConfig
from hybridflow.utils.torch_functional import masked_mean
from hybridflow.workers.engine.precision import ComputeWeights
from hybridflow.workers.utils.logprob import forward_response_logits
from hybridflow.workers.utils.micro_batches import response_mask_of, restore_order, split_for_forward
from hybridflow.workers.utils.ulysses import SequenceParallel
from hybridflow.workers.utils.update_loop import MiniBatchContext, UpdateLoop

__all__ = ["DataParallelPPOCritic", "critic_section"]


def critic_section(config: CriticConfig | Mapping) -> CriticConfig:
    """The typed critic section: a ``CriticConfig`` as it is; a DictConfig or dict read into its
    ``_target_`` class, ``FSDPCriticConfig`` by default."""
    section = as_section(config, FSDPCriticConfig, "critic")
    if not isinstance(section, CriticConfig):
        raise TypeError(
            f"config must be a CriticConfig or the critic section as a mapping, got {type(config).__name__}"
        )
    return section


class DataParallelPPOCritic:
    """Value computations on one data-parallel rank (veRL's signature: ``DataParallelPPOCritic(config,
    critic_module, critic_optimizer)``); same update loop, normalisation and NaN-skip rules as
    ``DataParallelPPOActor`` (``workers/utils/update_loop.py``).

    ``config``: the typed ``critic`` section (``FSDPCriticConfig``; a DictConfig or dict is read into
    one) with per-rank batch sizes (``CriticConfig.per_rank``). The lr scheduler is only read for
    ``critic/lr``; the worker steps it. ``sp``: the Ulysses sequence-parallel group, as for the actor
    (token budgets grow by its size). ``precision``: the engine's ``ComputeWeights``, as for the actor."""

    def __init__(
        self,
        config: CriticConfig | Mapping,
        critic_module: torch.nn.Module,
        critic_optimizer=None,
        lr_scheduler=None,
        dp_group=None,
        sp: SequenceParallel | None = None,
        precision: ComputeWeights | None = None,
    ):
        self.config = critic_section(config)
        self.precision = precision or ComputeWeights(critic_module, None)
        c = self.config
        self.use_remove_padding = bool(c.model.use_remove_padding)
        self.sp = sp
        if sp is not None and not self.use_remove_padding:
            raise ValueError("critic.ulysses_sequence_parallel_size > 1 needs critic.model.use_remove_padding=True")
        sp_size = sp.size if sp else 1
        # the value pass's defaults (the base CriticConfig has no forward_micro_batch_size_per_gpu)
        self.forward_micro_batch_size = c.get("forward_micro_batch_size_per_gpu") or c.ppo_micro_batch_size_per_gpu
        self.forward_max_token_len = c.forward_max_token_len_per_gpu * sp_size
        self.critic_module = critic_module
        self.critic_optimizer = critic_optimizer
        self.lr_scheduler = lr_scheduler
        self.dp_group = dp_group
        self.update_loop = (
            None
            if critic_optimizer is None
            else UpdateLoop(
                c,
                critic_module,
                critic_optimizer,
                dp_group,
                prefix="critic",
                path="critic",
                max_token_len=c.ppo_max_token_len_per_gpu * sp_size,
                compute_weights=self.precision.active,
            )
        )

    def _forward_micro_batch(self, micro_batch) -> torch.Tensor:
        batch = micro_batch.batch
        values = forward_response_logits(
            self.critic_module,
            batch["input_ids"],
            batch["attention_mask"],
            batch["position_ids"],
            response_length=batch["responses"].shape[-1],
            use_remove_padding=self.use_remove_padding,
            sp=self.sp,
        )  # (B, R, 1)
        return values.squeeze(-1).float()  # (B, R)

    def compute_values(self, data) -> torch.Tensor:
        """Values (B, R) of the states before each response token, 0 outside the response mask.

        meta_info may override ``micro_batch_size``, ``use_dynamic_bsz`` and ``max_token_len``
        (defaults: the forward_* keys of the critic section)."""
        keys = ["responses", "input_ids", "attention_mask", "position_ids"]
        if "response_mask" in data.batch.keys():
            keys.append("response_mask")
        data = data.select(batch_keys=keys)
        micro_batches, indices = split_for_forward(
            data,
            use_dynamic_bsz=data.meta_info.get("use_dynamic_bsz", self.config.use_dynamic_bsz),
            max_token_len=(
                data.meta_info["max_token_len"] * (self.sp.size if self.sp else 1)
                if "max_token_len" in data.meta_info
                else self.forward_max_token_len
            ),
            micro_batch_size=data.meta_info.get("micro_batch_size", self.forward_micro_batch_size),
            dp_group=self.dp_group,
        )

        self.critic_module.eval()
        with torch.no_grad(), self.precision.active():
            values = [self._forward_micro_batch(micro) for micro in micro_batches]
        return restore_order(values, indices) * response_mask_of(data.batch)

    def _micro_batch_loss(self, micro, ctx: MiniBatchContext) -> torch.Tensor:
        """This micro-batch's share of the mini-batch's clipped value loss (times dp size)."""
        batch = micro.batch
        mask = response_mask_of(batch)
        vpreds = self._forward_micro_batch(micro)  # (B, R)
        vf_loss, vf_clipfrac = compute_value_loss(
            vpreds=vpreds,
            returns=batch["returns"],
            values=batch["values"],
            response_mask=mask,
            cliprange_value=self.config.cliprange_value,
            loss_agg_mode=self.config.loss_agg_mode,
            **ctx.agg_kwargs(),
        )
        ctx.add("critic/vf_loss", vf_loss)
        ctx.add_token_weighted("critic/vf_clipfrac", vf_clipfrac, mask)
        ctx.add_token_weighted("critic/vpred_mean", masked_mean(vpreds.detach(), mask), mask)
        return vf_loss

    def update_critic(self, data) -> dict[str, list[float]]:
        """Value-loss epochs over mini-batches, one optimizer step per mini-batch (``UpdateLoop``);
        returns veRL's critic metrics (one value per step; ``critic/lr`` once)."""
        if self.update_loop is None:
            raise RuntimeError("update_critic needs an optimizer; this critic was built for inference only")
        keys = ["responses", "input_ids", "attention_mask", "position_ids", "values", "returns"]
        if "response_mask" in data.batch.keys():
            keys.append("response_mask")
        data = data.select(batch_keys=keys)
        buffer = self.update_loop.run(data, self._micro_batch_loss)
        if self.lr_scheduler is not None:
            buffer.add("critic/lr", self.lr_scheduler.get_last_lr()[0])
        return buffer.to_floats()
