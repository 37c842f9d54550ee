"""fsdp_config.full_determinism (veRL's key): the worker turns on deterministic kernels, the
library switches (env) and seeds, before its process group exists; nothing when no section asks."""

from __future__ import annotations

import os
import random

import torch

from hybridflow.config.engine import FSDPEngineConfig
from hybridflow.utils.determinism import apply_full_determinism, enable_full_determinism


def test_enable_sets_kernels_env_and_seeds_and_keeps_user_env(restore_torch_switches, monkeypatch):
    monkeypatch.setenv("NCCL_ALGO", "Tree")  # the user's choice wins
    enable_full_determinism(seed=5)
    first = (random.random(), torch.rand(1).item())
    enable_full_determinism(seed=5)
    assert (random.random(), torch.rand(1).item()) == first  # seeded, same draws again
    assert torch.are_deterministic_algorithms_enabled() and torch.is_deterministic_algorithms_warn_only_enabled()
    assert torch.backends.cudnn.deterministic and not torch.backends.cudnn.benchmark
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    assert os.environ["FLASH_ATTENTION_DETERMINISTIC"] == "1"
    assert os.environ["NCCL_ALGO"] == "Tree"


def test_apply_uses_the_first_section_that_asks(restore_torch_switches):
    torch.use_deterministic_algorithms(False)
    assert apply_full_determinism([FSDPEngineConfig(full_determinism=False, seed=1), None]) is None
    assert not torch.are_deterministic_algorithms_enabled()
    assert (
        apply_full_determinism(
            [
                FSDPEngineConfig(full_determinism=False, seed=1),
                FSDPEngineConfig(full_determinism=True, seed=7),
                FSDPEngineConfig(full_determinism=True, seed=9),
            ]
        )
        == 7
    )
    assert torch.are_deterministic_algorithms_enabled()


def test_a_run_with_full_determinism_turns_it_on_in_the_worker(
    tiny_model_dir, tiny_data_dir, tmp_path, restore_torch_switches, one_torch_thread
):
    """In-process GRPO, 1 step, actor full_determinism on (refused as not implemented before)."""
    from hybridflow.config.loader import load_config
    from hybridflow.main_ppo import run_ppo
    from tests.trainer.e2e_helpers import assert_finite, base_overrides, read_metrics

    torch.use_deterministic_algorithms(False)
    overrides = base_overrides(tiny_model_dir, tiny_data_dir, tmp_path, steps=1, backend="inprocess")
    run_ppo(load_config("ppo_trainer", overrides + ["actor_rollout_ref.actor.fsdp_config.full_determinism=True"]))
    assert torch.are_deterministic_algorithms_enabled()  # the in-process worker shares this process
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    (step,) = read_metrics(tmp_path)
    assert_finite(step)


def test_a_rollout_section_that_asks_turns_it_on_with_its_seed(restore_torch_switches):
    """rollout.full_determinism: the worker that holds the rollout passes that section too (hf: the engine
    runs in the worker's process)."""
    from hybridflow.config.rollout import rollout_as_in_yaml

    torch.use_deterministic_algorithms(False)
    assert apply_full_determinism([FSDPEngineConfig(), rollout_as_in_yaml(full_determinism=True, seed=5)]) == 5
    assert torch.are_deterministic_algorithms_enabled()
