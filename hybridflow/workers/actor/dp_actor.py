"""The policy's per-rank computations (veRL's ``DataParallelPPOActor``): log-probs of responses and
the PPO update, written against a plain ``torch.nn.Module`` so the same code runs whether the
module is wrapped by FSDP2 (``fully_shard``), FSDP1, DDP or nothing.

The update is normalised so that it equals the full-mini-batch gradient step whatever the
micro-batch size, token budget or data-parallel size (see ``workers/utils/micro_batches.py``).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping

import torch

from hybridflow.algorithms import ConfigWithBatchInfo, agg_loss, get_policy_loss_fn, kl_penalty
from hybridflow.algorithms.distillation import combine_with_task_loss, distillation_objective, get_distillation_loss
from hybridflow.algorithms.rollout_correction import compute_policy_loss_bypass_mode
from hybridflow.config.actor import ActorConfig, FSDPActorConfig
from hybridflow.config.convert import as_section
from hybridflow.config.rollout_correction import RolloutCorrectionConfig
from hybridflow.utils.torch_functional import masked_mean
from hybridflow.workers.actor import shared_prefix
from hybridflow.workers.engine.precision import ComputeWeights
from hybridflow.workers.utils.logprob import (
    at_temperature,
    forward_response_logits,
    forward_response_token_stats,
    token_stats,
)
from hybridflow.workers.utils.micro_batches import response_mask_of, restore_order, split_for_forward
from hybridflow.workers.utils.ulysses import SequenceParallel
from hybridflow.workers.utils.update_loop import MiniBatchContext, UpdateLoop

__all__ = ["DataParallelPPOActor", "actor_section"]

_PATH = "actor_rollout_ref.actor"


def actor_section(config: ActorConfig | Mapping) -> ActorConfig:
    """The typed actor section: an ``ActorConfig`` as it is; a DictConfig or dict (veRL users pass the
    ``actor_rollout_ref.actor`` node) read into its ``_target_`` class, ``FSDPActorConfig`` by default."""
    section = as_section(config, FSDPActorConfig, _PATH)
    if not isinstance(section, ActorConfig):
        raise TypeError(
            f"config must be an ActorConfig or the {_PATH} section as a mapping, got {type(config).__name__}"
        )
    return section


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


def _cut_shared_padding(
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor,
    response_length: int,
    cut_right: bool = True,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int, int]:
    """Drop the leading and trailing columns that are padding in every row: prompts are left-padded
    to max_prompt_length and responses right-padded to the response length, both usually wider than
    the micro-batch's longest. No row attends to those columns and the position ids are explicit, so
    the log-probs of the response tokens are the same, from a cheaper forward (the quickstart's rows:
    a 112-token prompt slot holding 90-100 tokens, a 40-token response slot holding at most ~35).
    Returns the cut tensors, the response length left and how many response columns were cut
    (``cut_right=False``: only the left padding is cut)."""
    attended = attention_mask.any(dim=0).nonzero()
    if len(attended) == 0:
        return input_ids, attention_mask, position_ids, response_length, 0
    width = input_ids.size(1)
    first = min(int(attended[0]), width - response_length)  # never into the responses
    right = min(width - 1 - int(attended[-1]), response_length - 1) if cut_right else 0  # >= 1 response column stays
    if first == 0 and right == 0:
        return input_ids, attention_mask, position_ids, response_length, 0
    end = width - right
    return (
        input_ids[:, first:end],
        attention_mask[:, first:end],
        position_ids[..., first:end],
        response_length - right,
        right,
    )


def _meta(data, key: str):
    try:
        return data.meta_info[key]
    except KeyError:
        raise KeyError(f"data.meta_info[{key!r}] is required (set by the worker/trainer)") from None


class DataParallelPPOActor:
    """Policy computations on one data-parallel rank (veRL's signature: ``DataParallelPPOActor(config,
    actor_module, actor_optimizer)``).

    ``config``: the typed ``actor_rollout_ref.actor`` section (``FSDPActorConfig``; a DictConfig or dict
    is read into one) with per-rank batch sizes, as the worker hands it (``ActorConfig.per_rank``):
    ``ppo_mini_batch_size`` in samples on this rank. ``dp_group``: the process group whose ranks share a
    mini-batch (default: the whole world when torch.distributed is initialised). ``sp``: this rank's
    Ulysses sequence-parallel group (``workers/utils/ulysses.py``; its ranks get the same data, each runs
    a slice of every packed micro-batch, token budgets grow by its size as in veRL). The lr scheduler
    is only read for the ``actor/lr`` metric; the worker steps it once per ``update_policy`` call, as in veRL.
    An actor without an optimizer only computes log-probs (the reference policy). ``precision``: the
    engine's ``ComputeWeights`` (one rank: every forward runs on half-precision copies of the weights).
    """

    def __init__(
        self,
        config: ActorConfig | Mapping,
        actor_module: torch.nn.Module,
        actor_optimizer=None,
        lr_scheduler=None,
        dp_group=None,
        sp: SequenceParallel | None = None,
        precision: ComputeWeights | None = None,
    ):
        self.config = actor_section(config)
        self.precision = precision or ComputeWeights(actor_module, None)
        # use_remove_padding follows actor_rollout_ref.model (FSDPActorConfig); engines without it pad
        self.use_remove_padding = bool(getattr(self.config, "use_remove_padding", False))
        self.sp = sp
        if sp is not None and not self.use_remove_padding:
            raise ValueError(
                f"{_PATH}.ulysses_sequence_parallel_size > 1 needs actor_rollout_ref.model.use_remove_padding=True"
            )
        self.actor_module = actor_module
        self.actor_optimizer = actor_optimizer
        self.lr_scheduler = lr_scheduler
        self.dp_group = dp_group
        self.policy_loss_fn = get_policy_loss_fn(self.config.policy_loss.loss_mode)  # fails early on a bad name
        # an SP group shares each packed micro-batch: its token budget is the sum of its ranks' (veRL)
        self.update_loop = (
            None
            if actor_optimizer is None
            else UpdateLoop(
                self.config,
                actor_module,
                actor_optimizer,
                dp_group,
                prefix="actor",
                path=_PATH,
                max_token_len=self.config.ppo_max_token_len_per_gpu * (sp.size if sp else 1),
                compute_weights=self.precision.active,
            )
        )
        self._shared_prefix = shared_prefix.usable(actor_module)  # on wherever it is exact and possible
        if self.config.use_prefix_grouper and not self._shared_prefix:
            raise ValueError(
                f"{_PATH}.use_prefix_grouper=True: this actor cannot run a group's prompt "
                "once (it needs an unwrapped transformers causal LM with a KV cache: world size 1, "
                "no gradient checkpointing)"
            )

    # ----------------------------------------------------------------------------------------
    # forward
    # ----------------------------------------------------------------------------------------

    def _forward_micro_batch(
        self, micro_batch, temperature: float, calculate_entropy: bool = False, calculate_sum_pi_squared: bool = False
    ):
        """(log_probs (B, R), entropy (B, R) or None, sum_pi_squared (B, R) or None). Padded forwards
        skip the padding columns every row shares. Where the micro-batch repeats its prompts (GRPO's n
        samples) each distinct prompt runs once (``shared_prefix.py``); the values at response padding
        are then 0, as the remove-padding path returns them."""
        batch = micro_batch.batch
        response_length = batch["responses"].shape[-1]
        input_ids, attention_mask, position_ids = batch["input_ids"], batch["attention_mask"], batch["position_ids"]
        stats = {
            "temperature": temperature,
            "calculate_entropy": calculate_entropy,
            "calculate_sum_pi_squared": calculate_sum_pi_squared,
        }
        if self.use_remove_padding:
            return forward_response_token_stats(
                self.actor_module,
                input_ids,
                attention_mask,
                position_ids,
                response_length=response_length,
                use_remove_padding=True,
                sp=self.sp,
                **stats,
            )
        if self._shared_prefix:
            cut_ids, cut_mask, cut_pos, kept, cut = _cut_shared_padding(
                input_ids, attention_mask, position_ids, response_length
            )
            groups = shared_prefix.prompt_groups(cut_ids, cut_mask, cut_ids.size(1) - kept)
            out = (
                None
                if groups is None
                else shared_prefix.response_log_probs(
                    self.actor_module, cut_ids, cut_mask, cut_pos, kept, groups=groups, **stats
                )
            )
            if out is not None:
                if not cut:
                    return out
                # back to (B, R), 0 at the cut response padding
                return tuple(None if t is None else torch.nn.functional.pad(t, (0, cut)) for t in out)
        # the ordinary padded forward: only the left padding shared by all rows is cut (the values at
        # response padding stay the model's, as without the cut)
        input_ids, attention_mask, position_ids, _, _ = _cut_shared_padding(
            input_ids, attention_mask, position_ids, response_length, cut_right=False
        )
        return forward_response_token_stats(
            self.actor_module, input_ids, attention_mask, position_ids, response_length=response_length, **stats
        )

    def compute_log_prob(self, data, calculate_entropy: bool = False, calculate_sum_pi_squared: bool = False):
        """(log_probs (B, R), entropys (B, R) or None) of ``data.batch['responses']``; with
        ``calculate_sum_pi_squared`` a third element, sum_v pi_v^2 per token (B, R), at the same temperature.

        meta_info: ``temperature`` (required: a wrong one silently biases every ratio),
        ``micro_batch_size`` or ``use_dynamic_bsz`` + ``max_token_len``.
        """
        temperature = _meta(data, "temperature")
        data = data.select(batch_keys=["responses", "input_ids", "attention_mask", "position_ids"])
        use_dynamic_bsz = data.meta_info.get("use_dynamic_bsz", False)
        micro_batches, indices = split_for_forward(
            data,
            use_dynamic_bsz,
            max_token_len=_meta(data, "max_token_len") * (self.sp.size if self.sp else 1) if use_dynamic_bsz else None,
            micro_batch_size=None if use_dynamic_bsz else _meta(data, "micro_batch_size"),
            dp_group=self.dp_group,
        )

        self.actor_module.eval()
        outputs = []  # per micro-batch (log_probs, entropy, sum_pi_squared)
        with torch.no_grad(), self.precision.active():
            for micro in micro_batches:
                outputs.append(
                    self._forward_micro_batch(micro, temperature, calculate_entropy, calculate_sum_pi_squared)
                )
        log_probs, entropys, sum_pi_squared = (
            restore_order(list(column), indices) if column[0] is not None else None for column in zip(*outputs)
        )
        return (log_probs, entropys, sum_pi_squared) if calculate_sum_pi_squared else (log_probs, entropys)

    # ----------------------------------------------------------------------------------------
    # update
    # ----------------------------------------------------------------------------------------

    def _micro_batch_loss(
        self, micro, ctx: MiniBatchContext, temperature: float, correction: RolloutCorrectionConfig | None, distill=None
    ) -> torch.Tensor:
        """This micro-batch's share of the mini-batch loss (times dp size): policy loss, minus the
        entropy bonus, plus the KL loss; its metrics go to ``ctx``. ``correction``: the driver's rollout
        correction settings in bypass mode (else None). ``distill``: the ``distillation.distillation_loss``
        section when the driver sent teacher log-probs (algorithms/distillation.py mixes the two losses)."""
        c = self.config
        batch = micro.batch
        response_mask = response_mask_of(batch)
        agg = ctx.agg_kwargs()  # veRL's global_batch_info

        mode = None if distill is None else get_distillation_loss(distill.loss_mode)
        with_entropy = c.entropy_coeff != 0 or c.calculate_entropy  # calculate_entropy: a metric only (veRL)
        if mode is not None and mode.use_topk:  # the student's log-probs of the teacher's top-k tokens too
            log_prob, entropy, student = self._forward_teacher_topk(micro, temperature, with_entropy)
        else:
            log_prob, entropy, _ = self._forward_micro_batch(micro, temperature, calculate_entropy=with_entropy)
        loss_inputs = {
            "old_log_prob": batch["old_log_probs"],
            "log_prob": log_prob,
            "advantages": batch["advantages"],
            "response_mask": response_mask,
            "loss_agg_mode": c.loss_agg_mode,
            "config": ConfigWithBatchInfo(c, agg),
        }
        if correction is not None:  # bypass mode replaces the configured loss: its weights and masks need
            output = compute_policy_loss_bypass_mode(settings=correction, **loss_inputs)  # the current log-probs
        else:  # the configured policy_loss.loss_mode, with the driver's importance weights when it sent them
            weights = batch["rollout_is_weights"] if "rollout_is_weights" in batch.keys() else None
            output = self.policy_loss_fn(rollout_is_weights=weights, **loss_inputs)
        pg_loss, pg_metrics = _policy_loss_output(output, c.policy_loss.loss_mode)
        policy_loss = pg_loss
        ctx.add("actor/pg_loss", pg_loss)
        for key, value in pg_metrics.items():  # ratio-type statistics: token-weighted over the rank's mini-batch
            ctx.add_token_weighted(key, value, response_mask)

        if entropy is not None:
            entropy_loss = agg_loss(entropy, response_mask, c.loss_agg_mode, **agg)
            if c.entropy_coeff != 0:  # a bonus: higher entropy, lower loss
                policy_loss = policy_loss - c.entropy_coeff * entropy_loss
            ctx.add("actor/entropy", entropy_loss)

        if c.use_kl_loss:
            kld = kl_penalty(log_prob, batch["ref_log_prob"], c.kl_loss_type)  # (B, R)
            kl_loss = agg_loss(kld, response_mask, c.loss_agg_mode, **agg)
            policy_loss = policy_loss + c.kl_loss_coef * kl_loss
            ctx.add("actor/kl_loss", kl_loss)

        if mode is not None:
            teacher = batch["teacher_log_probs"] if mode.use_topk else batch["teacher_log_probs"][..., 0]
            student = student if mode.use_topk else log_prob
            token_losses = mode.fn(student, teacher, distill.log_prob_min_clamp)
            weights = batch["rollout_is_weights"] if "rollout_is_weights" in batch.keys() else None
            d_loss, d_metrics = distillation_objective(
                token_losses, log_prob, batch["old_log_probs"], response_mask, distill, c.loss_agg_mode, agg, weights
            )
            policy_loss = combine_with_task_loss(policy_loss, d_loss, distill)
            ctx.add("distillation/loss", d_loss)
            # the student-teacher KL per token: forward top-k KL, or the k1 estimate of the reverse KL
            kl = token_losses if mode.use_topk else log_prob - teacher
            ctx.add_token_weighted("distillation/kl", masked_mean(kl.detach(), response_mask), response_mask)
            for key, value in d_metrics.items():
                ctx.add_token_weighted(key, value, response_mask)
        return policy_loss

    def _forward_teacher_topk(self, micro, temperature: float, calculate_entropy: bool):
        """(log_probs (B, R), entropy or None, the student's log-probs of ``teacher_ids`` (B, R, K))."""
        b = micro.batch
        width = b["responses"].shape[-1]
        logits = at_temperature(forward_response_logits(
            self.actor_module, b["input_ids"], b["attention_mask"], b["position_ids"], width,
            use_remove_padding=self.use_remove_padding, sp=self.sp,
        ), temperature)  # fmt: skip
        log_prob, entropy, _ = token_stats(logits, b["input_ids"][:, -width:], calculate_entropy)
        return log_prob, entropy, logits.float().log_softmax(-1).gather(-1, b["teacher_ids"])

    def update_policy(self, data) -> dict[str, list[float]]:
        """PPO epochs over mini-batches, one optimizer step per mini-batch (``UpdateLoop``); returns
        veRL's metrics (one value per mini-batch step; ``actor/lr`` once)."""
        if self.update_loop is None:
            raise RuntimeError("update_policy needs an optimizer; this actor was built for inference only")
        c = self.config
        temperature = _meta(data, "temperature")
        # meta_info["rollout_correction"]: the driver's settings when bypass mode is on (else absent)
        correction = data.meta_info.get("rollout_correction")
        if correction is not None and not correction.bypass_mode:
            correction = None
        keys = ["responses", "input_ids", "attention_mask", "position_ids", "old_log_probs", "advantages"]
        for optional in ("response_mask", "rollout_is_weights"):
            if optional in data.batch.keys():
                keys.append(optional)
        if c.use_kl_loss:
            keys.append("ref_log_prob")
        distill = data.meta_info.get("distillation")  # the driver's distillation_loss section, when on
        if distill is not None:
            keys += ["teacher_log_probs"] + (
                ["teacher_ids"] if get_distillation_loss(distill.loss_mode).use_topk else []
            )
        data = data.select(batch_keys=keys)

        loss = functools.partial(
            self._micro_batch_loss, temperature=temperature, correction=correction, distill=distill
        )
        buffer = self.update_loop.run(
            data, loss, step_constants={"actor/kl_coef": c.kl_loss_coef} if c.use_kl_loss else None
        )
        if self.lr_scheduler is not None:
            buffer.add("actor/lr", self.lr_scheduler.get_last_lr()[0])
        return buffer.to_floats()
