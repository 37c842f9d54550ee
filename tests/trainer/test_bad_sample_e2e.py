"""A reward function that raises on one sample (issue 31, point 2), in a short in-process GRPO run: by
default the run stops naming the sample, its data_source and the error; with ``reward.bad_sample_score`` the
run completes, the sample scores that value and ``reward/bad_samples`` counts it in its step."""

from __future__ import annotations

import os

import pytest

from hybridflow.config.loader import load_config
from hybridflow.config.reward import RewardConfig
from hybridflow.main_ppo import run_ppo
from hybridflow.rewards import RewardComputationError
from hybridflow.rewards.streaming import bad_sample_kwargs
from tests.trainer.e2e_helpers import base_overrides, read_metrics

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py

# the third call of the run (step 1, sample 2) raises; every other sample scores the toy reward
RAISES_ONCE = """
calls = 0


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    global calls
    calls += 1
    if calls == 3:
        raise RuntimeError("the grader crashed on this sample")
    s = solution_str or ""
    return sum(c.isdigit() for c in s) / max(len(s), 1)
"""


def _config(tiny_model_dir, tiny_data_dir, tmp_path, *extra):
    path = os.path.join(str(tmp_path), "raises_once.py")
    with open(path, "w") as f:
        f.write(RAISES_ONCE)
    overrides = base_overrides(tiny_model_dir, tiny_data_dir, tmp_path, steps=2, backend="inprocess")
    overrides += [f"custom_reward_function.path={path}", "trainer.test_freq=-1", *extra]
    # the counter counts calls in one process: the driver scores after generation (the same failures
    # scored in the reward loop's processes: tests/rewards/test_reward_streaming.py)
    overrides += ["reward.num_workers=0"]
    return load_config("ppo_trainer", overrides)


def test_a_raising_reward_function_stops_the_run_naming_the_sample(tiny_model_dir, tiny_data_dir, tmp_path):
    with pytest.raises(RewardComputationError) as info:
        run_ppo(_config(tiny_model_dir, tiny_data_dir, tmp_path))
    message = str(info.value)
    assert "sample 2 (data_source='openai/gsm8k')" in message
    assert "RuntimeError: the grader crashed on this sample" in message


def test_bad_sample_score_lets_the_run_go_on_and_counts_the_sample(tiny_model_dir, tiny_data_dir, tmp_path, caplog):
    config = _config(tiny_model_dir, tiny_data_dir, tmp_path, "reward.bad_sample_score=-1.0")
    last = run_ppo(config)
    steps = read_metrics(tmp_path)
    assert [m["reward/bad_samples"] for m in steps] == [1.0, 0.0]
    assert last["training/global_step"] == 2
    assert steps[0]["critic/score/min"] == -1.0  # the toy reward is a share in [0, 1]
    assert any("sample 2 (data_source='openai/gsm8k')" in r.getMessage() for r in caplog.records)


class OwnManager:
    def __init__(self, tokenizer, num_examine, compute_score=None, reward_fn_key="data_source", **kwargs):
        pass


def test_a_manager_of_your_own_gets_no_settings_and_setting_them_is_refused():
    assert bad_sample_kwargs(RewardConfig(), OwnManager) == {}
    with pytest.raises(ValueError, match="reward.bad_sample_score applies to hybridflow's rule-based"):
        bad_sample_kwargs(RewardConfig(bad_sample_score=0.0), OwnManager)
