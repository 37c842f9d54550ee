"""Start-up checks of the keys the veRL 0.9.1 losses and estimators read (PolicyLossConfig.validate,
AlgoConfig.validate and config/rules.py), and those keys being honoured by the config loader."""

from hybridflow.config.loader import load_config
from tests.trainer.test_config_checks import check, error_of

A = "actor_rollout_ref.actor"
N = "actor_rollout_ref.rollout.n=4"
NO_CRITIC = "critic.ppo_micro_batch_size_per_gpu=null"


def test_every_new_loss_mode_passes_with_its_keys():
    for mode in ("clip_cov", "sapo"):  # (each check composes a config: ~0.2 s)
        check(f"{A}.policy_loss.loss_mode={mode}")
    check(f"{A}.policy_loss.loss_mode=dro", f"{A}.policy_loss.dro_beta=0.1")


def test_loss_keys_are_checked_when_their_loss_is_selected():
    msg = error_of(f"{A}.policy_loss.loss_mode=dro")
    assert f"{A}.policy_loss.dro_beta > 0" in msg and "got None" in msg
    assert "clip_cov_ratio must be > 0" in error_of(
        f"{A}.policy_loss.loss_mode=clip_cov", f"{A}.policy_loss.clip_cov_ratio=0"
    )
    assert "kl_cov_ratio must be > 0" in error_of(
        f"{A}.policy_loss.loss_mode=kl_cov", f"{A}.policy_loss.kl_cov_ratio=-1"
    )
    assert "clip_cov_lb (5.0) must be below clip_cov_ub (1.0)" in error_of(
        f"{A}.policy_loss.loss_mode=clip_cov", f"{A}.policy_loss.clip_cov_lb=5.0", f"{A}.policy_loss.clip_cov_ub=1.0"
    )
    check(f"{A}.policy_loss.clip_cov_ratio=0")  # read only by clip_cov: no error under vanilla


def test_optimal_token_baseline_needs_sum_pi_squared_and_the_old_log_prob_pass():
    for est in ("optimal_token_baseline", "tir_optimal_token_baseline"):
        assert f"{A}.calculate_sum_pi_squared=True" in error_of(f"algorithm.adv_estimator={est}", N, NO_CRITIC)
        check(f"algorithm.adv_estimator={est}", f"{A}.calculate_sum_pi_squared=True", N, NO_CRITIC)
        assert "actor_rollout_ref.rollout.n must be > 1" in error_of(  # a group estimator
            f"algorithm.adv_estimator={est}", f"{A}.calculate_sum_pi_squared=True", NO_CRITIC
        )
    msg = error_of(
        "algorithm.adv_estimator=optimal_token_baseline",
        f"{A}.calculate_sum_pi_squared=True",
        N,
        NO_CRITIC,
        "algorithm.rollout_correction.bypass_mode=True",
        "actor_rollout_ref.rollout.calculate_log_probs=True",
    )
    assert "bypass_mode=True" in msg and "skip" in msg


def test_gdpo_needs_its_reward_keys():
    assert "algorithm.gdpo_reward_keys" in error_of("algorithm.adv_estimator=gdpo", N, NO_CRITIC)
    check("algorithm.adv_estimator=gdpo", "algorithm.gdpo_reward_keys=[fmt,acc]", N, NO_CRITIC)
    assert "gdpo_reward_weights has 3 entries for 2" in error_of(
        "algorithm.adv_estimator=gdpo",
        "algorithm.gdpo_reward_keys=[fmt,acc]",
        "algorithm.gdpo_reward_weights=[1,2,3]",
        N,
        NO_CRITIC,
    )


def test_the_keys_load_the_verl_way():
    # veRL's AlgoConfig has gdpo_reward_* but its yaml does not: users add them with +
    cfg = load_config(
        "ppo_trainer",
        [
            "+algorithm.gdpo_reward_keys=[fmt,acc]",
            "algorithm.gdpo_reward_weights=[1.0,0.5]",
            f"{A}.tau_neg=2.0",
            f"{A}.policy_loss.kl_cov_ratio=0.01",
            f"{A}.calculate_sum_pi_squared=True",
        ],
    )
    assert list(cfg.algorithm.gdpo_reward_keys) == ["fmt", "acc"] and list(cfg.algorithm.gdpo_reward_weights) == [
        1.0,
        0.5,
    ]
    assert cfg.actor_rollout_ref.actor.tau_neg == 2.0 and cfg.actor_rollout_ref.actor.policy_loss.kl_cov_ratio == 0.01
