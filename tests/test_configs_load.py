"""Every yaml in configs/ loads, keeps veRL's key names, and is found where setup.py installs it."""

from pathlib import Path

import pytest
from omegaconf import DictConfig, OmegaConf

from hybridflow.config import loader as config_mod
from hybridflow.config.loader import available_configs, config_dir, load_config

REPO_CONFIGS = Path(__file__).resolve().parents[1] / "configs"

# veRL key paths a ported command line may touch (a rename here breaks users' scripts).
PPO_KEYS = """
data.tokenizer data.train_files data.val_files data.prompt_key data.reward_fn_key data.max_prompt_length
data.max_response_length data.train_batch_size data.val_batch_size data.return_raw_input_ids data.return_raw_chat
data.return_full_prompt data.shuffle data.seed data.filter_overlong_prompts data.filter_overlong_prompts_workers
data.truncation data.dataloader_num_workers data.custom_cls.path data.custom_cls.name
actor_rollout_ref.hybrid_engine actor_rollout_ref.model.path actor_rollout_ref.model.external_lib
actor_rollout_ref.model.override_config actor_rollout_ref.model.enable_gradient_checkpointing
actor_rollout_ref.model.use_remove_padding actor_rollout_ref.model.lora_rank actor_rollout_ref.model.lora_alpha
actor_rollout_ref.model.target_modules actor_rollout_ref.model.trust_remote_code actor_rollout_ref.model.use_shm
actor_rollout_ref.model.enable_activation_offload actor_rollout_ref.model.use_liger
actor_rollout_ref.actor.strategy actor_rollout_ref.actor.ppo_mini_batch_size
actor_rollout_ref.actor.ppo_micro_batch_size
actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu actor_rollout_ref.actor.use_dynamic_bsz
actor_rollout_ref.actor.ppo_max_token_len_per_gpu actor_rollout_ref.actor.grad_clip actor_rollout_ref.actor.clip_ratio
actor_rollout_ref.actor.clip_ratio_low actor_rollout_ref.actor.clip_ratio_high actor_rollout_ref.actor.clip_ratio_c
actor_rollout_ref.actor.loss_agg_mode actor_rollout_ref.actor.entropy_coeff actor_rollout_ref.actor.use_kl_loss
actor_rollout_ref.actor.use_torch_compile actor_rollout_ref.actor.kl_loss_coef actor_rollout_ref.actor.kl_loss_type
actor_rollout_ref.actor.ppo_epochs actor_rollout_ref.actor.shuffle
actor_rollout_ref.actor.ulysses_sequence_parallel_size
actor_rollout_ref.actor.policy_loss.loss_mode actor_rollout_ref.actor.checkpoint.save_contents
actor_rollout_ref.actor.checkpoint.load_contents actor_rollout_ref.actor.optim.lr
actor_rollout_ref.actor.optim.lr_warmup_steps
actor_rollout_ref.actor.optim.lr_warmup_steps_ratio actor_rollout_ref.actor.optim.min_lr_ratio
actor_rollout_ref.actor.optim.num_cycles actor_rollout_ref.actor.optim.warmup_style
actor_rollout_ref.actor.optim.total_training_steps actor_rollout_ref.actor.optim.weight_decay
actor_rollout_ref.actor.optim.betas
actor_rollout_ref.actor.fsdp_config.param_offload actor_rollout_ref.actor.fsdp_config.optimizer_offload
actor_rollout_ref.actor.fsdp_config.offload_policy actor_rollout_ref.actor.fsdp_config.reshard_after_forward
actor_rollout_ref.actor.fsdp_config.fsdp_size actor_rollout_ref.actor.fsdp_config.wrap_policy
actor_rollout_ref.ref.fsdp_config actor_rollout_ref.ref.log_prob_micro_batch_size
actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu actor_rollout_ref.ref.log_prob_use_dynamic_bsz
actor_rollout_ref.ref.log_prob_max_token_len_per_gpu actor_rollout_ref.ref.ulysses_sequence_parallel_size
actor_rollout_ref.rollout.name actor_rollout_ref.rollout.mode actor_rollout_ref.rollout.temperature
actor_rollout_ref.rollout.top_k actor_rollout_ref.rollout.top_p actor_rollout_ref.rollout.prompt_length
actor_rollout_ref.rollout.response_length actor_rollout_ref.rollout.dtype
actor_rollout_ref.rollout.gpu_memory_utilization
actor_rollout_ref.rollout.ignore_eos actor_rollout_ref.rollout.enforce_eager actor_rollout_ref.rollout.free_cache_engine
actor_rollout_ref.rollout.load_format actor_rollout_ref.rollout.tensor_model_parallel_size
actor_rollout_ref.rollout.max_num_batched_tokens actor_rollout_ref.rollout.max_model_len
actor_rollout_ref.rollout.max_num_seqs
actor_rollout_ref.rollout.log_prob_micro_batch_size actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu
actor_rollout_ref.rollout.log_prob_use_dynamic_bsz actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu
actor_rollout_ref.rollout.disable_log_stats actor_rollout_ref.rollout.do_sample actor_rollout_ref.rollout.n
actor_rollout_ref.rollout.engine_kwargs actor_rollout_ref.rollout.val_kwargs.top_k
actor_rollout_ref.rollout.val_kwargs.top_p
actor_rollout_ref.rollout.val_kwargs.temperature actor_rollout_ref.rollout.val_kwargs.n
actor_rollout_ref.rollout.val_kwargs.do_sample actor_rollout_ref.rollout.multi_turn.enable
actor_rollout_ref.rollout.multi_turn.max_assistant_turns actor_rollout_ref.rollout.multi_turn.max_user_turns
actor_rollout_ref.rollout.multi_turn.max_parallel_calls actor_rollout_ref.rollout.multi_turn.max_tool_response_length
actor_rollout_ref.rollout.multi_turn.tool_response_truncate_side actor_rollout_ref.rollout.multi_turn.tool_config_path
actor_rollout_ref.rollout.multi_turn.interaction_config_path actor_rollout_ref.rollout.multi_turn.format
actor_rollout_ref.rollout.multi_turn.use_inference_chat_template
actor_rollout_ref.rollout.multi_turn.tokenization_sanity_check_mode actor_rollout_ref.rollout.agent.num_workers
actor_rollout_ref.rollout.agent.default_agent_loop actor_rollout_ref.rollout.agent.agent_loop_config_path
data.tool_config_path data.apply_chat_template_kwargs
actor_rollout_ref.rollout.calculate_log_probs
critic.strategy critic.optim.lr critic.model.path critic.model.tokenizer_path critic.model.override_config
critic.model.external_lib critic.model.enable_gradient_checkpointing critic.model.use_remove_padding
critic.model.fsdp_config
critic.ppo_mini_batch_size critic.ppo_micro_batch_size critic.ppo_micro_batch_size_per_gpu
critic.forward_micro_batch_size
critic.forward_micro_batch_size_per_gpu critic.use_dynamic_bsz critic.ppo_max_token_len_per_gpu
critic.forward_max_token_len_per_gpu critic.ulysses_sequence_parallel_size critic.ppo_epochs critic.shuffle
critic.grad_clip
critic.cliprange_value critic.loss_agg_mode critic.checkpoint.save_contents
reward_model.enable reward_model.strategy reward_model.model.input_tokenizer reward_model.model.path
reward_model.model.external_lib reward_model.model.use_remove_padding reward_model.model.fsdp_config
reward_model.micro_batch_size reward_model.micro_batch_size_per_gpu reward_model.max_length
reward_model.ulysses_sequence_parallel_size reward_model.use_dynamic_bsz reward_model.forward_max_token_len_per_gpu
reward_model.reward_manager reward_model.launch_reward_fn_async reward_model.sandbox_fusion
custom_reward_function.path custom_reward_function.name custom_reward_function.reward_kwargs
algorithm.gamma algorithm.lam algorithm.adv_estimator algorithm.norm_adv_by_std_in_grpo algorithm.use_kl_in_reward
algorithm.kl_penalty algorithm.kl_ctrl.type algorithm.kl_ctrl.kl_coef algorithm.kl_ctrl.horizon
algorithm.kl_ctrl.target_kl
algorithm.use_pf_ppo algorithm.pf_ppo
trainer.balance_batch trainer.total_epochs trainer.total_training_steps trainer.project_name trainer.experiment_name
trainer.logger trainer.log_val_generations trainer.rollout_data_dir trainer.validation_data_dir trainer.nnodes
trainer.n_gpus_per_node trainer.save_freq trainer.resume_mode trainer.resume_from_path trainer.val_before_train
trainer.test_freq trainer.critic_warmup trainer.default_hdfs_dir trainer.del_local_ckpt_after_load
trainer.default_local_dir trainer.max_actor_ckpt_to_keep trainer.max_critic_ckpt_to_keep
trainer.ray_wait_register_center_timeout trainer.device trainer.backend trainer.watchdog_timeout
skip.rollout.enable skip.rollout.dump_dir skip.rollout.steps skip.rollout.action
ray_init.num_cpus ray_init.timeline_json_file
""".split()

