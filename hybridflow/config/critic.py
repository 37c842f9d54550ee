"""The value model's section ``critic`` (veRL's CriticConfig / FSDPCriticConfig)."""

from __future__ import annotations

from dataclasses import dataclass

from hybridflow.config import rules
from hybridflow.config.actor import STRATEGY_STATUS, TRAINING_PROFILER_ABSENT, check_micro_batch, check_strategy
from hybridflow.config.base import BaseConfig, built_alone, doc, placed, section
from hybridflow.config.checkpoint import CheckpointConfig
from hybridflow.config.engine import FSDPEngineConfig, engine_as_in_yaml
from hybridflow.config.errors import ConfigError
from hybridflow.config.model import CriticModelConfig
from hybridflow.config.optimizer import FSDPOptimizerConfig, OptimizerConfig
from hybridflow.config.profiler import ProfilerConfig
from hybridflow.config.reasons import SP
from hybridflow.config.status import honoured, refused

__all__ = ["CriticConfig", "FSDPCriticConfig"]

_A = "actor_rollout_ref.actor"


@dataclass
class CriticConfig(BaseConfig):
    """The critic keys of every training engine (veRL's critic.yaml)."""

    _mutable_fields = {"ppo_mini_batch_size", "ppo_micro_batch_size", "ppo_micro_batch_size_per_gpu"}

    _target_: str = doc("verl.workers.config.CriticConfig", "the class this section is read into")
    enable: bool | None = doc(None, "train a critic; null: exactly when algorithm.adv_estimator is gae")
    strategy: str = doc("fsdp", "training engine: fsdp | fsdp2 | ddp", **STRATEGY_STATUS)
    rollout_n: int = doc(1, "samples per prompt", follows="${actor_rollout_ref.rollout.n}")
    optim: OptimizerConfig = section(placed(OptimizerConfig, lr=1e-5), "the critic's optimizer", absent=("grad_clip",))
    ppo_mini_batch_size: int = doc(256, "prompts per optimizer step", follows=f"${{{_A}.ppo_mini_batch_size}}")
    ppo_micro_batch_size: int | None = doc(None, "deprecated global micro-batch; use ppo_micro_batch_size_per_gpu")
    ppo_micro_batch_size_per_gpu: int | None = doc(
        None, "samples per forward/backward on one rank", follows="${oc.select:.ppo_micro_batch_size,null}"
    )
    use_dynamic_bsz: bool = doc(False, "pack micro-batches by token count", follows=f"${{{_A}.use_dynamic_bsz}}")
    ppo_max_token_len_per_gpu: int = doc(32768, "token budget per rank and micro-batch when use_dynamic_bsz")
    forward_max_token_len_per_gpu: int = doc(32768, "tokens of the value pass", follows="${.ppo_max_token_len_per_gpu}")
    ppo_epochs: int = doc(1, "passes over the batch per step", follows=f"${{{_A}.ppo_epochs}}")
    shuffle: bool = doc(False, "shuffle before splitting into mini-batches", follows=f"${{{_A}.shuffle}}")
    data_loader_seed: int = doc(42, "seed of that shuffle")
    cliprange_value: float = doc(0.5, "clip range of the value update")
    loss_agg_mode: str = doc("token-mean", "loss aggregation", follows=f"${{{_A}.loss_agg_mode}}")
    loss_scale_factor: float | None = doc(
        None, "seq-mean-token-sum-norm divisor", follows=f"${{{_A}.loss_scale_factor}}"
    )
    checkpoint: CheckpointConfig = section(
        CheckpointConfig, "what a checkpoint holds", absent=("strict", "save_lora_only")
    )
    profiler: ProfilerConfig = section(ProfilerConfig, "the critic's profiling", absent=TRAINING_PROFILER_ABSENT)
    model: CriticModelConfig = section(
        CriticModelConfig,
        "the value model",
        keys={
            "tokenizer_path": honoured(),
            "custom_chat_template": refused(
                "this model never formats a conversation; the policy's template is actor_rollout_ref.model's"
            ),
            "lora_rank": honoured("LoRA adapters on the value model's body; its value head trains in full"),
            **dict.fromkeys(
                ("lora_alpha", "target_modules", "exclude_modules"), honoured("used only when lora_rank > 0")
            ),
        },
    )

    _path = "critic"  # where the section sits: messages name full keys

    def __post_init__(self):
        check_strategy(self.strategy, "critic.strategy")
        mbs, dynamic = self.ppo_micro_batch_size, self.use_dynamic_bsz
        check_micro_batch(mbs, self.ppo_micro_batch_size_per_gpu, dynamic, self._path, verl_word="micro_batch_size")
        no_micro_batch = self.ppo_micro_batch_size is None and self.ppo_micro_batch_size_per_gpu is None
        if built_alone() and not self.use_dynamic_bsz and no_micro_batch:  # veRL's check and wording
            raise ConfigError(
                "[critic] Please set at least one of 'critic.micro_batch_size' or 'critic.micro_batch_size_per_gpu'. "
                "(critic.ppo_micro_batch_size, critic.ppo_micro_batch_size_per_gpu)"
            )
        if not dynamic and mbs is not None and self.ppo_mini_batch_size % mbs:
            raise ConfigError(
                f"[critic] ppo_mini_batch_size ({self.ppo_mini_batch_size}) must be divisible by "
                f"ppo_micro_batch_size ({self.ppo_micro_batch_size})"
            )

    @property
    def sp_size(self) -> int:
        """The Ulysses sequence-parallel size the critic runs with (1 on engines without it)."""
        return 1

    def per_rank(self, dp_size: int) -> CriticConfig:
        """A copy with veRL's per-rank batch sizes (as ``ActorConfig.per_rank``, with the section's rollout_n)."""
        return rules.per_rank_update(self, dp_size, self.rollout_n)

    def validate(
        self, n_gpus: int, train_batch_size: int | None, *, max_sequence_length: int | None = None
    ) -> list[str]:
        """The rules that need the run (veRL's signature; ``max_sequence_length``: max prompt + response
        length, for the token budgets): as ``ActorConfig.validate``, with critic.model's remove-padding.
        Raises ConfigError listing every problem; returns notes."""
        p, sp = rules.Problems(), self.sp_size
        rules.check_update_batches(
            p, self, world=n_gpus, train_batch_size=train_batch_size, longest=max_sequence_length
        )
        if self.use_dynamic_bsz:
            budget = self.forward_max_token_len_per_gpu
            rules.check_token_budget(p, self._path, "forward_max_token_len_per_gpu", budget, sp, max_sequence_length)
        rules.check_sp_needs_remove_padding(p, self._path, sp, "critic.model", self.model.use_remove_padding)
        return p.raise_errors()


