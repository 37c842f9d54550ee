"""Status of every key of configs/ppo_trainer.yaml (see the package docstring for how to flip one)."""

from __future__ import annotations

from hybridflow.config.keys.common import (
    MEGATRON, NO_SP, PROFILER, PROFILER_TOOLS, SP, VLM, checkpoint, everything_under, fsdp_engine, hf_model, optimizer,
    profiler, reward_model_rollout, rollout, speed_only, targets, trainer_device,
)
from hybridflow.config.support import KeyTable, honoured, not_supported, note

A, C, R = "actor_rollout_ref.actor", "critic", "actor_rollout_ref.rollout"

DATA = [
    honoured("data.tokenizer", "data.train_files", "data.val_files", "data.prompt_key", "data.reward_fn_key",
             "data.max_prompt_length", "data.max_response_length", "data.train_batch_size", "data.return_raw_chat",
             "data.return_full_prompt", "data.shuffle", "data.seed", "data.filter_overlong_prompts", "data.truncation",
             "data.apply_chat_template_kwargs.**"),
    note("data.val_batch_size", reason="deprecated in veRL; validation runs the whole validation set as one batch"),
    note("data.use_shm", "data.dataloader_num_workers", "data.filter_overlong_prompts_workers",
         reason=speed_only("shared-memory copies, loader/filter processes")),
    not_supported("data.train_max_samples", "data.val_max_samples", reason="limiting the number of rows is not implemented"),
    not_supported("data.gen_batch_size", reason="a generation batch of its own size is not implemented; "
                                                "algorithm.filter_groups refills in data.train_batch_size batches"),
    honoured("data.tool_config_path", reason="the tool schemas counted in the prompt length when "
                                             "data.filter_overlong_prompts is set (default: the rollout's tools)"),
    not_supported("data.function_tool_path", reason="veRL's @function_tool Python-function tools are not "
                                                    "implemented; declare the tool as a BaseTool class"),
    not_supported("data.return_raw_input_ids", reason="a reward model with its own tokenizer is not supported"),
    not_supported("data.validation_shuffle", reason="the validation set is read in file order"),
    honoured("data.trust_remote_code", reason="the tokenizer trusts remote code when this key or "
                                              "actor_rollout_ref.model.trust_remote_code is true"),
    not_supported("data.image_patch_size", "data.image_key", "data.video_key", "data.audio_key",
                  "data.mm_processor_kwargs.**", reason=VLM),
    note("data.return_multi_modal_inputs", reason="hybridflow reads text only and never returns multi-modal inputs"),
    honoured("data.custom_cls.path", "data.custom_cls.name",
             reason="a torch Dataset class from a Python file, built as veRL builds it (data_files, tokenizer, "
                    "processor, config)"),
    not_supported("data.sampler.**", "data.datagen.**",
                  reason="custom sampler and data-generator classes are not implemented"),
]

ACTOR = [
    honoured(f"{A}.strategy", values=("fsdp", "fsdp2", "ddp"), reason="hybridflow's training engines"),
    honoured(f"{A}.rollout_n", f"{A}.ppo_mini_batch_size", f"{A}.ppo_micro_batch_size", f"{A}.ppo_micro_batch_size_per_gpu",
             f"{A}.use_dynamic_bsz", f"{A}.ppo_max_token_len_per_gpu", f"{A}.clip_ratio", f"{A}.clip_ratio_low",
             f"{A}.clip_ratio_high", f"{A}.clip_ratio_c", f"{A}.policy_loss.loss_mode", f"{A}.loss_agg_mode",
             f"{A}.loss_scale_factor", f"{A}.entropy_coeff", f"{A}.use_kl_loss", f"{A}.kl_loss_coef", f"{A}.kl_loss_type",
             f"{A}.ppo_epochs", f"{A}.shuffle", f"{A}.data_loader_seed", f"{A}.use_remove_padding"),
    honoured(f"{A}.ulysses_sequence_parallel_size", reason=SP),
    not_supported(f"{A}.calculate_entropy", reason="entropy is computed when entropy_coeff != 0"),
    honoured(f"{A}.tau_pos", f"{A}.tau_neg", reason="read by policy_loss.loss_mode=sapo"),
    honoured(f"{A}.policy_loss.clip_cov_ratio", f"{A}.policy_loss.clip_cov_lb", f"{A}.policy_loss.clip_cov_ub",
             reason="read by policy_loss.loss_mode=clip_cov"),
    honoured(f"{A}.policy_loss.kl_cov_ratio", f"{A}.policy_loss.ppo_kl_coef", reason="read by policy_loss.loss_mode=kl_cov"),
    honoured(f"{A}.policy_loss.dro_beta", reason="read by policy_loss.loss_mode=dro (required there)"),
    honoured(f"{A}.calculate_sum_pi_squared",
             reason="the old log-prob pass also returns sum_pi_squared (needed by the optimal_token_baseline estimators)"),
    note(f"{A}.sum_pi_squared_checkpointing", reason=speed_only("recomputing sum_pi_squared in the backward pass")),
    honoured(f"{A}.use_prefix_grouper",
             reason="true requires the shared-prompt forward (each group's prompt once; padded forwards of an "
                    "unwrapped model) and fails naming what prevents it; false leaves it on where it applies"),
    not_supported(f"{A}.freeze_vision_tower", reason=VLM),
    not_supported(f"{A}.router_replay.**", "actor_rollout_ref.ref.router_replay.**",
                  reason="MoE router replay is not implemented"),
    not_supported(f"{A}.qat.**", reason="quantization-aware training is not implemented"),
    note(f"{A}.use_fused_kernels", f"{A}.use_torch_compile", f"{A}.entropy_from_logits_with_chunking",
         f"{A}.entropy_from_logits_chunk_size", f"{A}.entropy_checkpointing", f"{A}.pad_to_length",
         reason=speed_only("fused kernels, torch.compile, chunked entropy, padding buckets")),
    optimizer(f"{A}.optim"),
    fsdp_engine(f"{A}.fsdp_config"),
    checkpoint(f"{A}.checkpoint"),
    profiler(f"{A}.profiler"),
]

