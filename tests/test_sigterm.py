"""SIGTERM ends a training run and a test run within seconds, and the Ray processes they started stop.

Both children are launched as a background job would be (SIGINT ignored), and are signalled while
they are busy: the training run in its training loop, the test run inside a test that waits.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from tests.subprocess_env import pythonpath_with

psutil = pytest.importorskip("psutil")
pytest.importorskip("ray")

from tests.trainer.e2e_helpers import base_overrides  # noqa: E402

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TESTS_DIR = os.path.join(REPO_ROOT, "tests")


def _ignore_sigint():
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _wait_for(predicate, within_s: float, poll_s: float = 0.2) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(poll_s)
    return predicate()


def _alive(procs) -> list:
    out = []
    for p in procs:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.NoSuchProcess:
            pass
    return out


def _terminate_and_check(child: subprocess.Popen, started_marker, what: str, startup_s: float = 240):
    """Wait until ``started_marker()``, SIGTERM the child, and return (exit code, seconds to exit,
    its descendants still alive 20 s after it ended)."""
    try:
        assert _wait_for(lambda: started_marker() or child.poll() is not None, startup_s), f"{what} never got busy"
        assert child.poll() is None, f"{what} ended before the signal: {child.communicate()[0][-3000:]}"
        descendants = psutil.Process(child.pid).children(recursive=True)
        sent = time.monotonic()
        child.send_signal(signal.SIGTERM)
        code = child.wait(timeout=60)
        took = time.monotonic() - sent
        _wait_for(lambda: not _alive(descendants), 20)
        return code, took, _alive(descendants)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


PYTEST_FILE = """
import os, time
import pytest
import ray

@pytest.fixture(scope="session")
def ray_up():
    ray.init(address="local", num_cpus=1, include_dashboard=False)  # its own, not a cluster someone runs here
    yield
    print("TEARDOWN: ray.shutdown", flush=True)
    ray.shutdown()

def test_busy(ray_up):
    @ray.remote
    def square(x):
        return x * x
    assert ray.get(square.remote(3)) == 9  # a Ray worker process is up
    open(os.environ["BUSY_MARKER"], "w").close()
    time.sleep(300)

def test_never_reached():
    print("NEVER REACHED", flush=True)
"""


def test_sigterm_stops_the_test_runner_and_its_ray(tmp_path):
    """pytest with the suite's graceful_stop plugin: SIGTERM inside a test stops the run (the next
    test does not start), the session's teardown runs and Ray's processes go."""
    (tmp_path / "test_busy.py").write_text(PYTEST_FILE)
    marker = tmp_path / "busy"
    env = {**os.environ, "PYTHONPATH": TESTS_DIR, "BUSY_MARKER": str(marker)}
    child = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-p", "graceful_stop", "-p", "no:cacheprovider", "-s", "-q", "test_busy.py"],
        cwd=tmp_path,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=_ignore_sigint,
    )
    code, took, left = _terminate_and_check(child, marker.exists, "the test run")
    output = child.stdout.read()
    assert took < 30, f"pytest took {took:.1f}s to end after SIGTERM"
    assert code not in (0, -signal.SIGTERM), output[-3000:]  # interrupted, by its own hand
    assert "TEARDOWN: ray.shutdown" in output and "NEVER REACHED" not in output, output[-3000:]
    assert not left, f"still running after the test run ended: {[p.name() for p in left]}"


@pytest.mark.slow
def test_sigterm_stops_a_training_run_and_its_ray(tiny_model_dir, tiny_data_dir, tmp_path):
    """``python -m hybridflow.main_ppo`` on Ray, signalled in its training loop: it stops within
    seconds with exit code 143, and the Ray processes it started (raylet, GCS, workers) are gone."""
    from hybridflow.main_ppo import EXIT_CODE_SIGTERM

    overrides = base_overrides(
        tiny_model_dir, tiny_data_dir, tmp_path, estimator="grpo", n=2, batch=4, steps=500, world=1, backend="ray"
    ) + ["ray_kwargs.ray_init.num_cpus=2"]
    metrics = tmp_path / "ckpt" / "metrics.jsonl"
    env = {**os.environ, "PYTHONPATH": pythonpath_with(REPO_ROOT)}
    env.pop("RAY_ADDRESS", None)  # its own Ray, not the test session's
    child = subprocess.Popen(
        [sys.executable, "-m", "hybridflow.main_ppo", *overrides],
        cwd=tmp_path,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=_ignore_sigint,
    )
    code, took, left = _terminate_and_check(
        child, lambda: metrics.exists() and metrics.stat().st_size > 0, "the training run"
    )
    output = child.stdout.read()
    assert took < 30, f"main_ppo took {took:.1f}s to end after SIGTERM"
    assert code == EXIT_CODE_SIGTERM, output[-3000:]
    assert not left, f"still running after the training run ended: {[p.name() for p in left]}"
