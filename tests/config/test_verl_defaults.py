"""A config class built by user code has veRL 0.9.1's dataclass defaults; the yaml (and so a run) keeps
veRL's yaml values at each place, where they differ (``placed``). Values from veRL 0.9.1's classes
(``python -m hybridflow.devtools.verl_parity --config-defaults`` lists what still differs)."""

from __future__ import annotations

from hybridflow.config import (
    AgentLoopConfig,
    AlgoConfig,
    FilterGroupsConfig,
    FSDPEngineConfig,
    FSDPOptimizerConfig,
    OptimizerConfig,
    PPOTrainerConfig,
    PrometheusConfig,
    RolloutConfig,
    RolloutCorrectionConfig,
    SamplingConfig,
    TraceConfig,
    omega_conf_to_dataclass,
)


def test_classes_have_verls_dataclass_defaults():
    assert (OptimizerConfig().lr, FSDPOptimizerConfig().min_lr_ratio) == (1e-3, None)
    assert (SamplingConfig().temperature, SamplingConfig().do_sample) == (1.0, True)
    assert AgentLoopConfig().num_workers == 8
    assert (TraceConfig().project_name, TraceConfig().experiment_name) == (None, None)
    assert PrometheusConfig().served_model_name is None
    assert FilterGroupsConfig().metric is None
    engine = FSDPEngineConfig()
    assert (engine.wrap_policy, engine.use_no_sync_for_gradient_accumulation, engine.turbo_config) == ({}, True, {})
    assert RolloutCorrectionConfig().rollout_is == "sequence"
    algo = AlgoConfig()  # nested sections stay unset unless configured
    assert (algo.rollout_correction, algo.filter_groups, algo.pf_ppo) == (None, None, None)
    assert omega_conf_to_dataclass({"pf_ppo": {"weight_pow": 3.0}}, AlgoConfig).pf_ppo.weight_pow == 3.0
    assert engine.mixed_precision is None and OptimizerConfig().betas == (0.9, 0.999)
    r = RolloutConfig()
    assert (r.name, r.n_gpus_per_node, r.dtype, r.tensor_model_parallel_size, r.max_num_seqs) == (
        "???",
        8,
        "bfloat16",
        2,
        1024,
    )
    assert (r.engine_kwargs, r.calculate_log_probs, r.profiler, r.qat) == ({}, False, None, None)
    assert (r.repetition_penalty, r.enable_sleep_mode, r.server.timeout, r.disaggregation.mooncake_protocol) == (
        1.0,
        True,
        60.0,
        "nvlink",
    )


def test_the_tree_keeps_the_yamls_values_at_their_places():
    tree = PPOTrainerConfig()
    actor, rollout = tree.actor_rollout_ref.actor, tree.actor_rollout_ref.rollout
    assert (actor.optim.lr, actor.optim.min_lr_ratio) == (1e-6, 0.0)
    assert (tree.critic.optim.lr, tree.critic.optim.min_lr_ratio) == (1e-5, 0.0)
    for engine in (actor.fsdp_config, tree.actor_rollout_ref.ref.fsdp_config, tree.critic.fsdp):
        assert engine.wrap_policy == {"min_num_params": 0} and engine.use_no_sync_for_gradient_accumulation is False
    assert tree.actor_rollout_ref.ref.fsdp_config.forward_only is True
    assert (rollout.val_kwargs.temperature, rollout.val_kwargs.do_sample) == (0.0, False)
    assert rollout.agent.num_workers == 2 and rollout.trace.project_name == "hybridflow_examples"
    algo = tree.algorithm
    assert algo.rollout_correction.rollout_is is None and algo.filter_groups.metric == "reward"
    assert algo.pf_ppo.reweight_method == "pow"
    assert (rollout.name, rollout.dtype, rollout.tensor_model_parallel_size, rollout.max_num_seqs) == (
        "hf",
        "auto",
        1,
        256,
    )
    assert rollout.calculate_log_probs is True and rollout.profiler is not None and rollout.qat is not None
    assert actor.fsdp_config.mixed_precision.param_dtype == "auto"
    # a door reading a partial rollout section (veRL's HFRollout, the agent loop) fills it from the yaml's values
    from hybridflow.config.convert import as_section
    from hybridflow.config.rollout import rollout_as_in_yaml

    door = as_section({"prompt_length": 8}, RolloutConfig, "actor_rollout_ref.rollout", rollout_as_in_yaml)
    assert (door.prompt_length, door.name, door.calculate_log_probs) == (8, "hf", True)
    assert as_section({"prompt_length": 8}, RolloutConfig).name == "???"
