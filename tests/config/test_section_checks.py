"""What the sections check when they are built (and in ``validate``), each error naming its key."""

from __future__ import annotations

import math

import pytest

from hybridflow.config import (
    ConfigError,
    CriticModelConfig,
    FilterGroupsConfig,
    FSDPActorConfig,
    FSDPCriticConfig,
    FSDPEngineConfig,
    FSDPOptimizerConfig,
    HFModelConfig,
    KLControlConfig,
    MultiTurnConfig,
    RolloutCorrectionConfig,
    omega_conf_to_dataclass,
)
from hybridflow.config.base import part_of_tree


def test_lr_scheduler_type_and_its_deprecated_alias():
    assert FSDPOptimizerConfig().lr_scheduler_type == "constant"
    assert FSDPOptimizerConfig(lr_scheduler_type="cosine", num_cycles=1.0, min_lr_ratio=0.1).num_cycles == 1.0
    with pytest.warns(DeprecationWarning, match="warmup_style"):
        old = FSDPOptimizerConfig(warmup_style="cosine")
    assert old.lr_scheduler_type == "cosine"
    # a loaded config holds both spellings with the same value: no warning, no conflict
    assert FSDPOptimizerConfig(warmup_style="cosine", lr_scheduler_type="cosine").lr_scheduler_type == "cosine"
    with pytest.warns(DeprecationWarning, match="warmup_style"):  # veRL: the deprecated spelling wins
        assert FSDPOptimizerConfig(warmup_style="constant", lr_scheduler_type="cosine").lr_scheduler_type == "constant"
    with pytest.raises(ConfigError, match="optim.warmup_style='linear'"):
        FSDPOptimizerConfig(warmup_style="linear")
    with pytest.raises(ConfigError, match="optim.lr_scheduler_type='step' is not one of constant, cosine"):
        FSDPOptimizerConfig(lr_scheduler_type="step")
    with pytest.warns(DeprecationWarning, match="grad_clip"):  # veRL's deprecated spelling replaces clip_grad
        assert FSDPOptimizerConfig(grad_clip=0.5).clip_grad == 0.5
    assert (FSDPOptimizerConfig().lr, FSDPOptimizerConfig().min_lr_ratio) == (1e-3, None)  # veRL's defaults
    assert FSDPOptimizerConfig(min_lr_ratio=1.5).min_lr_ratio == 1.5  # veRL checks it when the schedule is built
    with pytest.raises(ConfigError, match=r"optim.min_lr_ratio must be in \[0, 1\]"):
        omega_conf_to_dataclass({"min_lr_ratio": 1.5}, FSDPOptimizerConfig)


def test_actor_micro_batch_rules_and_validate():
    with pytest.raises(
        ConfigError,
        match=r"\[actor\] You have set both 'actor.ppo_micro_batch_size' AND 'actor.ppo_micro_batch_size_per_gpu'"
        r".*\(actor_rollout_ref.actor.ppo_micro_batch_size=8, actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2\)",
    ):
        FSDPActorConfig(ppo_micro_batch_size=8, ppo_micro_batch_size_per_gpu=2)
    # veRL asserts a micro-batch size (or dynamic batching) when the section is built alone
    with pytest.raises(AssertionError, match=r"\[actor\] Please set at least one of 'actor.ppo_micro_batch_size'"):
        FSDPActorConfig(ppo_mini_batch_size=16)
    with pytest.raises(ConfigError, match=r"\[critic\] Please set at least one of 'critic.micro_batch_size' or"):
        FSDPCriticConfig()
    FSDPActorConfig(use_dynamic_bsz=True)
    with part_of_tree():  # inside a config tree the rule waits for validate, which names the full keys
        unset = FSDPActorConfig(ppo_mini_batch_size=16)
        FSDPCriticConfig()
    with pytest.raises(ConfigError, match="set actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu"):
        unset.validate(1, 64)
    with pytest.raises(ValueError, match="Invalid loss_agg_mode: seq-sum"):
        FSDPActorConfig(ppo_micro_batch_size_per_gpu=2, loss_agg_mode="seq-sum")
    FSDPActorConfig(ppo_micro_batch_size=8, ppo_micro_batch_size_per_gpu=2, use_dynamic_bsz=True)  # token budget rules
    actor = FSDPActorConfig(ppo_mini_batch_size=64, ppo_micro_batch_size=16)
    notes = actor.validate(n_gpus=8, train_batch_size=128)
    assert notes == [
        "actor_rollout_ref.actor.ppo_micro_batch_size is deprecated: set "
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu = ppo_micro_batch_size / data-parallel size"
    ]
    with pytest.raises(
        ConfigError,
        match=r"data.train_batch_size \(32\) must be >= "
        r"actor_rollout_ref.actor.ppo_mini_batch_size \(64\)",
    ):
        actor.validate(n_gpus=8, train_batch_size=32)
    with pytest.raises(
        ConfigError,
        match=r"ppo_micro_batch_size \(16\) x ulysses_sequence_parallel_size \(1\) must be "
        r">= the number of devices \(32\)",
    ):
        actor.validate(n_gpus=32, train_batch_size=128)
    # 64 samples on one rank do not split into micro-batches of 24
    with pytest.raises(
        ConfigError,
        match=r"actor_rollout_ref.actor.ppo_mini_batch_size \(64\) \* rollout.n \(1\) / 1 "
        r"data-parallel ranks = 64 samples per rank is not divisible by "
        r"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu \(24\)",
    ):
        FSDPActorConfig(ppo_mini_batch_size=64, ppo_micro_batch_size=24).validate(n_gpus=1, train_batch_size=64)
    with pytest.raises(ConfigError, match="actor.strategy='deepspeed' is not one of fsdp, fsdp2, ddp"):
        FSDPActorConfig(strategy="deepspeed")