@dataclass
class FSDPCriticConfig(CriticConfig):
    """``critic`` on the FSDP2/DDP engine (veRL's dp_critic.yaml)."""

    _mutable_fields = CriticConfig._mutable_fields | {"forward_micro_batch_size", "forward_micro_batch_size_per_gpu"}

    _target_: str = doc("verl.workers.config.FSDPCriticConfig", "the class this section is read into")
    optim: FSDPOptimizerConfig = section(
        placed(FSDPOptimizerConfig, lr=1e-5, min_lr_ratio=0.0), "the critic's optimizer", absent=("grad_clip",)
    )
    fsdp: FSDPEngineConfig = section(engine_as_in_yaml, "the training engine")
    forward_micro_batch_size: int | None = doc(
        None, "deprecated global micro-batch of the value pass", follows="${oc.select:.ppo_micro_batch_size,null}"
    )
    forward_micro_batch_size_per_gpu: int | None = doc(
        None, "samples per value forward on one rank", follows="${oc.select:.ppo_micro_batch_size_per_gpu,null}"
    )
    ulysses_sequence_parallel_size: int = doc(1, "deprecated: fsdp.ulysses_sequence_parallel_size", reason=SP)
    grad_clip: float | None = doc(1.0, "before veRL 0.9.1; mapped onto critic.optim.clip_grad at load time")

    @property
    def sp_size(self) -> int:
        """As veRL 0.9.1 reads it: the deprecated top-level key when > 1, else ``fsdp``'s."""
        top = self.ulysses_sequence_parallel_size
        return top if top > 1 else self.fsdp.ulysses_sequence_parallel_size

    def per_rank(self, dp_size: int) -> FSDPCriticConfig:
        """Also the value pass's micro-batch: from the deprecated global ``forward_micro_batch_size``, else
        the update's per-rank size."""
        out = super().per_rank(dp_size)
        if not out.forward_micro_batch_size_per_gpu and out.forward_micro_batch_size:
            out.forward_micro_batch_size_per_gpu = max(1, out.forward_micro_batch_size // dp_size)
        if not out.forward_micro_batch_size_per_gpu:
            out.forward_micro_batch_size_per_gpu = out.ppo_micro_batch_size_per_gpu
        return out
