"""configs/sft_trainer.yaml as a declaration (``python -m hybridflow.main_sft``): veRL 0.9.1's
sft_trainer_engine tree with the SFT defaults (``data`` and ``trainer`` have no veRL class), plus the
earlier fsdp_sft_trainer spellings, null unless set, that the loader maps onto the 0.9.1 keys."""

from __future__ import annotations

import os
from collections.abc import Collection
from dataclasses import dataclass
from typing import ClassVar

from hybridflow.config.base import BaseConfig, doc, placed, section
from hybridflow.config.checkpoint import CheckpointConfig
from hybridflow.config.engine import FSDPEngineConfig, engine_as_in_yaml, fsdp_size_problem
from hybridflow.config.errors import ConfigError
from hybridflow.config.model import HFModelConfig
from hybridflow.config.module import ModuleConfig
from hybridflow.config.optimizer import FSDPOptimizerConfig
from hybridflow.config.profiler import HOOK_KEYS, SCHEDULE_KEYS, NsightToolConfig, ProfilerConfig, ProfilerToolConfig
from hybridflow.config.reasons import MEGATRON, speed_only
from hybridflow.config.rules import Problems, cpu_bf16_note
from hybridflow.config.status import honoured, noted, refused
from hybridflow.config.trainer import DEVICE_STATUS, RESUME_MODES
from hybridflow.utils.checkpoint_copy import check_copy_dir
from hybridflow.utils.torch_dtypes import resolve_dtype

__all__ = [
    "SFT_LR_SCHEDULERS",
    "SFT_STRATEGIES",
    "SFTMultiturnConfig",
    "SFTDataConfig",
    "LegacySFTFSDPConfig",
    "SFTModelConfig",
    "SFTOptimizerConfig",
    "SFTCheckpointConfig",
    "LegacySFTCheckpointConfig",
    "SFTRunConfig",
    "SFTTrainerConfig",
]

_SFT_DATA_SPEED = speed_only("packing, token balancing, loader processes, shared memory")
_ADAMW = "the SFT trainer uses torch.optim.AdamW"

SFT_LR_SCHEDULERS = ("constant", "cosine", "wsd")
SFT_STRATEGIES = ("fsdp", "fsdp2", "ddp", "none")
# engine.dtype: veRL's yaml holds bfloat16; here auto (bf16 on CUDA, fp32 on cpu), as the actor's param_dtype
SFT_COMPUTE_DTYPES = ("auto", "bfloat16", "bf16", "float16", "fp16", "float32", "fp32")


@dataclass
class SFTMultiturnConfig(BaseConfig):
    """``data.multiturn``: veRL's earlier multi-turn keys."""

    enable: bool = doc(False, "the rows are conversations (else: single-turn, unless the data has no prompt column)")
    messages_key: str | None = doc(None, "earlier spelling of data.messages_key (null: not set)")
    tools_key: str | None = doc(None, "earlier spelling of data.tools_key (null: not set)")
    enable_thinking_key: str | None = doc(None, "earlier spelling of data.enable_thinking_key (null: not set)")


