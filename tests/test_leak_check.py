"""The leak check of tests/conftest.py (tests/leak_check.py): each kind of leak is found and named, put
back where it can be, and a real pytest run fails exactly the tests (and the module fixture) that leak."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

from tests.leak_check import StateGuard, process_state
from tests.subprocess_env import pythonpath_with

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_a_changed_or_new_variable_is_named_with_both_values_and_put_back(monkeypatch):
    monkeypatch.setenv("HF_LEAK_PROBE_OLD", "before")
    guard, before = StateGuard(), process_state()
    os.environ["HF_LEAK_PROBE_OLD"] = "after"
    os.environ["HF_LEAK_PROBE_NEW"] = "x"
    message = guard.check(before, "t")
    assert message == (
        "t left state behind:\n"
        "  environment variable HF_LEAK_PROBE_NEW: unset -> 'x'\n"
        "  environment variable HF_LEAK_PROBE_OLD: 'before' -> 'after'"
    )
    assert os.environ["HF_LEAK_PROBE_OLD"] == "before" and "HF_LEAK_PROBE_NEW" not in os.environ
    assert guard.check(before, "t") is None  # nothing left after the put-back


def test_a_removed_variable_is_named_and_put_back(monkeypatch):
    monkeypatch.setenv("HF_LEAK_PROBE", "1")
    guard, before = StateGuard(), process_state()
    del os.environ["HF_LEAK_PROBE"]
    assert guard.check(before, "t") == "t left state behind:\n  environment variable HF_LEAK_PROBE: '1' -> unset"
    assert os.environ["HF_LEAK_PROBE"] == "1"


def test_a_changed_signal_handler_is_named_and_put_back():
    guard, before = StateGuard(), process_state()
    old = signal.getsignal(signal.SIGUSR1)

    def handler(signum, frame):
        pass

    signal.signal(signal.SIGUSR1, handler)
    try:
        message = guard.check(before, "t")
    finally:
        if signal.getsignal(signal.SIGUSR1) is handler:  # only if the check failed to put it back
            signal.signal(signal.SIGUSR1, old)
    assert message.startswith("t left state behind:\n  signal handler SIGUSR1: ")
    assert "handler" in message and signal.getsignal(signal.SIGUSR1) == old


def test_a_thread_that_outlives_the_grace_is_named_once_and_a_short_one_is_not():
    guard, stop = StateGuard(grace_s=0.3), threading.Event()
    before = process_state()
    short = threading.Thread(target=stop.wait, args=(0.1,), name="probe-short")
    long = threading.Thread(target=stop.wait, name="probe-long")
    short.start(), long.start()
    try:
        leaks = guard.leaks(before, process_state())
        again = guard.leaks(before, process_state())
    finally:
        stop.set()
        long.join()
    assert [leak.text for leak in leaks] == [
        "non-daemon thread 'probe-long' (Thread, target threading.Event.wait) still running 0.3 s after the test"
    ]
    assert again == []  # reported once, not by every later check
    daemon = threading.Thread(target=stop.wait, daemon=True)
    before = process_state()
    daemon.start()
    assert guard.leaks(before, process_state()) == []  # daemon threads do not hold the process


def _sleeper(seconds: float, tag: str = "") -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", f"import time  # {tag}\ntime.sleep({seconds})"])


def test_a_child_that_outlives_the_grace_is_named_and_stopped_and_a_short_one_is_not():
    guard, before = StateGuard(child_grace_s=3.0), process_state()  # room for a slow start on a busy machine
    short, long = _sleeper(0), _sleeper(120)
    try:
        message = guard.check(before, "t")
        assert not _is_running(long.pid)  # the check stopped it
        short.wait(timeout=10)
    finally:
        for proc in (short, long):
            proc.kill()
            proc.wait()
    assert message is not None and message.startswith("t left state behind:\n  child process ")
    assert f"child process {long.pid} (" in message and "time.sleep(120)" in message
    assert "still running 3 s after the test" in message
    assert f"{short.pid}" not in message
    assert short.returncode == 0  # polled, not reaped: its Popen still gets its exit status


def test_exited_children_lifetime_helpers_and_a_session_fixtures_children_are_no_leak():
    guard, before = StateGuard(child_grace_s=0.5), process_state()
    exited = _sleeper(0)  # not waited for: a zombie until then
    helper = _sleeper(120, tag="hybridflow-orphan-reaper")  # one per process, like multiprocessing's tracker
    owner_before = process_state()
    owned = _sleeper(120)
    guard.own(owner_before, process_state())  # a session fixture's setup started it
    try:
        deadline = time.monotonic() + 10
        while exited.pid in process_state().children and _is_running(exited.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert guard.check(before, "t") is None
        assert helper.poll() is None and owned.poll() is None  # left alone
    finally:
        for proc in (exited, helper, owned):
            proc.kill()
            proc.wait()


def _is_running(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_an_actor_left_alive_is_named_once_and_a_killed_one_is_not(ray_session):
    import ray

    @ray.remote(num_cpus=0)
    class Probe:
        def ping(self):
            return "pong"

    guard, before = StateGuard(child_grace_s=5.0), process_state()  # ray.kill takes effect within it, even busy
    kept, killed = Probe.options(name="hf-leak-probe").remote(), Probe.remote()
    try:
        assert ray.get([kept.ping.remote(), killed.ping.remote()]) == ["pong", "pong"]
        ray.kill(killed)  # returns before the actor is dead: the grace covers that
        leaks = guard.leaks(before, process_state())
        again = guard.leaks(before, process_state())
    finally:
        ray.kill(kept)
    assert [leak.kind for leak in leaks] == ["actor"], leaks
    assert leaks[0].text.startswith(
        "Ray actor test_an_actor_left_alive_is_named_once_and_a_killed_one_is_not.<locals>.Probe 'hf-leak-probe' ("
    )
    assert leaks[0].text.endswith(") still alive 5 s after the test")
    assert again == []  # reported once, not by every later check
    assert StateGuard().leaks(before, process_state()) == []  # a fresh guard: both killed now, neither named


def test_a_ray_session_left_connected_is_named_unless_a_session_fixture_started_it():
    guard = StateGuard()
    before, after = process_state(), process_state()
    before.ray_connected, after.ray_connected = False, True  # no session before, one after (none is started here)
    before.actors, after.actors = None, frozenset()
    assert [leak.text for leak in guard.leaks(before, after)] == [
        "a Ray session started by the test is still connected (ray.init)"
    ]
    after.actors = None  # its GCS did not answer this time: still no new session, and nothing compared
    assert [leak.kind for leak in guard.leaks(before, after)] == ["ray"]
    unreadable = process_state()
    unreadable.ray_connected, unreadable.actors = True, None
    assert guard.leaks(unreadable, unreadable) == []  # an unreadable table is no session started by the test
    guard.own(before, after)  # the shared Ray fixture's setup connected it: the session's own
    assert guard.leaks(before, after) == []


def test_an_initialised_process_group_is_named_and_destroyed(tmp_path):
    import torch.distributed as dist

    guard, before = StateGuard(), process_state()
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    try:
        message = guard.check(before, "t")
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    assert (
        message == "t left state behind:\n  torch.distributed default process group: none -> backend gloo, rank 0 of 1"
    )


def test_import_time_variables_and_what_a_session_fixture_owns_are_no_leak(monkeypatch):
    guard = StateGuard()
    monkeypatch.delenv("RAY_CLIENT_MODE", raising=False)
    monkeypatch.delenv("HF_LEAK_PROBE", raising=False)
    before = process_state()
    imported = before.imported | {"ray"}
    # RAY_CLIENT_MODE is set by `import ray`: no leak when ray was imported in between, a leak otherwise
    after = process_state()
    after.env["RAY_CLIENT_MODE"] = "0"
    assert guard.leaks(before, after) != []
    after.imported = imported
    before.imported = before.imported - {"ray"}
    assert guard.leaks(before, after) == []
    # a session fixture's setup set HF_LEAK_PROBE=1: that value stays; another value is a leak
    owner_before, owner_after = process_state(), process_state()
    owner_after.env["HF_LEAK_PROBE"] = "1"
    guard.own(owner_before, owner_after)
    later = process_state()
    later.env["HF_LEAK_PROBE"] = "1"
    assert guard.leaks(before, later) == []
    later.env["HF_LEAK_PROBE"] = "2"
    assert [leak.key for leak in guard.leaks(before, later)] == ["HF_LEAK_PROBE"]


INNER_CONFTEST = """
from tests.conftest import GUARD, _leaves_nothing_behind, pytest_configure  # noqa: F401 - the real check

