"""trainer.watchdog_timeout reaches every worker group of a PPO run; a stuck phase ends the run with
a hang report next to its logs and the workers shut down: ``run_ppo`` raises ``WorkerHangError`` (also
in a process launched in the background, which then lives on), and only the command line
``python -m hybridflow.main_ppo`` exits, with EXIT_CODE_HANG."""

from __future__ import annotations

import os

import pytest

from hybridflow import main_ppo
from hybridflow.config.loader import ConfigError, load_config
from hybridflow.main_ppo import EXIT_CODE_HANG
from hybridflow.single_controller.base import Watchdog, WorkerHangError
from hybridflow.trainer.config_checks import validate_ppo_config
from hybridflow.trainer.ppo.ray_trainer import watchdog_of
from tests.subprocess_env import pythonpath_with
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


BACKGROUND_RUN = r"""
import json, os, signal, sys, time
signal.signal(signal.SIGINT, signal.SIG_IGN)  # as in every process started with '&' from a script
import torch
torch.set_num_threads(1)
from hybridflow.config.loader import load_config
from hybridflow.main_ppo import run_ppo
from hybridflow.single_controller.base import Dispatch, WorkerHangError, register
from hybridflow.workers.actor_rollout_ref_worker import ActorRolloutRefWorker

first, second = json.loads(sys.argv[1]), json.loads(sys.argv[2])
original = ActorRolloutRefWorker.compute_log_prob

def stuck_compute_log_prob(self, data):
    time.sleep(300)

ActorRolloutRefWorker.compute_log_prob = register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)(stuck_compute_log_prob)
start = time.monotonic()
try:
    run_ppo(load_config("ppo_trainer", first))
    print("NOT REACHED", flush=True)
except WorkerHangError as e:
    print("HANG " + json.dumps({"method": e.method, "seconds": time.monotonic() - start, "report": e.report_path,
                               "message": str(e), "notes": getattr(e, "__notes__", [])}), flush=True)
# the process lives on: the same program trains a run to its end
ActorRolloutRefWorker.compute_log_prob = original
metrics = run_ppo(load_config("ppo_trainer", second))
print("SECOND RUN " + json.dumps({k: v for k, v in metrics.items() if k == "training/global_step"}), flush=True)
"""


def test_stuck_phase_in_a_background_launch_raises_and_the_process_trains_on(tiny_model_dir, tiny_data_dir, tmp_path):
    """In-process GRPO whose old-log-prob phase never returns, in a child with SIGINT ignored (a
    background launch): run_ppo raises WorkerHangError after the deadline with the report under the
    run's directory and the workers shut down; the same process then runs a healthy GRPO step."""
    import json
    import subprocess
    import sys

    def overrides(name, extra=()):
        (tmp_path / name).mkdir()
        return base_overrides(
            tiny_model_dir,
            tiny_data_dir,
            tmp_path / name,
            estimator="grpo",
            n=2,
            batch=4,
            steps=1,
            world=1,
            backend="inprocess",
        ) + list(extra)

    first = overrides("stuck", ["trainer.watchdog_timeout=4"])
    second = overrides("healthy")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    out = subprocess.run(
        [sys.executable, "-c", BACKGROUND_RUN, json.dumps(first), json.dumps(second)],
        capture_output=True,
        text=True,
        timeout=400,
        stdin=subprocess.DEVNULL,
        env={**os.environ, "PYTHONPATH": pythonpath_with(root)},
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    hang = json.loads(next(line[5:] for line in out.stdout.splitlines() if line.startswith("HANG ")))
    assert hang["method"] == "actor_rollout_compute_log_prob"
    assert "stuck in stuck_compute_log_prob (<string>:" in hang["message"]
    assert hang["seconds"] < 120  # 4 s idle deadline, then the stacks; not the 300 s sleep
    # the report sits under the run's directory, and the driver's note says the workers are down
    assert os.path.dirname(hang["report"]) == str(tmp_path / "stuck" / "ckpt" / "watchdog")
    assert any("workers shut down" in n for n in hang["notes"])
    assert "NOT REACHED" not in out.stdout
    assert 'SECOND RUN {"training/global_step": 1' in out.stdout


def test_main_exits_with_the_hang_code(monkeypatch, capsys):
    def hang(config):
        raise WorkerHangError("g", "update_actor", 1, "rank 1 stuck in all_reduce", [1], "/tmp/report.txt")

    monkeypatch.setattr(main_ppo, "run_ppo", hang)
    monkeypatch.setattr(main_ppo, "validate_ppo_config", lambda cfg: [])
    with pytest.raises(SystemExit) as info:
        main_ppo.main([])
    assert info.value.code == EXIT_CODE_HANG != 0
    assert "rank 1 stuck in all_reduce" in capsys.readouterr().err