@dataclass
class SFTDataConfig(BaseConfig):
    """``data``: the training and validation rows and how they are batched (no veRL class)."""

    train_batch_size: int = doc(256, "global batch (samples per optimizer step)")
    micro_batch_size_per_gpu: int | None = doc(4, "samples per forward/backward on one rank (and of validation)")
    micro_batch_size: int | None = doc(None, "deprecated; use micro_batch_size_per_gpu")
    max_token_len_per_gpu: int = doc(
        8192, "tokens per micro-batch (per SP group: times its size) under use_dynamic_bsz"
    )
    use_dynamic_bsz: bool = doc(
        False,
        "micro-batches by token budget (max_token_len_per_gpu) instead of micro_batch_size_per_gpu rows; the loss "
        "is the same. hybridflow: False (veRL 0.9.1: True)",
    )
    train_files: str | list[str] = doc("~/data/gsm8k/train.parquet", "a path or a list of paths")
    val_files: str | list[str] | None = doc(None, "validation parquet(s); null: no validation")
    train_max_samples: int = doc(-1, "rows read from the training files (the first ones); -1: all")
    val_max_samples: int = doc(-1, "rows read from the validation files (the first ones); -1: all")
    prompt_key: str = doc("question", "hybridflow (veRL's earlier single-turn key): the prompt column")
    response_key: str = doc("answer", "hybridflow (veRL's earlier single-turn key): the response column")
    prompt_dict_keys: list[str] | None = doc(None, "when the column holds a dict: the keys to read inside it")
    response_dict_keys: list[str] | None = doc(None, "the same for the response column")
    messages_key: str = doc("messages", "conversations: the column of chat messages")
    tools_key: str = doc("tools", "conversations: the column of OpenAI tool schemas (a list, or its JSON text)")
    enable_thinking_key: str = doc(
        "enable_thinking", "conversations: the column of the per-row switch passed to the chat template"
    )
    enable_thinking_default: str | bool | None = doc(
        "none", "conversations: the switch where the data has no such column (none: not passed; true / false)"
    )
    pad_mode: str = doc("no_padding", "veRL packs; hybridflow cuts after the longest row", note=_SFT_DATA_SPEED)
    max_length: int = doc(1024, "prompt + response tokens")
    truncation: str = doc("error", "error | left | right")
    balance_dp_token: bool = doc(False, "balance tokens over the data-parallel ranks", note=_SFT_DATA_SPEED)
    custom_cls: ModuleConfig = section(
        ModuleConfig, "your Dataset class", keys=dict.fromkeys(("path", "name"), honoured())
    )
    use_shm: bool = doc(False, "copy the data to shared memory first (speed only)", note=_SFT_DATA_SPEED)
    apply_chat_template_kwargs: dict = doc({}, "extra arguments of the tokenizer's chat template")
    num_workers: int = doc(8, "data-loader processes (speed only)", note=_SFT_DATA_SPEED)
    ignore_input_ids_mismatch: bool = doc(
        False,
        "conversations: train on the turn-by-turn tokens where the template renders the conversation at once "
        "differently (Qwen3 drops earlier turns' reasoning); false: such a row is an error",
    )
    multiturn: SFTMultiturnConfig = section(SFTMultiturnConfig, "veRL's earlier multi-turn switch and keys")
    chat_template: str | None = doc(None, "veRL's earlier spelling of model.custom_chat_template (null: not set)")

    @property
    def micro_batch_rows(self) -> int | None:
        """Rows per forward/backward on one rank: micro_batch_size_per_gpu, else the deprecated micro_batch_size."""
        return self.micro_batch_size_per_gpu or self.micro_batch_size


@dataclass
class LegacySFTFSDPConfig(BaseConfig):
    """``model.fsdp_config``: veRL's earlier spelling of the engine section (every key null: not set)."""

    model_dtype: str | None = doc(None, "earlier spelling of engine.model_dtype")
    wrap_policy: dict = doc({"min_num_params": None}, "earlier spelling of engine.wrap_policy")
    cpu_offload: bool | None = doc(None, "earlier spelling of engine.param_offload")
    offload_params: bool | None = doc(None, "earlier spelling of engine.offload_policy")


@dataclass
class SFTModelConfig(HFModelConfig):
    """``model``: the model trained (veRL's HFModelConfig) plus the earlier fsdp_sft_trainer spellings."""

    partial_pretrain: str | None = doc(None, "earlier spelling of model.path (null: not set)")
    strategy: str | None = doc(None, "earlier spelling of engine.strategy (null: not set)")
    fsdp_config: LegacySFTFSDPConfig = section(LegacySFTFSDPConfig, "earlier spelling of the engine section")


