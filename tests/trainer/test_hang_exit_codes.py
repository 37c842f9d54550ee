"""``python -m hybridflow.main_ppo`` with one worker frozen in a phase: the watchdog's ``WorkerHangError``
is the last thing on stderr and the exit code is 3, with no second traceback from cleanup (issue 32:
cleanup called a method on the group the watchdog had shut down and an IndexError replaced the hang).
A worker killed instead exits with code 4 (``WorkerDiedError``).

The freeze is real: ``freeze_hook/sitecustomize.py`` (test-only, on the run's PYTHONPATH) sends SIGSTOP
(Ray) or occupies the worker's thread for good (in process) right before the phase's call. Each case is
a whole run (Ray start, workers, one step, the deadline): the default suite keeps one in-process case,
the rest are marked slow.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from hybridflow.main_ppo import EXIT_CODE_HANG, EXIT_CODE_WORKER_DIED
from tests.subprocess_env import pythonpath_with
from tests.trainer.e2e_helpers import base_overrides

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HOOK_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "freeze_hook")

SEPARATE_POOL = ["actor_rollout_ref.rollout.nnodes=1", "actor_rollout_ref.rollout.n_gpus_per_node=1"]
GAE = ["algorithm.adv_estimator=gae"]  # a critic: values and critic update
KL_LOSS = ["actor_rollout_ref.actor.use_kl_loss=True"]  # a reference policy
SAVE = ["trainer.save_freq=1"]

# phase -> (what the hook freezes: a group method or generation, extra overrides, the call the hang names)
PHASES = {
    "generate_colocated": ("generate", [], "generate_sequences ("),
    "generate_separate_pool": ("generate", SEPARATE_POOL, "generate_sequences ("),
    "old_log_prob": ("compute_log_prob", [], "compute_log_prob'"),
    "ref_log_prob": ("compute_ref_log_prob", KL_LOSS, "compute_ref_log_prob'"),
    "values": ("compute_values", GAE, "compute_values'"),
    "update_critic": ("update_critic", GAE, "update_critic'"),
    "update_actor": ("update_actor", [], "update_actor'"),
    "weight_push": ("send_weights#2", SEPARATE_POOL, "send_weights'"),  # after the update (#1: the initial push)
    "save_checkpoint": ("save_checkpoint", SAVE, "save_checkpoint'"),
}
# the default suite's case: in process (12 s). The case, ray-generate_colocated, is slow with the other Ray
# ones: 40-54 s each on 2 idle cores (a Ray start, 2 workers, the 15 s deadline), the most of any default test;
# the Ray side of a frozen worker (stopped process named FROZEN) stays in tests/single_controller/test_watchdog_ray.py
FAST = {("inprocess", "old_log_prob")}
WATCHDOG_S = {"ray": 15, "inprocess": 5}  # idle seconds: healthy calls on a loaded 2-core machine stay under it


def _cases():
    for backend in ("ray", "inprocess"):
        for phase in PHASES:
            marks = [] if (backend, phase) in FAST else [pytest.mark.slow]
            yield pytest.param(backend, phase, marks=marks, id=f"{backend}-{phase}")


def _run_main_ppo(overrides: list[str], freeze: str, timeout: float) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env["PYTHONPATH"] = pythonpath_with(HOOK_DIR, REPO_ROOT)
    env.update(
        {
            "HYBRIDFLOW_TEST_FREEZE": freeze,
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "PYTHONUNBUFFERED": "1",
            "OMP_NUM_THREADS": "1",
            "HYBRIDFLOW_PROGRESS": "off",
        }
    )
    env.pop("RAY_ADDRESS", None)  # a Ray of its own, not the test session's
    return subprocess.run(
        [sys.executable, "-m", "hybridflow.main_ppo", *overrides],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        stdin=subprocess.DEVNULL,
    )


def _overrides(backend, tiny_model_dir, tiny_data_dir, tmp_path, extra) -> list[str]:
    world = 2 if backend == "ray" else 1
    out = base_overrides(tiny_model_dir, tiny_data_dir, tmp_path, steps=1, world=world, backend=backend)
    out += [
        "trainer.logger=['console']",
        "trainer.test_freq=-1",
        f"trainer.watchdog_timeout={WATCHDOG_S[backend]}",
        *extra,
    ]
    if backend == "ray":
        out.append("ray_kwargs.ray_init.num_cpus=4")  # 2 trainer workers + a separate rollout pool's one
    return out


def _last_error(stderr: str, kind: str) -> str:
    """The text from main_ppo's ``error: <kind>:`` line to the end; it must be the last thing printed."""
    marker = f"error: {kind}: "
    assert marker in stderr, stderr[-6000:]
    tail = stderr[stderr.rindex(marker) :]
    assert "Traceback" not in tail and "Exception ignored" not in tail, tail[-4000:]
    assert "During handling of the above exception" not in stderr, stderr[-6000:]
    assert "IndexError" not in stderr and "WorkerGroupShutDownError" not in stderr, stderr[-6000:]
    return tail