GUARD.child_grace_s = 1.0  # the leaking child below sleeps for minutes: no need to wait 10 s for it
"""

INNER_A = """
import os, signal, subprocess, sys, threading

import pytest

STOP = threading.Event()


def test_env_leak():
    os.environ["HF_LEAK_PROBE"] = "1"


def test_env_was_put_back():
    assert "HF_LEAK_PROBE" not in os.environ


def test_monkeypatch_is_no_leak(monkeypatch):
    monkeypatch.setenv("HF_LEAK_PROBE", "2")


def test_signal_leak():
    signal.signal(signal.SIGUSR2, lambda *a: None)


def test_thread_leak():
    threading.Thread(target=STOP.wait, name="probe-waiter").start()


def test_stop_the_thread():
    STOP.set()


CHILDREN = []


def test_child_leak():
    CHILDREN.append(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"]))


def test_the_leaked_child_was_stopped():
    CHILDREN[0].wait(timeout=10)  # reaped by the check that stopped it: no exit status left to read


def test_a_child_waited_for_is_no_leak():
    subprocess.run([sys.executable, "-c", "pass"], check=True)
"""

INNER_B = """
import os

import pytest


@pytest.fixture(scope="module")
def leaky():
    os.environ["HF_MODULE_PROBE"] = "on"
    yield


@pytest.fixture(scope="module")
def tidy():
    os.environ["HF_TIDY_PROBE"] = "on"
    yield
    del os.environ["HF_TIDY_PROBE"]


def test_one(leaky, tidy):
    assert os.environ["HF_MODULE_PROBE"] == os.environ["HF_TIDY_PROBE"] == "on"


def test_two(leaky, tidy):
    pass
"""

INNER_C = """
import os

import pytest


def test_after_the_module_fixture():
    assert "HF_MODULE_PROBE" not in os.environ


@pytest.fixture(scope="session")
def owner():  # like ray_session: what its setup changes is the session's
    os.environ["HF_SESSION_PROBE"] = "kept"
    yield


@pytest.fixture(scope="module")
def via_module(request):  # set up first, and sets up the session fixture inside its own setup
    return request.getfixturevalue("owner")


def test_a_session_fixtures_state_stays(via_module):
    assert os.environ["HF_SESSION_PROBE"] == "kept"
"""


def test_a_pytest_run_fails_exactly_the_leaking_tests_and_fixtures(tmp_path):
    (tmp_path / "conftest.py").write_text(textwrap.dedent(INNER_CONFTEST))
    (tmp_path / "test_a.py").write_text(INNER_A)
    (tmp_path / "test_b.py").write_text(INNER_B)
    (tmp_path / "test_c.py").write_text(INNER_C)
    env = dict(os.environ, PYTHONPATH=pythonpath_with(REPO_ROOT))
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rE", "-p", "no:cacheprovider", str(tmp_path)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    errors = sorted(line for line in out.splitlines() if line.startswith("ERROR "))
    assert [e.split(" - ")[0] for e in errors] == [
        "ERROR test_a.py::test_child_leak",
        "ERROR test_a.py::test_env_leak",
        "ERROR test_a.py::test_signal_leak",
        "ERROR test_a.py::test_thread_leak",
        "ERROR test_b.py::test_two",  # the module fixture is torn down after the module's last test
    ], out
    assert "13 passed, 5 errors" in out, out
    assert "test_a.py::test_child_leak left state behind:\n  child process " in out
    assert "time.sleep(300)) still running 1 s after the test" in out
    assert "test_a.py::test_env_leak left state behind:\n  environment variable HF_LEAK_PROBE: unset -> '1'" in out
    assert "signal handler SIGUSR2: <Handlers.SIG_DFL: 0> -> <function test_signal_leak.<locals>.<lambda> at " in out
    assert "non-daemon thread 'probe-waiter' (Thread, target threading.Event.wait) still running 2 s" in out
    assert (
        "module-scoped fixture 'leaky' of test_b.py left state behind:\n"
        "  environment variable HF_MODULE_PROBE: unset -> 'on'"
    ) in out
    assert "HF_TIDY_PROBE" not in out and "HF_SESSION_PROBE" not in out