def test_actor_validate_cross_key_rules_name_the_keys():
    # 16 prompts x n=3 = 48 samples over 8 ranks = 6 per rank, 6 % 4 != 0
    actor = FSDPActorConfig(ppo_mini_batch_size=16, ppo_micro_batch_size_per_gpu=4, rollout_n=3)
    with pytest.raises(
        ConfigError,
        match=r"= 6 samples per rank is not divisible by "
        r"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu \(4\)",
    ):
        actor.validate(8, 64)
    assert actor.validate(4, 64) == []  # 12 per rank
    with pytest.raises(
        ConfigError,
        match=r"actor_rollout_ref.actor.ppo_mini_batch_size \(16\) \* rollout.n \(3\) = 48 "
        r"samples per optimizer step do not split evenly over 5 data-parallel ranks",
    ):
        actor.validate(5, 64)
    # Ulysses: the SP size divides the world, needs remove-padding; the token budget holds a sequence x SP
    sp = FSDPActorConfig(
        ppo_mini_batch_size=16,
        use_dynamic_bsz=True,
        ppo_max_token_len_per_gpu=100,
        fsdp_config=FSDPEngineConfig(ulysses_sequence_parallel_size=2),
    )
    assert sp.sp_size == 2
    assert sp.validate(4, 64, {"use_remove_padding": True}, max_sequence_length=200) == []
    with pytest.raises(ConfigError) as e:
        sp.validate(3, 64, {"use_remove_padding": False}, max_sequence_length=201)
    lines = str(e.value).splitlines()  # every problem, one a line
    assert lines == [
        "world size 3 is not divisible by actor_rollout_ref.actor.ulysses_sequence_parallel_size (2)",
        "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2 needs "
        "actor_rollout_ref.model.use_remove_padding=True",
    ]
    with pytest.raises(
        ConfigError,
        match=r"actor_rollout_ref.actor.ppo_max_token_len_per_gpu \(100\) \* "
        r"ulysses_sequence_parallel_size \(2\) is smaller than one sequence: .* = 201",
    ):
        sp.validate(4, 64, {"use_remove_padding": True}, max_sequence_length=201)
    # the deprecated top-level spelling wins when > 1, as veRL 0.9.1 reads it
    assert (
        FSDPActorConfig(
            ulysses_sequence_parallel_size=4,
            ppo_micro_batch_size_per_gpu=1,
            fsdp_config=FSDPEngineConfig(ulysses_sequence_parallel_size=2),
        ).sp_size
        == 4
    )