@pytest.mark.parametrize("backend, phase", list(_cases()))
def test_a_frozen_worker_ends_main_ppo_with_the_hang_and_exit_code_3(
    backend, phase, tiny_model_dir, tiny_data_dir, tmp_path
):
    freeze, extra, names = PHASES[phase]
    rank = 0 if backend == "inprocess" or phase == "generate_separate_pool" else 1  # the rollout pool has one worker
    overrides = _overrides(backend, tiny_model_dir, tiny_data_dir, tmp_path, extra)
    start = time.monotonic()
    proc = _run_main_ppo(overrides, f"{freeze}@{rank}", timeout=600)
    elapsed = time.monotonic() - start
    print(f"{backend}/{phase}: exit {proc.returncode} after {elapsed:.1f}s")
    assert "[freeze hook]" in proc.stderr, proc.stderr[-4000:]  # the phase was reached and frozen
    assert proc.returncode == EXIT_CODE_HANG, f"exit {proc.returncode}\n{proc.stderr[-6000:]}"
    tail = _last_error(proc.stderr, "WorkerHangError")
    first = tail.splitlines()[0]
    assert "hybridflow watchdog: worker group" in first and names in first, first
    if backend == "ray":  # the stopped process is named as such
        assert f"rank {rank} (pid " in tail and "FROZEN (process stopped" in tail, tail
    assert "the group's workers were shut down" in tail and "hybridflow: training stopped at global step 1" in tail


@pytest.mark.slow
def test_a_killed_worker_ends_main_ppo_with_the_dead_worker_code(tiny_model_dir, tiny_data_dir, tmp_path):
    overrides = _overrides("ray", tiny_model_dir, tiny_data_dir, tmp_path, [])
    proc = _run_main_ppo(overrides, "update_actor@1:kill", timeout=600)
    assert "[freeze hook] killed rank 1" in proc.stderr, proc.stderr[-4000:]
    assert proc.returncode == EXIT_CODE_WORKER_DIED, f"exit {proc.returncode}\n{proc.stderr[-6000:]}"
    tail = _last_error(proc.stderr, "WorkerDiedError")
    assert "rank 1 died while running 'actor_rollout_update_actor'" in tail.splitlines()[0], tail[:2000]


def test_main_turns_a_dead_worker_into_its_exit_code(monkeypatch, capsys):
    from hybridflow import main_ppo
    from hybridflow.single_controller.base import WorkerDiedError

    def died(config):
        raise WorkerDiedError("trainer:actor_rollout", "actor_rollout_update_actor", 1, "process killed")

    monkeypatch.setattr(main_ppo, "run_ppo", died)
    monkeypatch.setattr(main_ppo, "validate_ppo_config", lambda cfg: [])
    with pytest.raises(SystemExit) as info:
        main_ppo.main([])
    assert info.value.code == EXIT_CODE_WORKER_DIED not in (0, 1, EXIT_CODE_HANG)
    err = capsys.readouterr().err
    assert err.startswith("error: WorkerDiedError: worker group 'trainer:actor_rollout', rank 1 died while running")
