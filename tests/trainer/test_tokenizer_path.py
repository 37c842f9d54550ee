"""veRL's ``actor_rollout_ref.model.tokenizer_path``: the policy's tokenizer from a folder of its own (a model
directory holding weights and config only). In-process run on the tiny model."""

from __future__ import annotations

import math
import os
import shutil

import pytest

from hybridflow.config.loader import load_config
from hybridflow.main_ppo import run_ppo
from tests.trainer.e2e_helpers import base_overrides

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
    "chat_template.jinja",
)


def _split(tiny_model_dir, tmp_path) -> tuple[str, str]:
    """The tiny model's folder as two: weights and config, and the tokenizer's files."""
    weights, tokenizer = tmp_path / "weights", tmp_path / "tokenizer"
    shutil.copytree(tiny_model_dir, weights)
    tokenizer.mkdir()
    moved = [f for f in os.listdir(weights) if f in TOKENIZER_FILES or f.startswith("tokenizer")]
    assert "tokenizer_config.json" in moved
    for name in moved:
        shutil.move(str(weights / name), str(tokenizer / name))
    return str(weights), str(tokenizer)


def test_the_policy_reads_its_tokenizer_from_tokenizer_path(tiny_model_dir, tiny_data_dir, tmp_path):
    weights, tokenizer = _split(tiny_model_dir, tmp_path)
    overrides = base_overrides(weights, tiny_data_dir, tmp_path, steps=1, backend="inprocess")
    overrides = [o for o in overrides if not o.startswith("critic.model.path")]
    with pytest.raises(ValueError, match=r"no tokenizer in .*weights.*model.tokenizer_path"):  # none beside the weights
        run_ppo(load_config("ppo_trainer", overrides))
    metrics = run_ppo(load_config("ppo_trainer", [*overrides, f"actor_rollout_ref.model.tokenizer_path={tokenizer}"]))
    assert math.isfinite(metrics["actor/pg_loss"]) and metrics["response_length/mean"] > 0


def test_a_missing_tokenizer_folder_is_named(tiny_model_dir, tiny_data_dir, tmp_path):
    overrides = base_overrides(tiny_model_dir, tiny_data_dir, tmp_path, steps=1, backend="inprocess")
    missing = str(tmp_path / "nowhere")
    with pytest.raises(FileNotFoundError, match=r"actor_rollout_ref.model.tokenizer_path='.*nowhere'"):
        run_ppo(load_config("ppo_trainer", [*overrides, f"actor_rollout_ref.model.tokenizer_path={missing}"]))


def test_a_missing_critic_tokenizer_folder_is_named(tiny_model_dir, tiny_data_dir, tmp_path):
    overrides = base_overrides(tiny_model_dir, tiny_data_dir, tmp_path, estimator="gae", steps=1, backend="inprocess")
    missing = str(tmp_path / "nowhere")
    with pytest.raises(Exception, match=r"critic.model.tokenizer_path='.*nowhere': no such folder"):
        run_ppo(load_config("ppo_trainer", [*overrides, f"critic.model.tokenizer_path={missing}"]))
