"""``main_ppo``'s driver with Ulysses sequence parallelism: 2 Ray workers on the CPU (gloo) forming one
SP group of 2 for the actor, the reference policy and the critic."""

from __future__ import annotations

import pytest

from hybridflow.config.loader import load_config
from hybridflow.main_ppo import run_ppo
from tests.trainer.e2e_helpers import assert_finite, base_overrides, read_metrics

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


@pytest.mark.slow
def test_gae_with_sequence_parallel_actor_ref_and_critic(tiny_model_dir, tiny_data_dir, ray_session, tmp_path):
    # one mini-batch per update: the first update starts from the reference policy itself
    overrides = base_overrides(
        tiny_model_dir, tiny_data_dir, tmp_path, estimator="gae", n=2, batch=4, steps=2, world=2, mini_batch=4
    )
    overrides += [
        "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2",  # the ref follows it (yaml interpolation)
        "critic.fsdp.ulysses_sequence_parallel_size=2",  # the engine spelling
        "actor_rollout_ref.actor.use_kl_loss=True",  # the reference policy runs
        # a budget smaller than one sequence (128 + 8 tokens) that fits once multiplied by the SP size
        "actor_rollout_ref.actor.use_dynamic_bsz=True",
        "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=100",
    ]
    run_ppo(load_config("ppo_trainer", overrides))

    steps = read_metrics(tmp_path)
    assert [m["step"] for m in steps] == [1, 2]
    for m in steps:
        assert_finite(m)
        for key in ("actor/pg_loss", "actor/kl_loss", "critic/vf_loss", "critic/values/mean", "timing_s/ref"):
            assert key in m, key
        # the trainer's sequence-parallel log-probs of the generated tokens equal the rollout engine's own
        assert m["training/rollout_probs_diff_mean"] < 1e-3, m
    # step 1: the actor is still the reference policy (the two SP forwards agree), so the KL loss is 0; step 2 moved
    assert steps[0]["actor/kl_loss"] == pytest.approx(0.0, abs=1e-6)
    assert steps[1]["actor/kl_loss"] > 1e-6
