"""recipes/genrm_grpo.py: its command line composes into a valid config (fast) and one GRPO step runs
through the shell script's Python entry point (slow)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import genrm_grpo  # recipes/genrm_grpo.py (recipes/ is on pytest.ini's pythonpath)
import pytest

from hybridflow.config.loader import load_config
from hybridflow.trainer.config_checks import validate_ppo_config
from hybridflow.trainer.ppo.judge_setup import uses_judge
from tests.subprocess_env import pythonpath_with

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.parametrize("engine", ["hf", "vllm"])
def test_overrides_compose_and_validate(engine, tmp_path):
    args = genrm_grpo.parse(["--engine", engine, "trainer.total_training_steps=3"])
    cfg = load_config("ppo_trainer", genrm_grpo.rl_overrides("/m", "/j", "/d", str(tmp_path), args))
    validate_ppo_config(cfg)
    assert uses_judge(cfg) and cfg.reward.reward_model.rollout.name == engine
    assert cfg.reward.reward_kwargs.template == genrm_grpo.TEMPLATE and cfg.trainer.total_training_steps == 3


@pytest.mark.slow
def test_one_step_end_to_end(tmp_path):
    env = dict(os.environ, PYTHONPATH=pythonpath_with(REPO))
    subprocess.run(
        [sys.executable, os.path.join(REPO, "recipes", "genrm_grpo.py"), "--workdir", str(tmp_path), "--steps", "1"],
        check=True,
        env=env,
        timeout=600,
    )
    with open(tmp_path / "genrm_result.json") as f:
        steps = json.load(f)["steps"]
    assert len(steps) == 1 and steps[0]["genrm/judged"] == 16  # 4 prompts x 4 samples
