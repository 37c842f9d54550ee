"""trainer.watchdog_timeout reaches every worker group of a PPO run; a stuck phase ends the run with
a hang report next to its logs, the workers shut down, and ``main_ppo`` exits with EXIT_CODE_HANG."""

from __future__ import annotations

import os
import time

import pytest
import torch

from hybridflow import main_ppo
from hybridflow.main_ppo import run_ppo
from hybridflow.single_controller.base import Watchdog, WorkerHangError
from hybridflow.single_controller.base.watchdog import EXIT_CODE_HANG
from hybridflow.trainer.config_checks import validate_ppo_config
from hybridflow.trainer.ppo.ray_trainer import watchdog_of
from hybridflow.utils.config import ConfigError, load_config
from tests.trainer.e2e_helpers import base_overrides


def test_watchdog_timeout_from_the_command_line(tmp_path):
    cfg = load_config("ppo_trainer", ["trainer.watchdog_timeout=42.5", f"trainer.default_local_dir={tmp_path}/run"])
    assert watchdog_of(cfg.trainer) == Watchdog(timeout_s=42.5, report_dir=f"{tmp_path}/run/watchdog")
    off = load_config("ppo_trainer", ["trainer.watchdog_timeout=null"])
    assert not watchdog_of(off.trainer).enabled
    assert load_config("ppo_trainer", []).trainer.watchdog_timeout == 1800  # the documented default


@pytest.mark.parametrize("bad", ["0", "-5", "soon"])
def test_bad_watchdog_timeout_is_refused_by_name(bad):
    with pytest.raises(ConfigError, match="trainer.watchdog_timeout"):
        validate_ppo_config(load_config("ppo_trainer", [f"trainer.watchdog_timeout={bad}"]))


def test_stuck_phase_ends_the_run_with_a_report(tiny_model_dir, tiny_data_dir, tmp_path, monkeypatch):
    """In-process GRPO whose old-log-prob phase never returns: the run stops after the deadline."""
    from hybridflow.single_controller.base import Dispatch, register
    from hybridflow.workers.actor_rollout_ref_worker import ActorRolloutRefWorker

    def stuck_compute_log_prob(self, data):
        time.sleep(60)

    monkeypatch.setattr(ActorRolloutRefWorker, "compute_log_prob",
                        register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)(stuck_compute_log_prob))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    overrides = base_overrides(tiny_model_dir, tiny_data_dir, tmp_path, estimator="grpo", n=2, batch=4, steps=1,
                               world=1, backend="inprocess") + ["trainer.watchdog_timeout=4"]
    start = time.monotonic()
    try:
        with pytest.raises(WorkerHangError) as info:
            run_ppo(load_config("ppo_trainer", overrides))
    finally:
        torch.set_num_threads(threads)
    assert time.monotonic() - start < 40
    err = info.value
    assert err.method == "actor_rollout_compute_log_prob"
    assert "stuck in stuck_compute_log_prob (" in str(err) and "test_watchdog_trainer.py" in str(err)
    # the report sits under the run's directory, and the driver's note says the workers are down
    assert os.path.dirname(err.report_path) == os.path.join(str(tmp_path), "ckpt", "watchdog")
    assert any("workers shut down" in n for n in getattr(err, "__notes__", []))


def test_main_exits_with_the_hang_code(monkeypatch, capsys):
    def hang(config):
        raise WorkerHangError("g", "update_actor", 1, "rank 1 stuck in all_reduce", [1], "/tmp/report.txt")

    monkeypatch.setattr(main_ppo, "run_ppo", hang)
    monkeypatch.setattr(main_ppo, "validate_ppo_config", lambda cfg: [])
    with pytest.raises(SystemExit) as info:
        main_ppo.main([])
    assert info.value.code == EXIT_CODE_HANG != 0
    assert "rank 1 stuck in all_reduce" in capsys.readouterr().err