def test_per_rank_sizes_are_a_copy():
    actor = FSDPActorConfig(ppo_mini_batch_size=6, ppo_micro_batch_size=8, rollout_n=4)
    ranked = actor.per_rank(4)
    assert (ranked.ppo_mini_batch_size, ranked.ppo_micro_batch_size_per_gpu) == (6, 2)  # 6 x 4 / 4, 8 / 4
    assert actor.ppo_mini_batch_size == 6 and actor.ppo_micro_batch_size_per_gpu is None
    assert actor.per_rank(2, rollout_n=1).ppo_mini_batch_size == 3
    with pytest.raises(ConfigError, match=r"ppo_mini_batch_size \(6\) \* rollout.n \(4\) = 24 samples .* over 5"):
        actor.per_rank(5)
    critic = FSDPCriticConfig(ppo_mini_batch_size=8, ppo_micro_batch_size_per_gpu=2, rollout_n=2)
    ranked = critic.per_rank(2)
    # the value pass falls back to the update's micro-batch
    assert (ranked.ppo_mini_batch_size, ranked.forward_micro_batch_size_per_gpu) == (8, 2)
    ranked = FSDPCriticConfig(ppo_mini_batch_size=8, ppo_micro_batch_size=4, forward_micro_batch_size=6).per_rank(2)
    assert (ranked.ppo_micro_batch_size_per_gpu, ranked.forward_micro_batch_size_per_gpu) == (2, 3)


def test_ref_validate():
    from hybridflow.config import RefConfig

    assert RefConfig(log_prob_micro_batch_size_per_gpu=4).validate(2) == []
    with pytest.raises(ConfigError, match="set actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu"):
        RefConfig().validate(2)
    with pytest.raises(
        ConfigError,
        match=r"actor_rollout_ref.ref.log_prob_micro_batch_size \(6\) is not divisible by "
        r"the data-parallel size \(4\)",
    ):
        RefConfig(log_prob_micro_batch_size=6).validate(4)
    with pytest.raises(ConfigError, match="actor_rollout_ref.ref.ulysses_sequence_parallel_size=2 needs"):
        RefConfig(log_prob_micro_batch_size_per_gpu=4, ulysses_sequence_parallel_size=2).validate(
            2, model_config={"use_remove_padding": False}
        )


def test_critic_validate():
    critic = FSDPCriticConfig(ppo_mini_batch_size=32, ppo_micro_batch_size=4)
    critic.validate(n_gpus=4, train_batch_size=32)
    with pytest.raises(ConfigError, match=r"critic.ppo_mini_batch_size \(32\)"):
        critic.validate(n_gpus=4, train_batch_size=16)
    with pytest.raises(ConfigError, match=r"critic.ppo_micro_batch_size \(4\) x"):
        critic.validate(n_gpus=8, train_batch_size=32)
    with pytest.raises(
        ConfigError,
        match=r"critic.ulysses_sequence_parallel_size=2 needs "
        r"critic.model.use_remove_padding=True",
    ):
        FSDPCriticConfig(
            ppo_mini_batch_size=32,
            ppo_micro_batch_size_per_gpu=4,
            fsdp=FSDPEngineConfig(ulysses_sequence_parallel_size=2),
            model=CriticModelConfig(use_remove_padding=False),
        ).validate(2, 32)
    with pytest.raises(ConfigError, match=r"critic.forward_max_token_len_per_gpu \(50\)"):
        FSDPCriticConfig(
            ppo_mini_batch_size=32,
            use_dynamic_bsz=True,
            ppo_max_token_len_per_gpu=100,
            forward_max_token_len_per_gpu=50,
        ).validate(1, 32, max_sequence_length=80)


@pytest.mark.parametrize(
    "cls, kwargs, message",
    [
        (KLControlConfig, {"type": "pid"}, "algorithm.kl_ctrl.type='pid'"),
        (FilterGroupsConfig, {"enable": True, "metric": ""}, "algorithm.filter_groups.metric must name"),
        (
            MultiTurnConfig,
            {"tokenization_sanity_check_mode": "loose"},
            "multi_turn.tokenization_sanity_check_mode='loose' is not one of strict",
        ),
        (MultiTurnConfig, {"max_parallel_calls": 0}, "multi_turn.max_parallel_calls must be >= 1"),
    ],
)
def test_small_checks_name_their_key_when_a_yaml_is_read(cls, kwargs, message):
    """veRL builds these sections without checking them; hybridflow checks them as it reads a yaml."""
    assert cls(**kwargs) is not None
    with pytest.raises(ConfigError, match=message):
        omega_conf_to_dataclass(kwargs, cls)


def test_model_keys_are_checked_when_built():
    with pytest.raises(ConfigError, match="model.target_modules must be a string or a list of strings"):
        HFModelConfig(target_modules=3)


