"""The policy's training sections: ``actor_rollout_ref.actor`` (veRL's ActorConfig / FSDPActorConfig) and
``actor_rollout_ref.ref`` (RefConfig: the reference policy's forward-only engine).

Batch sizes count prompts before the rollout.n repeat (``ppo_mini_batch_size``) or samples on one rank
(``*_micro_batch_size_per_gpu``); ``validate`` checks them against the run's device count and batch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hybridflow.config import rules
from hybridflow.config.base import BaseConfig, built_alone, doc, placed, section
from hybridflow.config.checkpoint import CheckpointConfig
from hybridflow.config.engine import FSDPEngineConfig, QATConfig, engine_as_in_yaml
from hybridflow.config.errors import ConfigError, check_one_of
from hybridflow.config.optimizer import FSDPOptimizerConfig, OptimizerConfig
from hybridflow.config.profiler import TOKEN_RANGE_KEYS, TOOL_NAME_KEYS, ProfilerConfig
from hybridflow.config.reasons import SP, VLM, speed_only
from hybridflow.config.refused import MEGATRON
from hybridflow.config.rollout_correction import RolloutCorrectionConfig

__all__ = [
    "STRATEGIES",
    "STRATEGY_STATUS",
    "TRAINING_PROFILER_ABSENT",
    "LOSS_AGG_MODES",
    "MicroBatchUnsetError",
    "PolicyLossConfig",
    "RouterReplayConfig",
    "ActorConfig",
    "FSDPActorConfig",
    "RefConfig",
]

_ACTOR_SPEED = speed_only("fused kernels, torch.compile, chunked entropy, padding buckets")
_CLIP_COV = "read by policy_loss.loss_mode=clip_cov"
_KL_COV = "read by policy_loss.loss_mode=kl_cov"
_DRO = "read by policy_loss.loss_mode=dro (required there)"
_SAPO = "read by policy_loss.loss_mode=sapo"
_NO_ROUTER_REPLAY = "MoE router replay is not implemented"
_REF_SPEED = speed_only("torch.compile, chunked entropy, padding buckets")

STRATEGIES = ("fsdp", "fsdp2", "ddp")
STRATEGY_STATUS = dict(values=STRATEGIES, reason="hybridflow's training engines")
_NO_GRAD_CLIP = ("grad_clip",)  # optim.grad_clip: veRL's dataclass takes it, its yaml does not hold it
TRAINING_PROFILER_ABSENT = (*TOKEN_RANGE_KEYS, *TOOL_NAME_KEYS)
_MODEL = "actor_rollout_ref.model"


def _actor(key: str) -> str:
    return f"${{actor_rollout_ref.actor.{key}}}"


ROUTER_REPLAY_MODES = ("disabled", "R2", "R3")


def check_strategy(value: str, key: str) -> None:
    if value == "megatron":
        raise ConfigError(f"{key}='megatron' is not supported by hybridflow: {MEGATRON}")
    if value not in STRATEGIES:
        raise ConfigError(f"{key}={value!r} is not one of {', '.join(STRATEGIES)} (hybridflow's training engines)")


def check_micro_batch(
    mbs: int | None,
    mbs_per_gpu: int | None,
    dynamic: bool,
    path: str,
    key: str = "ppo_micro_batch_size",
    verl_word: str | None = None,
) -> None:
    """veRL's rule: the deprecated global micro-batch size and the per-GPU one are not both set (veRL's
    message, which its users match on, then the full keys). ``verl_word``: the key as veRL's message
    spells it, where it differs (the critic's says micro_batch_size)."""
    if not dynamic and mbs is not None and mbs_per_gpu is not None:
        role, word = path.rsplit(".", 1)[-1], verl_word or key
        raise ConfigError(
            f"[{role}] You have set both '{role}.{word}' AND '{role}.{word}_per_gpu'. Please remove "
            f"'{role}.{word}' because only '*_{word}_per_gpu' is supported (the former is deprecated). "
            f"({path}.{key}={mbs}, {path}.{key}_per_gpu={mbs_per_gpu})"
        )


class MicroBatchUnsetError(ConfigError, AssertionError):
    """No micro-batch size and no token budget: veRL asserts this when the actor's config is built, so
    callers catching AssertionError (veRL) or ValueError (hybridflow's ConfigError) both see it."""


# veRL 0.9.1's loss aggregation modes; hybridflow.algorithms.loss_agg adds the names users register
LOSS_AGG_MODES = {"token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"}


def check_loss_agg_mode(mode: str) -> None:
    if mode not in LOSS_AGG_MODES:
        raise ConfigError(f"Invalid loss_agg_mode: {mode}")


def model_flag(model_config: Any, key: str, default: Any) -> Any:
    """A key of the model section handed to ``validate`` (a mapping, a config object or None)."""
    if model_config is None:
        return default
    return model_config.get(key, default) if hasattr(model_config, "get") else getattr(model_config, key, default)


def _engine_follows(role: str) -> dict:
    """The engine keys that follow the role's own (veRL's dp_actor.yaml / dp_ref.yaml)."""
    keys = ("entropy_from_logits_with_chunking", "entropy_from_logits_chunk_size", "entropy_checkpointing")
    return {k: f"${{actor_rollout_ref.{role}.{k}}}" for k in (*keys, "pad_to_length")}


@dataclass
class PolicyLossConfig(BaseConfig):
    """``actor.policy_loss``: which policy loss, and the knobs of the covariance-based ones."""

    _target_: str = doc("verl.workers.config.PolicyLossConfig", "the class this section is read into")
    loss_mode: str = doc("vanilla", "name in the policy-loss registry: vanilla, gspo, gpg, clip_cov, kl_cov, ...")
    clip_cov_ratio: float = doc(0.0002, "clip_cov: share of the valid tokens dropped", reason=_CLIP_COV)
    clip_cov_lb: float = doc(1.0, "clip_cov: lower covariance bound of the droppable tokens", reason=_CLIP_COV)
    clip_cov_ub: float = doc(5.0, "clip_cov: upper covariance bound of the droppable tokens", reason=_CLIP_COV)
    kl_cov_ratio: float = doc(0.0002, "kl_cov: share of the valid tokens given the KL penalty", reason=_KL_COV)
    ppo_kl_coef: float = doc(0.1, "kl_cov: coefficient of |log ratio| on those tokens", reason=_KL_COV)
    dro_beta: float | None = doc(None, "dro: weight of the quadratic log-ratio penalty (> 0)", reason=_DRO)
    rollout_correction: RolloutCorrectionConfig = section(
        RolloutCorrectionConfig,
        "veRL's trainer copies algorithm.rollout_correction here (not in its yaml)",
        note="hybridflow's policy loss reads algorithm.rollout_correction; this copy is not read",
    )

    def validate(self) -> list[str]:
        """The knobs the selected loss reads: missing or contradictory ones fail at start-up, not after the
        first rollout. Raises ConfigError listing every problem."""
        p, key, mode = rules.Problems(), "actor_rollout_ref.actor.policy_loss", self.loss_mode
        if mode == "dro" and not _positive_number(self.dro_beta):
            p.errors.append(
                f"{key}.loss_mode=dro needs {key}.dro_beta > 0 (the weight of its quadratic log-ratio penalty), "
                f"got {self.dro_beta!r}"
            )
        for name, ratio in (("clip_cov", "clip_cov_ratio"), ("kl_cov", "kl_cov_ratio")):
            value = getattr(self, ratio)
            if mode == name and value is not None and not _positive_number(value):
                p.errors.append(f"{key}.{ratio} must be > 0 for loss_mode={name}, got {value!r}")
        lb, ub = self.clip_cov_lb, self.clip_cov_ub
        if mode == "clip_cov" and lb is not None and ub is not None and not lb < ub:
            p.errors.append(f"{key}.clip_cov_lb ({lb}) must be below clip_cov_ub ({ub}): no token could be dropped")
        return p.raise_errors()


def _positive_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0


@dataclass
class RouterReplayConfig(BaseConfig):
    """``router_replay``: MoE routing record/replay (not implemented by hybridflow)."""

    _target_: str = doc("verl.workers.config.RouterReplayConfig", "the class this section is read into")
    mode: str = doc("disabled", "disabled | R2 | R3")
    record_file: str | None = doc(None, "where recorded routes go")
    replay_file: str | None = doc(None, "routes to replay")

    def __post_init__(self):
        check_one_of("router_replay.mode", self.mode, ROUTER_REPLAY_MODES)


@dataclass
class ActorConfig(BaseConfig):
    """The actor keys of every training engine (veRL's actor.yaml)."""

    # the worker normalises batch sizes per rank when it builds the role (veRL's mutable fields)
    _mutable_fields = {"ppo_mini_batch_size", "ppo_micro_batch_size", "ppo_micro_batch_size_per_gpu"}

    _target_: str = doc("verl.workers.config.ActorConfig", "the class this section is read into")
    rollout_n: int = doc(1, "samples per prompt", follows="${actor_rollout_ref.rollout.n}")
    strategy: str = doc("fsdp", "training engine: fsdp | fsdp2 | ddp", **STRATEGY_STATUS)
    ppo_mini_batch_size: int = doc(256, "prompts per optimizer step (x rollout.n samples, split over ranks)")
    ppo_micro_batch_size: int | None = doc(None, "deprecated global micro-batch; use ppo_micro_batch_size_per_gpu")
    ppo_micro_batch_size_per_gpu: int | None = doc(None, "samples per forward/backward on one rank")
    use_dynamic_bsz: bool = doc(False, "pack micro-batches by token count instead of sample count")
    ppo_max_token_len_per_gpu: int = doc(16384, "token budget per rank and micro-batch when use_dynamic_bsz")
    clip_ratio: float = doc(0.2, "PPO clip range, used for both sides when clip_ratio_low/high are unset")
    clip_ratio_low: float = doc(0.2, "lower PPO clip range")
    clip_ratio_high: float = doc(0.2, "upper PPO clip range")
    tau_pos: float = doc(1.0, "sapo: gate temperature where the advantage is > 0", reason=_SAPO)
    tau_neg: float = doc(1.05, "sapo: gate temperature where the advantage is <= 0", reason=_SAPO)
    freeze_vision_tower: bool = doc(False, "freeze a vision tower (vision models are not supported)", refused=VLM)
    policy_loss: PolicyLossConfig = section(PolicyLossConfig, "the policy loss", absent=("rollout_correction",))
    clip_ratio_c: float = doc(3.0, "dual-clip PPO: lower bound for negative advantages")
    loss_agg_mode: str = doc("token-mean", "token-mean | seq-mean-token-sum | seq-mean-token-mean | ...")
    loss_scale_factor: float | None = doc(None, "seq-mean-token-sum-norm: constant divisor (null: response length)")
    entropy_coeff: float = doc(0.0, "entropy bonus coefficient")
    calculate_entropy: bool = doc(
        False, "the update's entropy as a metric (actor/entropy) when entropy_coeff is 0 (no gradient through it then)"
    )
    calculate_sum_pi_squared: bool = doc(
        False, "old log-prob pass also returns sum_v pi_v^2 per token", reason="optimal_token_baseline needs it"
    )
    sum_pi_squared_checkpointing: bool = doc(
        False,
        "recompute sum_pi_squared in backward",
        note=speed_only("recomputing sum_pi_squared in the backward pass"),
    )
    use_kl_loss: bool = doc(False, "KL to the reference policy as a loss term (GRPO style)")
    use_prefix_grouper: bool = doc(
        False,
        "one forward of the shared prompt for its samples (no remove-padding, no checkpointing)",
        reason="true requires the shared-prompt forward (each group's prompt once; padded forwards of an unwrapped "
        "model) and fails naming what prevents it; false leaves it on where it applies",
    )
    use_torch_compile: bool = doc(True, "torch.compile the hot functions", note=_ACTOR_SPEED)
    kl_loss_coef: float = doc(0.001, "coefficient of the KL loss")
    kl_loss_type: str = doc("low_var_kl", "KL estimator of the loss: kl | abs | mse | low_var_kl | full")
    ppo_epochs: int = doc(1, "passes over the batch per step")
    shuffle: bool = doc(False, "shuffle the batch before splitting it into mini-batches")
    data_loader_seed: int = doc(42, "seed of that shuffle")
    checkpoint: CheckpointConfig = section(CheckpointConfig, "what a checkpoint holds", absent=("save_lora_only",))
    optim: OptimizerConfig = section(placed(OptimizerConfig, lr=1e-6), "the optimizer", absent=_NO_GRAD_CLIP)
    use_fused_kernels: bool = doc(False, "fused kernels", follows=f"${{{_MODEL}.use_fused_kernels}}", note=_ACTOR_SPEED)
    profiler: ProfilerConfig = section(ProfilerConfig, "the actor's profiling", absent=TRAINING_PROFILER_ABSENT)
    qat: QATConfig = section(QATConfig, "quantization-aware training", refused="QAT is not implemented")

    _path = "actor_rollout_ref.actor"  # where the section sits: messages name full keys
    _model_path = "actor_rollout_ref.model"

    def __post_init__(self):
        """veRL's construction checks: strategy, the micro-batch rules, loss_agg_mode. A section built
        alone needs a micro-batch size or dynamic batching, as veRL's; one built as part of a tree leaves
        that to ``validate`` (see ``hybridflow.config.base.part_of_tree``)."""
        check_strategy(self.strategy, "actor.strategy")
        check_micro_batch(
            self.ppo_micro_batch_size, self.ppo_micro_batch_size_per_gpu, self.use_dynamic_bsz, self._path
        )
        no_micro_batch = self.ppo_micro_batch_size is None and self.ppo_micro_batch_size_per_gpu is None
        if built_alone() and not self.use_dynamic_bsz and no_micro_batch:
            raise MicroBatchUnsetError(
                "[actor] Please set at least one of 'actor.ppo_micro_batch_size' or "
                "'actor.ppo_micro_batch_size_per_gpu' if use_dynamic_bsz is not enabled."
            )
        check_loss_agg_mode(self.loss_agg_mode)
        for key in ("ppo_mini_batch_size", "ppo_epochs", "ppo_max_token_len_per_gpu"):
            if getattr(self, key) < 1:
                raise ConfigError(f"{self._path}.{key} must be >= 1, got {getattr(self, key)}")

    @property
    def sp_size(self) -> int:
        """The Ulysses sequence-parallel size the role runs with (1 on engines without it)."""
        return 1

    def per_rank(self, dp_size: int, rollout_n: int | None = None) -> ActorConfig:
        """A copy with veRL's per-rank batch sizes (``rules.per_rank_update``; ``rollout_n`` default the
        section's)."""
        return rules.per_rank_update(self, dp_size, self.rollout_n if rollout_n is None else rollout_n)

    def validate(
        self,
        n_gpus: int,
        train_batch_size: int | None,
        model_config: Any | None = None,
        *,
        max_sequence_length: int | None = None,
    ) -> list[str]:
        """The rules that need the run (veRL's signature): mini-batches split over the data-parallel ranks
        (n_gpus / SP size) and into micro-batches or token budgets, SP divides the world and needs
        remove-padding, prefix grouping needs the padded forward. ``model_config``: the
        actor_rollout_ref.model section; ``max_sequence_length``: max prompt + response length (for the
        token budget). Raises ConfigError listing every problem; returns notes (valid but doubtful)."""
        p = rules.Problems()
        sp = self.sp_size
        rules.check_update_batches(
            p, self, world=n_gpus, train_batch_size=train_batch_size, longest=max_sequence_length
        )
        remove_padding = model_flag(model_config, "use_remove_padding", getattr(self, "use_remove_padding", False))
        rules.check_sp_needs_remove_padding(p, self._path, sp, self._model_path, remove_padding)
        if self.use_prefix_grouper:
            if remove_padding:
                p.errors.append(
                    f"{self._path}.use_prefix_grouper=True needs {self._model_path}.use_remove_padding=False "
                    "(each group's prompt runs once in the padded forward)"
                )
            if model_flag(model_config, "enable_gradient_checkpointing", False):
                p.errors.append(
                    f"{self._path}.use_prefix_grouper=True needs {self._model_path}."
                    "enable_gradient_checkpointing=False (checkpointing turns off the prompt cache)"
                )
        return p.raise_errors()


@dataclass
class FSDPActorConfig(ActorConfig):
    """``actor_rollout_ref.actor`` on the FSDP2/DDP engine (veRL's dp_actor.yaml)."""

    _target_: str = doc("verl.workers.config.FSDPActorConfig", "the class this section is read into")
    optim: FSDPOptimizerConfig = section(
        placed(FSDPOptimizerConfig, lr=1e-6, min_lr_ratio=0.0), "the optimizer", absent=_NO_GRAD_CLIP
    )
    fsdp_config: FSDPEngineConfig = section(engine_as_in_yaml, "the training engine", follows=_engine_follows("actor"))
    grad_clip: float | None = doc(1.0, "before veRL 0.9.1; mapped onto optim.clip_grad at load time")
    ulysses_sequence_parallel_size: int = doc(1, "deprecated: fsdp_config.ulysses_sequence_parallel_size", reason=SP)
    entropy_from_logits_with_chunking: bool = doc(False, "compute the entropy in chunks", note=_ACTOR_SPEED)
    entropy_from_logits_chunk_size: int = doc(2048, "tokens per entropy chunk", note=_ACTOR_SPEED)
    entropy_checkpointing: bool = doc(False, "recompute the entropy in backward", note=_ACTOR_SPEED)
    pad_to_length: bool = doc(False, "pad packed micro-batches to bucket multiples", note=_ACTOR_SPEED)
    use_remove_padding: bool = doc(True, "padding-free forward", follows=f"${{{_MODEL}.use_remove_padding}}")
    router_replay: RouterReplayConfig = section(RouterReplayConfig, "MoE routing replay", refused=_NO_ROUTER_REPLAY)

    @property
    def sp_size(self) -> int:
        """As veRL 0.9.1 reads it: the deprecated top-level key when > 1, else ``fsdp_config``'s."""
        return _sp_size(self.ulysses_sequence_parallel_size, self.fsdp_config)


def _sp_size(top_level: int, engine: FSDPEngineConfig) -> int:
    return top_level if top_level > 1 else engine.ulysses_sequence_parallel_size


@dataclass
class RefConfig(BaseConfig):
    """``actor_rollout_ref.ref``: the reference policy's log-prob pass (veRL's ref.yaml + dp_ref.yaml; veRL
    renames its log_prob_* keys to the actor's before reading it as an FSDPActorConfig)."""

    _target_: str = doc("verl.workers.config.FSDPActorConfig", "the class veRL reads this section into")
    strategy: str = doc("fsdp", "training engine", follows=_actor("strategy"), **STRATEGY_STATUS)
    rollout_n: int = doc(1, "samples per prompt", follows="${actor_rollout_ref.rollout.n}")
    use_torch_compile: bool = doc(True, "torch.compile", follows=_actor("use_torch_compile"), note=_REF_SPEED)
    log_prob_micro_batch_size: int | None = doc(None, "deprecated global micro-batch of the log-prob pass")
    log_prob_micro_batch_size_per_gpu: int | None = doc(None, "samples per forward on one rank")
    log_prob_use_dynamic_bsz: bool = doc(False, "pack by token count", follows=_actor("use_dynamic_bsz"))
    log_prob_max_token_len_per_gpu: int = doc(16384, "tokens per forward", follows=_actor("ppo_max_token_len_per_gpu"))
    profiler: ProfilerConfig = section(ProfilerConfig, "the reference's profiling", absent=TRAINING_PROFILER_ABSENT)
    fsdp_config: FSDPEngineConfig = section(
        placed(engine_as_in_yaml, forward_only=True),
        "the forward-only engine",
        follows={**_engine_follows("ref"), "pad_to_length_bucket": _actor("fsdp_config.pad_to_length_bucket")},
    )
    ulysses_sequence_parallel_size: int = doc(
        1, "deprecated: fsdp_config's", follows=_actor("ulysses_sequence_parallel_size"), reason=SP
    )
    entropy_from_logits_with_chunking: bool = doc(False, "compute the entropy in chunks", note=_REF_SPEED)
    entropy_from_logits_chunk_size: int = doc(2048, "tokens per entropy chunk", note=_REF_SPEED)
    entropy_checkpointing: bool = doc(False, "recompute the entropy in backward", note=_REF_SPEED)
    pad_to_length: bool = doc(False, "pad packed micro-batches", follows=_actor("pad_to_length"), note=_REF_SPEED)
    router_replay: RouterReplayConfig = section(RouterReplayConfig, "MoE routing replay", refused=_NO_ROUTER_REPLAY)

    _path = "actor_rollout_ref.ref"
    _model_path = "actor_rollout_ref.model"

    def __post_init__(self):
        check_strategy(self.strategy, "ref.strategy")
        check_micro_batch(
            self.log_prob_micro_batch_size,
            self.log_prob_micro_batch_size_per_gpu,
            self.log_prob_use_dynamic_bsz,
            self._path,
            "log_prob_micro_batch_size",
        )

    @property
    def sp_size(self) -> int:
        return _sp_size(self.ulysses_sequence_parallel_size, self.fsdp_config)

    def validate(
        self,
        n_gpus: int,
        train_batch_size: int | None = None,
        model_config: Any | None = None,
        *,
        max_sequence_length: int | None = None,
    ) -> list[str]:
        """The reference policy's log-prob pass: a micro-batch size or a token budget that holds one
        sequence, SP that divides the world and has remove-padding (arguments as ``ActorConfig.validate``)."""
        p = rules.Problems()
        sp = self.sp_size
        dp = rules.data_parallel_size(p, self._path, n_gpus, sp)
        if dp is not None:
            rules.forward_pass(p, self._path, self, dp, sp, max_sequence_length)
        remove_padding = model_flag(model_config, "use_remove_padding", True)
        rules.check_sp_needs_remove_padding(p, self._path, sp, self._model_path, remove_padding)
        return p.raise_errors()