REF = [
    honoured("actor_rollout_ref.ref.strategy", values=("fsdp", "fsdp2", "ddp"), reason="hybridflow's training engines"),
    honoured("actor_rollout_ref.ref.rollout_n", "actor_rollout_ref.ref.log_prob_micro_batch_size",
             "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu", "actor_rollout_ref.ref.log_prob_use_dynamic_bsz",
             "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu"),
    honoured("actor_rollout_ref.ref.ulysses_sequence_parallel_size", reason=SP),
    note("actor_rollout_ref.ref.use_torch_compile", "actor_rollout_ref.ref.entropy_from_logits_with_chunking",
         "actor_rollout_ref.ref.entropy_from_logits_chunk_size", "actor_rollout_ref.ref.entropy_checkpointing",
         "actor_rollout_ref.ref.pad_to_length", reason=speed_only("torch.compile, chunked entropy, padding buckets")),
    fsdp_engine("actor_rollout_ref.ref.fsdp_config"),
    profiler("actor_rollout_ref.ref.profiler"),
]

POLICY = [
    honoured("actor_rollout_ref.hybrid_engine", values=(True,),
             reason="actor and rollout share their workers; separate pools are not implemented yet"),
    note("actor_rollout_ref.nccl_timeout", reason="hybridflow's process groups use torch.distributed's default timeout"),
    hf_model("actor_rollout_ref.model"),
    honoured("actor_rollout_ref.model.lora.merge",
             reason="how a LoRA policy reaches a vllm rollout: false (veRL's default) base weights once + the "
                    "adapter at every sync, true merged weights; the hf rollout always gets merged weights"),
    rollout(R),
]

CRITIC = [
    honoured(f"{C}.enable", f"{C}.rollout_n", f"{C}.ppo_mini_batch_size", f"{C}.ppo_micro_batch_size",
             f"{C}.ppo_micro_batch_size_per_gpu", f"{C}.use_dynamic_bsz", f"{C}.ppo_max_token_len_per_gpu",
             f"{C}.forward_max_token_len_per_gpu", f"{C}.forward_micro_batch_size", f"{C}.forward_micro_batch_size_per_gpu",
             f"{C}.ppo_epochs", f"{C}.shuffle", f"{C}.data_loader_seed", f"{C}.cliprange_value", f"{C}.loss_agg_mode",
             f"{C}.loss_scale_factor"),
    honoured(f"{C}.strategy", values=("fsdp", "fsdp2", "ddp"), reason="hybridflow's training engines"),
    honoured(f"{C}.ulysses_sequence_parallel_size", reason=SP),
    hf_model(f"{C}.model", tokenizer_path=True, lora=False, chat_template=False),
    optimizer(f"{C}.optim"),
    fsdp_engine(f"{C}.fsdp"),
    checkpoint(f"{C}.checkpoint"),
    profiler(f"{C}.profiler"),
]