SFT_KEYS = """
data.train_batch_size data.micro_batch_size data.micro_batch_size_per_gpu data.train_files data.val_files
data.prompt_key
data.response_key data.prompt_dict_keys data.response_dict_keys data.multiturn.enable data.multiturn.messages_key
data.multiturn.tools_key data.max_length data.truncation
data.balance_dp_token data.chat_template data.custom_cls data.use_shm model.partial_pretrain model.strategy
model.fsdp_config model.external_lib model.enable_gradient_checkpointing model.trust_remote_code model.lora_rank
model.lora_alpha model.target_modules model.use_liger optim.lr optim.betas optim.weight_decay optim.warmup_steps_ratio
optim.clip_grad optim.lr_scheduler ulysses_sequence_parallel_size use_remove_padding trainer.default_local_dir
trainer.default_hdfs_dir trainer.resume_path trainer.project_name trainer.experiment_name trainer.total_epochs
trainer.total_training_steps trainer.logger trainer.seed trainer.save_freq trainer.test_freq trainer.nnodes
trainer.n_gpus_per_node trainer.max_ckpt_to_keep trainer.device
""".split()

GENERATION_KEYS = """
trainer.nnodes trainer.n_gpus_per_node trainer.device trainer.backend data.path data.prompt_key data.n_samples
data.output_path data.batch_size model.path model.external_lib rollout.name rollout.temperature rollout.top_k
rollout.top_p
rollout.prompt_length rollout.response_length rollout.dtype rollout.tensor_model_parallel_size rollout.do_sample
rollout.n
ray_init.num_cpus
""".split()

