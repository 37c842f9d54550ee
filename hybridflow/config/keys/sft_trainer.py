"""Status of every key of configs/sft_trainer.yaml (``python -m hybridflow.main_sft``).

The canonical tree is veRL 0.9.1's sft_trainer_engine.yaml; the keys of veRL's earlier
fsdp_sft_trainer (veRL main's sft_trainer.yaml) are aliases of it, except the single-turn data keys
(prompt_key, response_key, ...), which hybridflow's SFT dataset reads.
"""

from __future__ import annotations

from hybridflow.config.keys.common import MEGATRON, NO_SP, PROFILER, everything_under, speed_only, targets, trainer_device
from hybridflow.config.support import KeyTable, honoured, not_supported, note

THINKING = "the multi-turn SFT dataset renders conversations without a per-row thinking switch"

DATA = [
    honoured("data.train_batch_size", "data.micro_batch_size_per_gpu", "data.micro_batch_size", "data.train_files",
             "data.val_files", "data.max_length", "data.truncation", "data.custom_cls.path", "data.custom_cls.name",
             "data.prompt_key", "data.response_key", "data.prompt_dict_keys", "data.response_dict_keys",
             "data.apply_chat_template_kwargs.**"),
    # conversations (MultiTurnSFTDataset): with data.multiturn.enable, or when the data has a messages
    # column and no prompt column (veRL 0.9.1 reads messages by default)
    honoured("data.multiturn.enable", "data.messages_key", "data.tools_key"),
    honoured("data.use_dynamic_bsz", values=(False,), reason="the SFT trainer batches by sample count"),
    note("data.max_token_len_per_gpu", reason="used only with data.use_dynamic_bsz, which the SFT trainer does not do"),
    note("data.pad_mode", "data.balance_dp_token", "data.num_workers", "data.use_shm",
         reason=speed_only("packing, token balancing, loader processes, shared memory")),
    not_supported("data.train_max_samples", "data.val_max_samples", reason="limiting the number of rows is not implemented"),
    not_supported("data.enable_thinking_key", "data.enable_thinking_default", reason=THINKING),
    not_supported("data.ignore_input_ids_mismatch", reason="the multi-turn SFT dataset tokenizes each turn as a "
                                                           "suffix of the rendered conversation and fails on a "
                                                           "template that does not allow it; no mismatch to ignore"),
]

MODEL = [
    honoured("model.path", "model.trust_remote_code", "model.external_lib", "model.enable_gradient_checkpointing",
             "model.custom_chat_template"),
    honoured("model.lora_rank", values=(0,), reason="LoRA is not implemented in the SFT trainer yet"),
    honoured("model.lora_alpha", "model.target_modules", reason="used only when lora_rank > 0"),
    note("model.use_remove_padding", reason="each micro-batch is cut after its longest row instead of packed; the loss "
                                            "is the same"),
    note("model.use_shm", reason="copying the model to shared memory only speeds up loading"),
    note("model.use_liger", "model.use_fused_kernels", "model.fused_kernel_options.**", "model.tiled_mlp.**",
         "model.enable_activation_offload", reason=speed_only("fused kernels, tiled MLP, activation offload")),
    not_supported("model.hf_config_path", "model.tokenizer_path", "model.override_config.**", "model.exclude_modules",
                  "model.lora_adapter_path", reason="the SFT trainer loads config, tokenizer and weights from model.path"),
    not_supported("model.mtp.**", reason="multi-token prediction (MTP) is not implemented"),
    not_supported("model.lora.**", reason=MEGATRON),
]