REWARD = [
    honoured("reward.custom_reward_function.path", "reward.custom_reward_function.name",
             "reward.custom_reward_function.reward_kwargs.**", "reward.reward_manager.name",
             "reward.reward_model.enable", "reward.reward_model.model_path"),
    note("reward.num_workers", reason=speed_only("reward workers (the driver scores every batch)")),
    honoured("reward.reward_manager.source", values=("register",),
             reason="reward managers come from hybridflow's registry (hybridflow.rewards.register_reward_manager)"),
    not_supported("reward.reward_manager.module.**",
                  reason="loading a reward manager from a file is not implemented; register it by name instead"),
    not_supported("reward.reward_model.enable_resource_pool", "reward.reward_model.n_gpus_per_node",
                  "reward.reward_model.nnodes",
                  reason="a separate reward-model pool is not implemented; the reward model runs on the trainer's devices"),
    reward_model_rollout("reward.reward_model.rollout"),
    not_supported("reward.sandbox_fusion.**", reason="sandboxed code execution (Sandbox Fusion) is not implemented"),
    honoured("reward.reward_kwargs.**",
             reason="keyword arguments of the reward manager, e.g. dapo's max_resp_len and overlong_buffer_cfg, "
                    "genrm's template, template_path, parser, unparsable_score and chat_template"),
    # hybridflow's FSDP reward-model worker (veRL's earlier reward_model section; not aliases)
    honoured("reward_model.model.external_lib", "reward_model.model.trust_remote_code",
             "reward_model.micro_batch_size", "reward_model.micro_batch_size_per_gpu"),
    honoured("reward_model.model.input_tokenizer", values=(None,),
             reason="the reward model scores the policy's token ids as they are; re-templating for a reward model "
                    "with another tokenizer is not implemented"),
    honoured("reward_model.ulysses_sequence_parallel_size", values=(1,), reason=NO_SP),
    note("reward_model.strategy", "reward_model.model.fsdp_config.**", "reward_model.model.use_remove_padding",
         "reward_model.model.use_fused_kernels", "reward_model.model.use_shm", "reward_model.use_dynamic_bsz",
         "reward_model.forward_max_token_len_per_gpu", "reward_model.use_reward_loop",
         reason=speed_only("the reward model runs unsharded, in fixed micro-batches")),
    not_supported("reward_model.model.override_config.**", "reward_model.max_length",
                  reason="the reward-model worker does not implement it"),
    not_supported("reward_model.launch_reward_fn_async", reason="rewards are computed synchronously in the driver"),
    everything_under("reward_model.profiler", PROFILER),
]

ALGORITHM = [
    honoured("algorithm.gamma", "algorithm.lam", "algorithm.adv_estimator", "algorithm.norm_adv_by_std_in_grpo",
             "algorithm.use_kl_in_reward", "algorithm.kl_penalty", "algorithm.kl_ctrl.type", "algorithm.kl_ctrl.kl_coef",
             "algorithm.kl_ctrl.horizon", "algorithm.kl_ctrl.target_kl"),
    honoured("algorithm.gdpo_reward_keys", "algorithm.gdpo_reward_weights", reason="read by adv_estimator=gdpo"),
    honoured("algorithm.use_pf_ppo", "algorithm.pf_ppo.weight_pow"),
    honoured("algorithm.pf_ppo.reweight_method", values=("pow", "max_min", "max_random"),
             reason="veRL's PF-PPO reweighting methods"),
    honoured("algorithm.filter_groups.enable", "algorithm.filter_groups.metric",
             "algorithm.filter_groups.max_num_gen_batches", "algorithm.filter_groups.max_inflight_gen_batches"),
    honoured("algorithm.rollout_correction.rollout_is", "algorithm.rollout_correction.rollout_is_threshold",
             "algorithm.rollout_correction.rollout_rs", "algorithm.rollout_correction.rollout_rs_threshold",
             "algorithm.rollout_correction.bypass_mode", "algorithm.rollout_correction.loss_type",
             "algorithm.rollout_correction.rollout_is_batch_normalize"),
]

TRAINER = [
    trainer_device(),
    honoured("trainer.balance_batch", "trainer.total_epochs", "trainer.total_training_steps", "trainer.project_name",
             "trainer.experiment_name", "trainer.logger", "trainer.log_val_generations", "trainer.nnodes",
             "trainer.n_gpus_per_node", "trainer.save_freq", "trainer.resume_mode", "trainer.resume_from_path",
             "trainer.val_before_train", "trainer.test_freq", "trainer.critic_warmup", "trainer.default_local_dir",
             "trainer.max_actor_ckpt_to_keep", "trainer.max_critic_ckpt_to_keep", "trainer.backend",
             "trainer.watchdog_timeout"),
    honoured("trainer.rollout_data_dir", "trainer.validation_data_dir", "trainer.rollout_only"),
    not_supported("trainer.val_only", reason="a validation-only run is not implemented"),
    not_supported("trainer.default_hdfs_dir", "trainer.del_local_ckpt_after_load",
                  reason="copying checkpoints to HDFS is not implemented; they stay in trainer.default_local_dir"),
    not_supported("trainer.checkpoint_callback_class", reason="checkpoint callbacks are not implemented"),
    note("trainer.esi_redundant_time", reason="applies to Volcengine's elastic instances, which hybridflow does not use"),
    note("trainer.ray_wait_register_center_timeout", reason="hybridflow's workers do not wait on a register center"),
    note("trainer.use_v1", "trainer.use_legacy_worker_impl",
         reason="chooses between veRL's trainer/worker implementations; hybridflow has one of each"),
    honoured("trainer.v1.trainer_mode", values=("sync",), reason="asynchronous training modes are not implemented yet"),
    everything_under("trainer.v1", "asynchronous training modes are not implemented yet"),
]