class TestRolloutCorrection:
    def test_thresholds_are_parsed(self):
        assert RolloutCorrectionConfig(rollout_is="token", rollout_is_threshold=2.0).is_bounds == (2.0, None)
        assert RolloutCorrectionConfig(rollout_is="token", rollout_is_threshold="0.5_5.0").is_bounds == (5.0, 0.5)
        (opt,) = RolloutCorrectionConfig(rollout_rs="seq_mean_k1", rollout_rs_threshold=2.0).rejection
        # a single k1 bound u means ratios in [1/u, u], kept in log space: [-log 2, log 2]
        assert (
            opt.aggregation == "mean" and math.isclose(opt.upper, math.log(2)) and math.isclose(opt.lower, -math.log(2))
        )
        k1, k3 = RolloutCorrectionConfig(
            rollout_rs="token_k1,seq_max_k3", rollout_rs_threshold="0.8_1.25,0.02"
        ).rejection
        assert (k1.level, k3.level, k3.upper, k3.lower) == ("token", "sequence", 0.02, None)

    def test_option_aliases_and_duplicates_are_normalised(self):
        rc = RolloutCorrectionConfig(rollout_rs=" token, geometric ,token_k1,sequence", rollout_rs_threshold=2.0)
        assert rc.rollout_rs == "token_k1,seq_mean_k1,seq_sum_k1"
        assert (
            RolloutCorrectionConfig(rollout_rs=["seq_mean_k3", "seq_mean_k3"], rollout_rs_threshold=0.1).rollout_rs
            == "seq_mean_k3"
        )

    @pytest.mark.parametrize(
        "kwargs, message",
        [
            (
                {"rollout_is": "batch"},
                "algorithm.rollout_correction.rollout_is='batch' is not one of null, token, sequence",
            ),
            (
                {"rollout_is": "token", "rollout_is_threshold": None},
                "needs algorithm.rollout_correction.rollout_is_threshold",
            ),
            ({"rollout_is": "token", "rollout_is_threshold": "5_0.5"}, "the lower bound exceeds the upper bound"),
            ({"rollout_is": "token", "rollout_is_threshold": -1.0}, "upper bound must be positive"),
            ({"rollout_rs": "token_k4", "rollout_rs_threshold": 1.0}, "unknown option 'token_k4'"),
            ({"rollout_rs": "seq_mean_k3"}, "needs algorithm.rollout_correction.rollout_rs_threshold"),
            ({"rollout_rs": "seq_mean_k3", "rollout_rs_threshold": "0.1_0.2"}, "takes a single upper bound"),
            ({"rollout_rs": "token_k1,token_k2", "rollout_rs_threshold": "1,2,3"}, "exactly one per option"),
            ({"loss_type": "dpo"}, "loss_type='dpo' is not one of ppo_clip, reinforce"),
        ],
    )
    def test_bad_values_name_the_key(self, kwargs, message):
        RolloutCorrectionConfig(**kwargs)  # veRL builds it as given and checks the values when it uses them
        with pytest.raises(ConfigError, match=message):
            omega_conf_to_dataclass(kwargs, RolloutCorrectionConfig)

    def test_presets(self):
        geo = RolloutCorrectionConfig.decoupled_geo_rs()
        (opt,) = geo.rejection
        assert (geo.rollout_is, geo.bypass_mode, opt.name) == (None, False, "seq_mean_k1")
        assert math.isclose(opt.lower, math.log(0.999)) and math.isclose(opt.upper, math.log(1.001))
        pg = RolloutCorrectionConfig.bypass_pg_token_icepop()
        assert (pg.rollout_is, pg.is_bounds, pg.bypass_mode, pg.loss_type) == ("token", (5.0, 0.5), True, "reinforce")
        assert RolloutCorrectionConfig.bypass_ppo_clip_k3_rs().rejection[0].upper == 0.01
        assert RolloutCorrectionConfig.decoupled_seq_is_rs().rollout_rs == "seq_sum_k1"
        assert RolloutCorrectionConfig.disabled() == RolloutCorrectionConfig(rollout_is=None)
        assert RolloutCorrectionConfig().rollout_is == "sequence"  # veRL's dataclass default (its yaml: null)
        presets = [
            n for n, v in vars(RolloutCorrectionConfig).items() if isinstance(v, classmethod) and n != "disabled"
        ]
        assert len(presets) == 18
        for name in presets:  # every preset builds a checked config
            assert isinstance(getattr(RolloutCorrectionConfig, name)(), RolloutCorrectionConfig)