@dataclass
class SFTOptimizerConfig(FSDPOptimizerConfig):
    """``optim``: veRL's FSDPOptimizerConfig with the SFT learning rate, warmup-stable-decay and the earlier
    spellings."""

    lr_schedulers: ClassVar[tuple[str, ...]] = SFT_LR_SCHEDULERS

    lr: float = doc(1e-5, "hybridflow: 1e-5, as veRL's earlier SFT trainer (veRL 0.9.1: 1e-3)")
    lr_scheduler_type: str = doc("constant", "constant | cosine | wsd (warmup-stable-decay)", values=SFT_LR_SCHEDULERS)
    warmup_steps_ratio: float | None = doc(None, "earlier spelling of lr_warmup_steps_ratio (null: not set)")
    lr_scheduler: str | None = doc(None, "earlier spelling of lr_scheduler_type (null: not set)")


@dataclass
class SFTCheckpointConfig(CheckpointConfig):
    """``checkpoint``: what ``global_step_N`` holds besides its Hugging Face model directory (always written)."""

    save_contents: list[str] = doc(
        ["model", "optimizer", "extra"],
        "model / optimizer / extra: the training state a resume reads (global_step_N/engine/); hf_model: the "
        "Hugging Face directory, written in every case",
    )
    load_contents: list[str] = doc(
        ["model", "optimizer", "extra"],
        "read back on resume (model and extra needed; without optimizer AdamW starts afresh)",
        follows="${checkpoint.save_contents}",
    )


@dataclass
class LegacySFTCheckpointConfig(BaseConfig):
    """``trainer.checkpoint``: veRL main's spelling of the top-level checkpoint section."""

    save_contents: list[str] | None = doc(None, "earlier spelling of checkpoint.save_contents (null: not set)")
    load_contents: list[str] | None = doc(None, "earlier spelling of checkpoint.load_contents (null: not set)")


@dataclass
class SFTRunConfig(BaseConfig):
    """``trainer``: the run (steps, devices, logging, checkpoints; no veRL class)."""

    default_local_dir: str = doc(
        "checkpoints/gsm8k-sft/test",
        "where global_step_N (Hugging Face directories) go",
        follows="checkpoints/${trainer.project_name}/${trainer.experiment_name}",
    )
    default_hdfs_dir: str | None = doc(
        None,
        "a second copy of each checkpoint",
        reason="after each save, global_step_N is copied to <dir>/global_step_N with its own tracker file (a "
        "folder a run can resume from); hdfs:// through the hdfs command line, else a local or mounted folder; "
        "max_ckpt_to_keep applies to default_local_dir only",
    )
    project_name: str = doc("gsm8k-sft", "experiment tracking project")
    experiment_name: str = doc("test", "run name in the tracking tools")
    total_epochs: int = doc(4, "passes over the training data")
    total_training_steps: int | None = doc(None, "null: total_epochs x steps per epoch")
    logger: str | list[str] = doc(
        ["console"], "hybridflow: console only (veRL: console + wandb), so no default reaches the network"
    )
    seed: int = doc(1, "seed of the data order and the model's initialisation")
    save_freq: int = doc(-1, "steps between checkpoints; -1: at the end only")
    test_freq: int = doc(-1, "steps between validations; -1: at the end only")
    max_ckpt_to_keep: int | None = doc(None, "checkpoints kept; null: all")
    balance_batch: bool = doc(True, "balance tokens over ranks", note=speed_only("token balancing across ranks"))
    resume_mode: str = doc(
        "auto", "auto (the newest global_step_N of default_local_dir, if any) | disable | resume_path"
    )
    resume_from_path: str | None = doc(None, "the global_step_N directory that resume_mode=resume_path continues")
    resume_path: str | None = doc(None, "earlier spelling of resume_from_path (null: not set)")
    device: str = doc("auto", "hybridflow: auto | cpu | cuda (veRL: cuda)", **DEVICE_STATUS)
    nnodes: int = doc(1, "nodes of the run")
    n_gpus_per_node: int = doc(1, "processes per node (torchrun's --nproc_per_node decides)")
    profile_interval: list[int] = doc(
        [-1, -1],
        "steps profiled, [start, end]; [-1, -1]: none",
        reason="one torch.profiler trace from the start of step start to the end of step end, by the ranks "
        "profiler selects (profiler.enable), in <profiler.save_path>/step_<start>/sft_rank<r>.pt.trace.json",
    )
    checkpoint: LegacySFTCheckpointConfig = section(LegacySFTCheckpointConfig, "veRL main's spelling of checkpoint")

    @property
    def loggers(self) -> tuple[str, ...]:
        """``logger`` as a tuple of backend names (a single name is allowed)."""
        return (self.logger,) if isinstance(self.logger, str) else tuple(self.logger or ())

    @property
    def local_dir(self) -> str:
        """``default_local_dir`` with ``~`` expanded."""
        return os.path.expanduser(str(self.default_local_dir))


