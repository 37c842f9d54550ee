"""The orphan reaper: when its owner is killed outright, the processes and paths it was told of go with it;
what the owner took back, a process under a reused pid, and everything after a clean exit stay. Each owner is
a real subprocess, SIGKILLed by the test."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.subprocess_env import pythonpath_with

psutil = pytest.importorskip("psutil")
pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="the reaper reads /proc (Linux)")

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# the owner: a reaper, a watched child with a child of its own, paths; prints what it made, then waits
OWNER = r"""
import json, os, subprocess, sys, time
from hybridflow.utils.orphan_reaper import orphan_reaper

SLEEPER = [sys.executable, "-c", "import time; time.sleep(120)"]
folder, mode = sys.argv[1], sys.argv[2]
reaper = orphan_reaper()
PARENT = "import subprocess, sys, time; g = subprocess.Popen(sys.argv[1:]); print(g.pid, flush=True); time.sleep(120)"
child = subprocess.Popen([sys.executable, "-c", PARENT] + SLEEPER, stdout=subprocess.PIPE, text=True)
grandchild = int(child.stdout.readline())
taken_back = subprocess.Popen(SLEEPER)
impostor = subprocess.Popen(SLEEPER)
for name in ("w_1", "w_2", "keep"):
    open(os.path.join(folder, name), "w").close()
os.mkdir(os.path.join(folder, "dir"))
open(os.path.join(folder, "dir", "x"), "w").close()
reaper.watch_process(child.pid)
reaper.watch_process(taken_back.pid)
reaper.forget_process(taken_back.pid)
reaper._send(f"pid {impostor.pid} 1")  # the right pid, another start time: a process that reused the pid
reaper.watch_path(os.path.join(folder, "w_*"))
reaper.watch_path(os.path.join(folder, "dir"))
forked = 0
if mode == "fork":
    forked = os.fork()
    if forked == 0:
        time.sleep(120)
        os._exit(0)
if mode == "clean":
    reaper.forget_process(child.pid)
    reaper.forget_path(os.path.join(folder, "w_*"))
    reaper.forget_path(os.path.join(folder, "dir"))
print(json.dumps({"child": child.pid, "grandchild": grandchild, "taken_back": taken_back.pid,
                  "impostor": impostor.pid, "reaper": reaper.pid, "forked": forked}), flush=True)
if mode != "clean":
    time.sleep(120)
"""


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _wait_until(predicate, within_s: float = 30.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return predicate()


def _kill_all(pids):
    for pid in pids:
        if pid and _alive(pid):
            os.kill(pid, signal.SIGKILL)


@pytest.fixture
def owner(tmp_path):
    started = []

    def start(mode: str):
        env = dict(os.environ, PYTHONPATH=pythonpath_with(REPO))
        proc = subprocess.Popen(
            [sys.executable, "-c", OWNER, str(tmp_path), mode], stdout=subprocess.PIPE, text=True, env=env
        )
        started.append(proc)
        facts = json.loads(proc.stdout.readline())
        started.append(facts)
        return proc, facts

    yield start
    for item in started:
        if isinstance(item, dict):
            _kill_all(item.values())
        else:
            if item.poll() is None:
                item.kill()
            item.wait()
            item.stdout.close()


@pytest.mark.parametrize("mode", ["plain", "fork"])
def test_a_killed_owner_takes_what_it_watched_with_it(owner, tmp_path, mode):
    """``fork``: a forked child of the owner, still alive, must not keep the reaper waiting for it."""
    proc, facts = owner(mode)
    assert _alive(facts["child"]) and _alive(facts["grandchild"]) and _alive(facts["reaper"])
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert _wait_until(lambda: not _alive(facts["child"]) and not _alive(facts["grandchild"])), facts
    assert _wait_until(lambda: not _alive(facts["reaper"]))
    assert sorted(os.listdir(tmp_path)) == ["keep"]  # w_1, w_2 and the folder with its file are gone
    assert _alive(facts["taken_back"]) and _alive(facts["impostor"])
    if mode == "fork":
        assert _alive(facts["forked"])


def test_after_a_clean_exit_nothing_is_touched(owner, tmp_path):
    proc, facts = owner("clean")
    assert proc.wait(timeout=30) == 0
    assert _wait_until(lambda: not _alive(facts["reaper"]))  # the pipe ended: the reaper ends too
    time.sleep(0.5)
    assert all(_alive(facts[k]) for k in ("child", "grandchild", "taken_back", "impostor"))
    assert sorted(os.listdir(tmp_path)) == ["dir", "keep", "w_1", "w_2"]
