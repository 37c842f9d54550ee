"""Earlier spellings of config keys (legacy -> canonical), mapped once at load time; the longest
legacy prefix that matches a key wins. The legacy keys stay in the yaml (veRL's trees hold them), so
both spellings compose."""

from __future__ import annotations

__all__ = ["PPO_TRAINER", "GENERATION", "EVALUATION", "SFT_TRAINER"]

_A, _C, _R = "actor_rollout_ref.actor", "critic", "actor_rollout_ref.rollout"
_RAY_INIT = (("ray_init", "ray_kwargs.ray_init"), ("ray_init.timeline_json_file", "ray_kwargs.timeline_json_file"))

PPO_TRAINER = (
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
    *_RAY_INIT,
    (f"{_A}.grad_clip", f"{_A}.optim.clip_grad"),
    (f"{_A}.optim.warmup_style", f"{_A}.optim.lr_scheduler_type"),
    (f"{_C}.grad_clip", f"{_C}.optim.clip_grad"),
    (f"{_C}.optim.warmup_style", f"{_C}.optim.lr_scheduler_type"),
    (f"{_C}.model.fsdp_config", f"{_C}.fsdp"),
    (f"{_R}.skip_rollout", "skip.rollout.enable"),
    (f"{_R}.skip_dump_dir", "skip.rollout.dump_dir"),
)

GENERATION = _RAY_INIT
EVALUATION = _RAY_INIT

SFT_TRAINER = (
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