_SFT_NO_SCHEDULE = (
    "the SFT trace records whole steps (trainer.profile_interval); its steps have no mini-batches to sample"
)


def _profiler() -> ProfilerConfig:
    # veRL's profiler.yaml: the torch tool; no global_profiler here, so nsys.discrete follows nothing (null)
    return ProfilerConfig(tool="torch", tool_config=ProfilerToolConfig(nsys=NsightToolConfig(discrete=None)))


_GT, _PD = "global_profiler.global_tool_config", "tool_config.precision_debugger"
# veRL's profiler.yaml interpolations, written as they are (this tree has no global_profiler)
_PROFILER_FOLLOWS = {
    **dict.fromkeys(("tool", "save_path", *HOOK_KEYS)),
    "tool_config.nsys.discrete": f"${{oc.select:{_GT}.nsys.discrete}}",
    **{
        f"tool_config.torch_memory.{k}": f"${{oc.select:{_GT}.torch_memory.{k},{v}}}"
        for k, v in (("trace_alloc_max_entries", 100000), ("stack_depth", 32), ("memory_snapshot_num_steps", 1))
    },
    **{f"{_PD}.{k}": f"${{oc.select:{_GT}.precision_debugger.{k},null}}" for k in ("config_path", "stages")},
}


@dataclass
class SFTTrainerConfig(BaseConfig):
    """configs/sft_trainer.yaml: veRL 0.9.1's sft_trainer_engine tree, key for key, plus the earlier spellings."""

    data: SFTDataConfig = section(SFTDataConfig, "the rows: single-turn, or conversations (loss on assistant turns)")
    model: SFTModelConfig = section(
        SFTModelConfig,
        "the model trained (veRL's hf_model.yaml)",
        keys={
            "use_shm": noted("copying the model to shared memory only speeds up loading"),
            "custom_chat_template": honoured(),
            **dict.fromkeys(
                ("enable_activation_offload", "use_liger", "use_fused_kernels", "fused_kernel_options", "tiled_mlp"),
                noted(speed_only("fused kernels, tiled MLP, activation offload")),
            ),
            "use_remove_padding": noted(
                "each micro-batch is cut after its longest row instead of packed (same loss); with "
                "engine.ulysses_sequence_parallel_size > 1 the rows are packed"
            ),
            **dict.fromkeys(
                ("lora_alpha", "target_modules", "exclude_modules"), honoured("used only when lora_rank > 0")
            ),
            "lora": refused(MEGATRON),
        },
    )
    engine: FSDPEngineConfig = section(
        placed(engine_as_in_yaml, dtype="auto"),
        "the training engine (veRL's engine/fsdp.yaml)",
        absent=("mixed_precision",),
        keys={
            **dict.fromkeys(
                "wrap_policy.min_num_params forward_prefetch use_orig_params entropy_from_logits_with_chunking "
                "entropy_from_logits_chunk_size use_torch_compile entropy_checkpointing "
                "use_no_sync_for_gradient_accumulation pad_to_length pad_to_length_bucket".split(),
                noted(speed_only("FSDP wrapping/prefetch, torch.compile, padding buckets")),
            ),
            "dtype": honoured(
                "the compute dtype under autocast (fp32 master weights): auto is bf16 on CUDA and fp32 on cpu; "
                "bfloat16 on cpu is fast only where the CPU has bf16 units (AMX, AVX512-BF16)",
                values=SFT_COMPUTE_DTYPES,
            ),
            **dict.fromkeys(
                "param_offload optimizer_offload offload_policy".split(),
                honoured(
                    "CUDA, strategy=fsdp: FSDP2's CPU offload (parameters, gradients and AdamW state in host memory; "
                    "one process gets a group of one); on cpu they already live there"
                ),
            ),
            "fsdp_size": honoured(
                "strategy=fsdp: hybrid sharding, groups of fsdp_size processes shard the weights and replicate one "
                "another; -1: one group"
            ),
            **dict.fromkeys(
                "seed full_determinism".split(),
                honoured(
                    "deterministic kernels, cuBLAS/flash-attn/NCCL switches and generators seeded with engine.seed "
                    "before the model is built (seed: used only then); see README, Reproducibility"
                ),
            ),
            "forward_only": refused("set by veRL's engine for models that never train; SFT trains its model"),
            "reshard_after_forward": honoured("FSDP2 reshards after every forward", values=(True,)),
            "model_dtype": honoured(),
            "ulysses_sequence_parallel_size": honoured(
                "sequence-parallel groups of that many consecutive ranks split each packed micro-batch"
            ),
            "strategy": honoured("hybridflow's training engines", values=SFT_STRATEGIES),
        },
    )
    optim: SFTOptimizerConfig = section(
        placed(SFTOptimizerConfig, min_lr_ratio=0.0),
        "AdamW and the lr schedule",
        absent=("grad_clip",),
        keys={
            "total_training_steps": refused("the schedule length is trainer.total_training_steps"),
            "optimizer": honoured(_ADAMW, values=("AdamW",)),
            "optimizer_impl": honoured(_ADAMW, values=("torch.optim",)),
        },
    )
    checkpoint: SFTCheckpointConfig = section(
        SFTCheckpointConfig, "what a checkpoint holds", absent=("async_save", "strict", "save_lora_only")
    )
    trainer: SFTRunConfig = section(SFTRunConfig, "the run: steps, devices, logging, checkpoints")
    profiler: ProfilerConfig = section(
        _profiler,
        "veRL's profiler.yaml (the steps: trainer.profile_interval)",
        follows=_PROFILER_FOLLOWS,
        absent=(f"{_PD}.strict",),
        keys={
            "tool_config.torch.discrete": honoured(
                "one trace of the interval (the SFT step has no stages)", values=(False,)
            ),
            **{f"tool_config.torch.schedule.{k}": refused(_SFT_NO_SCHEDULE) for k in SCHEDULE_KEYS},
        },
    )
    ulysses_sequence_parallel_size: int | None = doc(None, "earlier spelling of engine.ulysses_sequence_parallel_size")
    use_remove_padding: bool | None = doc(None, "earlier spelling of model.use_remove_padding (null: not set)")

    def validate(self, world_size: int, loggers: Collection[str]) -> list[str]:
        """Checks for a run of ``world_size`` processes whose tracking backends are ``loggers``: returns the
        notes to print; raises ConfigError naming every key that cannot work, all at once."""
        data, trainer, p = self.data, self.trainer, Problems()
        errors, notes = p.errors, p.notes
        if data.micro_batch_size is not None:
            notes.append("data.micro_batch_size is deprecated; use data.micro_batch_size_per_gpu")
        batch = p.positive("data.train_batch_size", data.train_batch_size)
        p.positive("data.micro_batch_size_per_gpu", data.micro_batch_rows)
        sp = int(self.engine.ulysses_sequence_parallel_size)
        if sp < 1 or world_size % sp:
            errors.append(
                f"engine.ulysses_sequence_parallel_size={sp} must be >= 1 and divide the {world_size} process(es)"
            )
            sp = 1
        if batch and batch % (world_size // sp):
            over = (
                f"{world_size} processes"
                if sp == 1
                else f"{world_size // sp} data-parallel ranks ({world_size} processes / "
                f"engine.ulysses_sequence_parallel_size={sp})"
            )
            errors.append(f"data.train_batch_size={batch} does not split over {over}")
        if (schedule := self.optim.lr_scheduler_type) not in SFT_LR_SCHEDULERS:
            errors.append(f"optim.lr_scheduler_type must be one of {SFT_LR_SCHEDULERS}, got {schedule!r}")
        if self.engine.strategy not in SFT_STRATEGIES:
            errors.append(f"engine.strategy must be one of {SFT_STRATEGIES}, got {self.engine.strategy!r}")
        if set(trainer.loggers) - set(loggers):
            errors.append(f"trainer.logger: the SFT trainer supports {tuple(loggers)}, got {list(trainer.loggers)}")
        if (expected := trainer.nnodes * trainer.n_gpus_per_node) != world_size:
            notes.append(
                f"trainer.nnodes * trainer.n_gpus_per_node = {expected}, but {world_size} process(es) "
                f"run: the process count comes from torchrun (--nproc_per_node)"
            )
        if trainer.resume_mode not in RESUME_MODES:
            errors.append(f"trainer.resume_mode={trainer.resume_mode!r} is not one of {', '.join(RESUME_MODES)}")
        if trainer.resume_mode == "resume_path" and not trainer.resume_from_path:
            errors.append("trainer.resume_mode=resume_path needs trainer.resume_from_path (a global_step_N directory)")
        self._check_engine(world_size, p)
        self._check_profiling(world_size, p)
        if problem := check_copy_dir(trainer.default_hdfs_dir, "trainer.default_hdfs_dir"):
            errors.append(problem)
        if str(trainer.device) == "cpu" and resolve_dtype(self.engine.dtype, "cpu") in ("bfloat16", "float16"):
            notes.append(f"engine.dtype={self.engine.dtype} on cpu: the forward runs under autocast; {cpu_bf16_note()}")
        if errors:
            raise ConfigError("invalid SFT config:\n  " + "\n  ".join(errors))
        return notes

    def _check_profiling(self, world_size: int, p: Problems) -> None:
        """trainer.profile_interval (veRL's rules) and whether the profiler section records anything."""
        interval, profiler = list(self.trainer.profile_interval or []), self.profiler
        key = f"trainer.profile_interval={interval}"
        if len(interval) != 2:
            p.errors.append(f"{key} must be [start, end]")
            return
        start, end = (int(v) for v in interval)
        if end < start:
            p.errors.append(f"{key}: end must not come before start")
        elif start < 0 and end >= 0:
            p.errors.append(f"{key}: a negative start (no profiling) needs a negative end")
        window = start >= 0
        if profiler.enable and profiler.tool is None:
            p.notes.append("profiler.enable=true records nothing while profiler.tool is null (torch records)")
        elif window and not profiler.enable:
            p.notes.append(f"{key} records nothing while profiler.enable=false")
        elif profiler.enable and not window:
            p.notes.append("profiler.enable=true records nothing while trainer.profile_interval is [-1, -1]")
        elif profiler.enable and not profiler.all_ranks and not set(profiler.ranks) & set(range(world_size)):
            p.notes.append(
                f"profiler.enable=true, but no rank of {world_size} records (profiler.all_ranks=false, "
                f"profiler.ranks={list(profiler.ranks)}): set profiler.all_ranks=true or profiler.ranks=[0]"
            )

    def _check_engine(self, world_size: int, p: Problems) -> None:
        """engine's offload and hybrid-sharding keys: what they do with this strategy, device and world."""
        engine, sharded = self.engine, self.engine.strategy in ("fsdp", "fsdp2")
        offload = [k for k in ("param_offload", "optimizer_offload", "offload_policy") if getattr(engine, k)]
        if offload and str(self.trainer.device) == "cpu":
            p.notes.append(
                f"engine.{offload[0]}=True has no effect on cpu: the weights and AdamW state are in host memory"
            )
        elif offload and not sharded:
            p.errors.append(
                f"engine.{offload[0]}=True needs engine.strategy=fsdp (FSDP2's CPU offload), got {engine.strategy}"
            )
        size = int(engine.fsdp_size)
        if problem := fsdp_size_problem(size, world_size, "engine.fsdp_size"):
            p.errors.append(problem)
        elif size > 0 and not sharded:
            p.notes.append(f"engine.fsdp_size={size} is unused with engine.strategy={engine.strategy} (no sharding)")