RAY = [
    honoured("ray_kwargs.ray_init.num_cpus", "ray_kwargs.ray_init.address", "ray_kwargs.ray_init.include_dashboard"),
    everything_under("ray_kwargs.ray_init", "hybridflow passes only address, num_cpus and include_dashboard to ray.init"),
    not_supported("ray_kwargs.timeline_json_file", reason="writing a Ray timeline is not implemented"),
]

OTHER = [
    honoured("model_engine", values=("dp",), reason="FSDP2/DDP is hybridflow's only training backend"),
    # keys of veRL's Megatron tree, which users add with +
    not_supported(f"{A}.megatron.**", "actor_rollout_ref.ref.megatron.**", f"{C}.megatron.**", reason=MEGATRON),
    honoured("global_profiler.tool", values=(None, "torch"), reason=PROFILER_TOOLS),
    honoured("global_profiler.steps", "global_profiler.save_path", "global_profiler.profile_continuous_steps"),
    not_supported("global_profiler.relocate_results", "global_profiler.finish_hook_cmd",
                  "global_profiler.finish_hook_all_ranks", "global_profiler.finish_hook_ranks",
                  reason="traces are written in save_path directly; no finish hook runs"),
    everything_under("global_profiler.global_tool_config", "settings of the nsys, torch_memory and precision_debugger "
                                                           "tools, which hybridflow does not drive"),
    everything_under("distillation", "on-policy distillation is not implemented"),
    everything_under("transfer_queue", "the TransferQueue data plane is not implemented"),
    honoured("skip.rollout.enable", "skip.rollout.dump_dir", "skip.rollout.steps", "skip.rollout.action"),
    everything_under("skip", "replaying dumped rollouts is implemented for skip.rollout only"),
    # hybridflow's asynchronous training (veRL's fully_async_policy keys + the mode)
    honoured("async_training.mode", values=("sync", "one_step_off", "fully_async")),
    honoured("async_training.staleness_threshold", "async_training.trigger_parameter_sync_step",
             "async_training.require_batches", "async_training.partial_rollout",
             "async_training.use_rollout_log_probs"),
    targets(),
]

# Earlier spellings (legacy -> canonical), mapped once at load time. The longest legacy prefix wins.
ALIASES = (
    ("reward_model.enable", "reward.reward_model.enable"),
    ("reward_model.enable_resource_pool", "reward.reward_model.enable_resource_pool"),
    ("reward_model.n_gpus_per_node", "reward.reward_model.n_gpus_per_node"),
    ("reward_model.nnodes", "reward.reward_model.nnodes"),
    ("reward_model.model.path", "reward.reward_model.model_path"),
    ("reward_model.rollout", "reward.reward_model.rollout"),
    ("reward_model.num_workers", "reward.num_workers"),
    ("reward_model.reward_manager", "reward.reward_manager.name"),
    ("reward_model.reward_loop_source", "reward.reward_manager.source"),
    ("reward_model.reward_loop_module_path", "reward.reward_manager.module.path"),
    ("reward_model.reward_loop_class_name", "reward.reward_manager.module.name"),
    ("reward_model.reward_kwargs", "reward.reward_kwargs"),
    ("reward_model.sandbox_fusion", "reward.sandbox_fusion"),
    ("custom_reward_function", "reward.custom_reward_function"),
    ("sandbox_fusion", "reward.sandbox_fusion"),
    ("reward_manager", "reward.reward_manager"),
    ("ray_init", "ray_kwargs.ray_init"),
    ("ray_init.timeline_json_file", "ray_kwargs.timeline_json_file"),
    (f"{A}.grad_clip", f"{A}.optim.clip_grad"),
    (f"{A}.optim.warmup_style", f"{A}.optim.lr_scheduler_type"),
    (f"{C}.grad_clip", f"{C}.optim.clip_grad"),
    (f"{C}.optim.warmup_style", f"{C}.optim.lr_scheduler_type"),
    (f"{C}.model.fsdp_config", f"{C}.fsdp"),
    (f"{R}.skip_rollout", "skip.rollout.enable"),
    (f"{R}.skip_dump_dir", "skip.rollout.dump_dir"),
)

TABLE = KeyTable.build("ppo_trainer", DATA + ACTOR + REF + POLICY + CRITIC + REWARD + ALGORITHM + TRAINER + RAY + OTHER,
                       ALIASES)
