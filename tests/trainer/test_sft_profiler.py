"""main_sft's profiling (veRL's trainer.profile_interval with the profiler section): one torch.profiler trace
from the start of step ``start`` to the end of step ``end``, by the selected ranks; settings that would
record nothing say so."""

from __future__ import annotations

import json
import os

import pytest

from hybridflow.config.errors import ConfigError
from hybridflow.config.loader import load_config
from hybridflow.config.profiler import ProfilerConfig
from hybridflow.config.sft_trainer import SFTRunConfig, SFTTrainerConfig
from hybridflow.main_sft import run_sft
from tests.trainer.test_sft_trainer import sft_overrides

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


def test_the_interval_writes_one_trace_of_its_steps(tiny_model_dir, tiny_data_dir, tmp_path):
    save = tmp_path / "profile"
    extra = {
        "trainer.total_training_steps": 4,
        "trainer.profile_interval": "[2,3]",
        "profiler.enable": True,
        "profiler.all_ranks": True,
        "profiler.save_path": str(save),
        "profiler.tool_config.torch.contents": "[shapes]",
    }
    run_sft(load_config("sft_trainer", sft_overrides(tiny_model_dir, tiny_data_dir, str(tmp_path / "out"), **extra)))
    assert sorted(os.listdir(save)) == ["step_2"]
    assert os.listdir(save / "step_2") == ["sft_rank0.pt.trace.json"]
    with open(save / "step_2" / "sft_rank0.pt.trace.json") as f:
        events = json.load(f)["traceEvents"]
    steps = [e for e in events if str(e.get("name", "")).startswith("Optimizer.step#")]
    assert len(steps) == 2  # steps 2 and 3 (one optimizer step each), not 1 or 4
    assert any("Input Dims" in (e.get("args") or {}) for e in events)  # contents=[shapes]


def test_interval_rules_and_settings_that_record_nothing():
    def check(interval, world=1, **profiler):
        cfg = SFTTrainerConfig(
            trainer=SFTRunConfig(logger="console", profile_interval=interval),
            profiler=ProfilerConfig(tool="torch", **profiler),
        )
        return cfg.validate(world, ("console",))

    with pytest.raises(ConfigError, match=r"trainer.profile_interval=\[3, 2\]: end must not come before start"):
        check([3, 2])
    with pytest.raises(ConfigError, match=r"trainer.profile_interval=\[-1, 2\]: a negative start"):
        check([-1, 2])
    with pytest.raises(ConfigError, match=r"trainer.profile_interval=\[1\] must be \[start, end\]"):
        check([1])
    assert any("records nothing while profiler.enable=false" in n for n in check([1, 2]))
    assert any("records nothing while trainer.profile_interval is [-1, -1]" in n for n in check([-1, -1], enable=True))
    assert any("no rank of 2 records" in n for n in check([1, 2], world=2, enable=True, ranks=[5]))
    assert not [n for n in check([1, 2], world=2, enable=True, ranks=[1]) if "profil" in n]


def test_the_sft_trace_refuses_the_update_schedule_and_per_stage_traces():
    # PPO's roles honour them (their updates have mini-batches and stages); an SFT step has neither
    with pytest.raises(ConfigError, match=r"profiler.tool_config.torch.schedule.active=2 is not supported"):
        load_config("sft_trainer", ["profiler.tool_config.torch.schedule.active=2"])
    with pytest.raises(ConfigError, match=r"profiler.tool_config.torch.discrete=True is not supported"):
        load_config("sft_trainer", ["profiler.tool_config.torch.discrete=True"])