EVALUATION_KEYS = """
data.path data.prompt_key data.response_key data.data_source_key data.reward_model_key custom_reward_function.path
custom_reward_function.name ray_init.num_cpus ray_init.timeline_json_file
""".split()


def test_the_four_configs_are_shipped():
    assert {"ppo_trainer", "generation", "evaluation", "sft_trainer"} <= set(available_configs())
    assert config_dir().resolve() == REPO_CONFIGS.resolve()


@pytest.mark.parametrize("name", available_configs(REPO_CONFIGS))
def test_every_yaml_loads_without_overrides(name):
    cfg = load_config(name, [])
    assert isinstance(cfg, DictConfig)
    assert OmegaConf.is_readonly(cfg)
    # resolved: no interpolation string survives
    assert "${" not in OmegaConf.to_yaml(cfg)


@pytest.mark.parametrize(
    "name,keys",
    [
        ("ppo_trainer", PPO_KEYS),
        ("sft_trainer", SFT_KEYS),
        ("generation", GENERATION_KEYS),
        ("evaluation", EVALUATION_KEYS),
    ],
)
def test_verl_key_names_are_present(name, keys):
    cfg = load_config(name, [])
    missing = [k for k in keys if OmegaConf.select(cfg, k, default="<missing>") == "<missing>"]
    assert missing == []


def test_ppo_top_level_sections_are_verls():
    cfg = load_config("ppo_trainer", [])
    # veRL 0.9.1's sections, then the earlier spellings it still accepts (mapped onto reward / ray_kwargs)
    assert set(cfg) == {
        "data",
        "actor_rollout_ref",
        "critic",
        "reward",
        "algorithm",
        "trainer",
        "ray_kwargs",
        "global_profiler",
        "distillation",
        "transfer_queue",
        "skip",
        "model_engine",
        "async_training",
        "reward_model",
        "custom_reward_function",
        "sandbox_fusion",
        "reward_manager",
        "ray_init",
    }


def test_cpu_friendly_defaults():
    cfg = load_config("ppo_trainer", [])
    assert cfg.trainer.device == "auto" and cfg.trainer.backend == "ray"
    assert cfg.trainer.n_gpus_per_node == 1 and cfg.actor_rollout_ref.rollout.name == "hf"
    assert list(cfg.trainer.logger) == ["console"]  # no default reaches the network
    # interpolations resolved to veRL's links
    assert cfg.actor_rollout_ref.rollout.prompt_length == cfg.data.max_prompt_length == 512
    assert cfg.critic.ppo_mini_batch_size == cfg.actor_rollout_ref.actor.ppo_mini_batch_size == 256


def test_config_dir_is_the_source_checkout_of_the_imported_code():
    # An editable install, a worktree or a checkout on PYTHONPATH must read the yaml next to the code
    # that runs (package data of an editable install may point at another checkout).
    assert config_mod.config_dir().resolve() == (Path(config_mod.__file__).resolve().parents[2] / "configs")


def test_config_dir_uses_package_data_without_a_source_tree(tmp_path, monkeypatch):
    # After a non-editable install there is no configs/ above the package: the yaml files live in the
    # package `hybridflow.configs`.
    (tmp_path / "ppo_trainer.yaml").write_text("trainer:\n  nnodes: 3\n")

    class FakeFiles:
        def joinpath(self, child):
            return tmp_path / child

    real_files = config_mod.importlib.resources.files
    fake = lambda pkg: FakeFiles() if pkg == "hybridflow.configs" else real_files(pkg)  # noqa: E731
    monkeypatch.setattr(config_mod.importlib.resources, "files", fake)
    monkeypatch.setattr(config_mod, "__file__", str(tmp_path / "site-packages" / "hybridflow" / "utils" / "config.py"))
    assert config_mod.config_dir() == tmp_path


def test_config_dir_falls_back_to_the_source_tree(monkeypatch):
    real_files = config_mod.importlib.resources.files

    def missing(pkg):
        if pkg == "hybridflow.configs":
            raise ModuleNotFoundError(pkg)
        return real_files(pkg)

    monkeypatch.setattr(config_mod.importlib.resources, "files", missing)
    assert config_mod.config_dir().resolve() == REPO_CONFIGS.resolve()