ENGINE = [
    honoured("engine.strategy", values=("fsdp", "fsdp2", "ddp", "none"), reason="hybridflow's training engines"),
    honoured("engine.model_dtype"),
    honoured("engine.ulysses_sequence_parallel_size", values=(1,), reason=NO_SP),
    not_supported("engine.param_offload", "engine.optimizer_offload", "engine.offload_policy", "engine.fsdp_size",
                  "engine.seed", "engine.full_determinism", "engine.forward_only", "engine.dtype",
                  reason="the SFT trainer does not implement this FSDP engine option (no offload, mixed precision or "
                         "hybrid sharding)"),
    honoured("engine.reshard_after_forward", values=(True,), reason="FSDP2 reshards after every forward"),
    note("engine.wrap_policy.min_num_params", "engine.forward_prefetch", "engine.use_orig_params",
         "engine.use_torch_compile", "engine.entropy_from_logits_with_chunking", "engine.entropy_from_logits_chunk_size",
         "engine.entropy_checkpointing", "engine.use_no_sync_for_gradient_accumulation", "engine.pad_to_length",
         "engine.pad_to_length_bucket", reason=speed_only("FSDP wrapping/prefetch, torch.compile, padding buckets")),
    not_supported("engine.qat.**", reason="quantization-aware training is not implemented"),
    not_supported("engine.turbo_config.**", reason="veRL's FSDP-turbo engine is not implemented"),
]

OPTIM = [
    honoured("optim.lr", "optim.betas", "optim.weight_decay", "optim.lr_warmup_steps_ratio", "optim.lr_warmup_steps",
             "optim.clip_grad", "optim.min_lr_ratio", "optim.num_cycles"),
    honoured("optim.lr_scheduler_type", values=("constant", "cosine", "wsd")),
    honoured("optim.optimizer", values=("AdamW",), reason="the SFT trainer uses torch.optim.AdamW"),
    honoured("optim.optimizer_impl", values=("torch.optim",), reason="the SFT trainer uses torch.optim.AdamW"),
    honoured("optim.zero_indexed_step", values=(True,), reason="the schedule counts steps from 0"),
    not_supported("optim.total_training_steps",
                  reason="the schedule length is trainer.total_training_steps (or epochs x steps per epoch)"),
    not_supported("optim.override_optimizer_config", reason="extra optimizer arguments are not implemented"),
]

TRAINER = [
    trainer_device(),
    honoured("trainer.default_local_dir", "trainer.project_name", "trainer.experiment_name", "trainer.total_epochs",
             "trainer.total_training_steps", "trainer.logger", "trainer.seed", "trainer.save_freq", "trainer.test_freq",
             "trainer.max_ckpt_to_keep", "trainer.nnodes", "trainer.n_gpus_per_node"),
    honoured("checkpoint.save_contents", "checkpoint.load_contents", values=(["hf_model"],),
             reason="the SFT trainer writes a Hugging Face model directory per checkpoint (no optimizer state)"),
    honoured("trainer.resume_mode", values=("disable",), reason="resuming SFT is not implemented yet"),
    not_supported("trainer.resume_from_path", reason="resuming SFT is not implemented yet; to continue from saved "
                                                     "weights set model.path=<.../global_step_N>"),
    not_supported("trainer.default_hdfs_dir", reason="copying checkpoints to HDFS is not implemented"),
    note("trainer.balance_batch", reason=speed_only("token balancing across ranks")),
    not_supported("trainer.profile_interval", reason=PROFILER),
    everything_under("profiler", PROFILER),
    targets(),
]

ALIASES = (
    ("model.partial_pretrain", "model.path"),
    ("model.strategy", "engine.strategy"),
    ("model.fsdp_config", "engine"),
    ("model.fsdp_config.cpu_offload", "engine.param_offload"),
    ("model.fsdp_config.offload_params", "engine.offload_policy"),
    ("ulysses_sequence_parallel_size", "engine.ulysses_sequence_parallel_size"),
    ("use_remove_padding", "model.use_remove_padding"),
    ("optim.warmup_style", "optim.lr_scheduler_type"),
    ("optim.lr_scheduler", "optim.lr_scheduler_type"),
    ("optim.warmup_steps_ratio", "optim.lr_warmup_steps_ratio"),
    ("data.multiturn.messages_key", "data.messages_key"),
    ("data.multiturn.tools_key", "data.tools_key"),
    ("data.multiturn.enable_thinking_key", "data.enable_thinking_key"),
    ("data.chat_template", "model.custom_chat_template"),
    ("trainer.checkpoint", "checkpoint"),
    ("trainer.resume_path", "trainer.resume_from_path"),
)

TABLE = KeyTable.build("sft_trainer", DATA + MODEL + ENGINE + OPTIM + TRAINER, ALIASES)
