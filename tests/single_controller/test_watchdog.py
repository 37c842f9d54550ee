"""The watchdog's primitives without Ray: idle deadlines, the three wait wrappers, the stack parser,
the in-process backend's calls under a deadline, and a hang in a process launched in the background
(SIGINT ignored): it raises where the driver waits and the process lives on."""

import asyncio
import concurrent.futures
import os
import time

import pytest
import workers_for_tests as W

from hybridflow.single_controller.base import (
    Deadline,
    Watchdog,
    WorkerHangError,
    await_with_deadline,
    call_with_deadline,
    wait_with_deadline,
)
from hybridflow.single_controller.base.stacks import parse_stacks, where
from hybridflow.single_controller.inprocess import InProcessWorkerGroup
from tests.subprocess_env import pythonpath_with


class FakeClock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_deadline_is_idle_time_and_progress_restarts_it():
    clock = FakeClock()
    d = Deadline(10.0, clock=clock)
    clock.now += 9.9
    assert not d.expired() and d.remaining() == pytest.approx(0.1)
    d.progress()  # at t=109.9: the next 10 s start now
    clock.now += 9.9
    assert not d.expired()
    clock.now += 0.1
    assert d.expired() and d.waited_s == pytest.approx(19.9)  # 9.9 + 9.9 + 0.1


def test_deadline_reads_progress_and_a_changed_reading_counts():
    clock, reading = FakeClock(), {"v": 0}
    d = Deadline(8.0, progress=lambda: reading["v"], clock=clock)  # polled every min(2, 8/4) = 2 s
    clock.now += 2.0
    assert not d.expired()  # first poll: baseline 0
    reading["v"] = 1
    clock.now += 5.0
    assert not d.expired()  # t=7: changed reading → last progress at 7
    clock.now += 7.0
    assert not d.expired()  # t=14: 7 s idle < 8, reading unchanged
    clock.now += 1.0
    assert d.expired()  # t=15: 8 s idle


def test_watchdog_scales_with_rows_per_rank_and_can_be_off():
    wd = Watchdog(timeout_s=100)
    # 1024 rows per rank is the reference: twice as many rows, twice the time; fewer never less
    assert wd.scaled_timeout(0) == wd.scaled_timeout(512) == 100
    assert wd.scaled_timeout(2048) == 200
    assert Watchdog(timeout_s=None).deadline() is None and Watchdog(timeout_s=0).deadline() is None


def test_wait_with_deadline_returns_values_and_fails_fast():
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        futs = [pool.submit(lambda x=x: x * 2) for x in range(3)] + [7]
        assert wait_with_deadline(futs, 5.0) == [0, 2, 4, 7]
        bad = pool.submit(lambda: 1 / 0)
        slow = pool.submit(time.sleep, 1.5)
        start = time.monotonic()
        with pytest.raises(ZeroDivisionError):
            wait_with_deadline([slow, bad], 30.0)
        assert time.monotonic() - start < 1.0  # did not wait for the slow one


def test_wait_with_deadline_reports_the_driver_when_no_group(tmp_path):
    never = concurrent.futures.Future()
    wd = Watchdog(timeout_s=0.5, report_dir=str(tmp_path), poll_s=0.1)
    start = time.monotonic()
    with pytest.raises(WorkerHangError) as info:
        wait_with_deadline([never], watchdog=wd, what="rollout request 17")
    assert 0.5 <= time.monotonic() - start < 5
    assert "'rollout request 17' gave no answer" in str(info.value)
    with open(info.value.report_path) as f:
        assert "test_watchdog.py" in f.read()  # the driver's own stack: it was waiting here


def test_call_with_deadline_raises_in_the_calling_thread(tmp_path):
    wd = Watchdog(timeout_s=0.5, report_dir=str(tmp_path), poll_s=0.1)
    assert call_with_deadline(lambda a, b=0: a + b, 2, b=3, watchdog=wd, what="add") == 5
    with pytest.raises(KeyError):  # a failure of the call is the call's own exception
        call_with_deadline({}.__getitem__, "missing", watchdog=wd)
    start = time.monotonic()
    with pytest.raises(WorkerHangError) as info:
        call_with_deadline(time.sleep, 20, watchdog=wd, what="weight sync")
    assert time.monotonic() - start < 5
    assert "'weight sync' gave no answer" in str(info.value)
    assert info.value.report_path.startswith(str(tmp_path))
    # a call that reports progress on the deadline outlives it
    d = Deadline(0.5)

    def moving():
        for _ in range(10):
            time.sleep(0.1)
            d.progress()
        return "done"

    assert call_with_deadline(moving, deadline=d, watchdog=wd) == "done"


def test_await_with_deadline(tmp_path):
    wd = Watchdog(timeout_s=0.4, report_dir=str(tmp_path), poll_s=0.1)

    async def main():
        assert await await_with_deadline(asyncio.sleep(0.05, result="ok"), watchdog=wd) == "ok"
        await await_with_deadline(asyncio.sleep(30), watchdog=wd, what="generate")

    with pytest.raises(WorkerHangError, match="'generate' gave no answer"):
        asyncio.run(main())


FAULTHANDLER_DUMP = """Thread 0x00007f1e1c8b76c0 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 327 in wait
  File "/usr/lib/python3.11/threading.py", line 1002 in _bootstrap

Current thread 0x00007f1e5cc81b80 (most recent call first):
  File "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", line 3252 in all_reduce
  File "/venv/lib/python3.11/site-packages/torch/distributed/c10d_logger.py", line 83 in wrapper
  File "/home/me/my_worker.py", line 147 in actor_step
  File "/home/me/hybridflow/single_controller/base/decorator.py", line 173 in inner
  File "/venv/lib/python3.11/site-packages/ray/_private/worker.py", line 1069 in main_loop
"""

PY_SPY_DUMP = """Process 1332: ray::Worker.step
Python v3.11.7 (/usr/bin/python3.11)

Thread 1332 (idle): "MainThread"
    all_reduce (torch/distributed/distributed_c10d.py:3252)
    actor_step (/home/me/my_worker.py:147)
    main_loop (ray/_private/worker.py:1069)
Thread 1400 (idle): "Thread-1"
    wait (threading.py:327)
"""


@pytest.mark.parametrize("dump", [FAULTHANDLER_DUMP, PY_SPY_DUMP])
def test_where_names_the_innermost_frame_and_the_callers_own_code(dump):
    threads = parse_stacks(dump)
    assert len(threads) == 2
    line = where(dump, "actor_step")
    assert line.startswith("all_reduce (") and line.endswith("<- actor_step (/home/me/my_worker.py:147)"), line


# py-spy 0.4: qualified names and thread states; the thread running the method is not the first one listed
PY_SPY_04_DUMP = """Process 1332: ray::HangWorker.step
Python v3.11.7 (/usr/bin/python3.11)

Thread 1400 (idle): "Thread-1 (poll)"
    Event.wait (threading.py:629)
    Poller.poll (/home/me/poller.py:20)
    Thread.run (threading.py:982)
Thread 1332 (idle): "MainThread"
    all_reduce (torch/distributed/distributed_c10d.py:3252)
    HangWorker.actor_step (/home/me/my_worker.py:147)
    main_loop (ray/_private/worker.py:1069)
"""


@pytest.mark.parametrize("method", ["actor_step", "actor_rollout_actor_step"])
def test_the_busy_thread_is_found_by_its_method_under_a_qualified_name(method):
    line = where(PY_SPY_04_DUMP, method)
    spot = "all_reduce (torch/distributed/distributed_c10d.py:3252)"
    assert line == f"{spot} <- HangWorker.actor_step (/home/me/my_worker.py:147)"


def test_inprocess_call_past_its_deadline(tmp_path):
    group = InProcessWorkerGroup(W.EchoWorker, name_prefix="inproc_hang")
    group.set_watchdog(Watchdog(timeout_s=0.5, report_dir=str(tmp_path), poll_s=0.1))
    assert group.set_value(3) == [0]  # fast calls are untouched
    start = time.monotonic()
    with pytest.raises(WorkerHangError) as info:
        group.sleep(20)
    assert time.monotonic() - start < 5
    msg = str(info.value)
    assert "stuck in sleep (" in msg and "workers_for_tests.py" in msg and info.value.rank == 0
    assert os.path.exists(info.value.report_path)


CHILD = """
import importlib.util, os, sys, time
# stacks.py by its path: the package would import torch, slow to start on a loaded machine
spec = importlib.util.spec_from_file_location("stacks", os.environ["STACKS_PY"])
stacks = sys.modules["stacks"] = importlib.util.module_from_spec(spec)
spec.loader.exec_module(stacks)
install_stack_dump_handler = stacks.install_stack_dump_handler

def waiting_in_a_known_place():
    print("ready", flush=True)
    time.sleep(60)

assert install_stack_dump_handler()
waiting_in_a_known_place()
"""


@pytest.mark.parametrize("freeze", [False, True])
def test_dump_stacks_of_a_live_and_of_a_stopped_process(freeze, monkeypatch):
    import signal
    import subprocess
    import sys

    from hybridflow.single_controller.base import stacks
    from hybridflow.single_controller.base.stacks import STACK_TOOL_ENV, dump_stacks, stack_file_of

    monkeypatch.setenv(STACK_TOOL_ENV, "faulthandler")
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "STACKS_PY": stacks.__file__},
    )
    try:
        assert child.stdout.readline().strip() == "ready"
        if freeze:
            os.kill(child.pid, signal.SIGSTOP)
            time.sleep(0.2)
        info = dump_stacks(child.pid)
        # a live process is sleeping in time.sleep, or momentarily running (the signal handler, a loaded machine)
        assert info["state"] in (("stopped",) if freeze else ("sleeping", "running")) and info["tool"] == "faulthandler"
        assert where(info["text"]).startswith("waiting_in_a_known_place (<string>:")
        assert child.poll() is None  # SIGUSR1 did not kill it: the handler answered
    finally:
        child.kill()
        child.wait()
    # a process without the handler is never signalled (SIGUSR1's default action would kill it)
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        time.sleep(0.3)
        assert not os.path.exists(stack_file_of(sleeper.pid))
        info = dump_stacks(sleeper.pid, timeout_s=0.5)
        assert info["tool"] is None and "no stack" in info["text"] and sleeper.poll() is None
    finally:
        sleeper.kill()
        sleeper.wait()


BACKGROUND_DRIVER = """
import signal, sys, time
signal.signal(signal.SIGINT, signal.SIG_IGN)  # as in every process started with '&' from a script
import workers_for_tests as W
from hybridflow.single_controller.base import Watchdog, WorkerHangError
from hybridflow.single_controller.inprocess import InProcessWorkerGroup

group = InProcessWorkerGroup(W.EchoWorker, name_prefix="background")
group.set_watchdog(Watchdog(timeout_s=1.0, report_dir=sys.argv[1], poll_s=0.1))
assert group.set_value(3) == [0]
start = time.monotonic()
try:
    group.sleep(120)
except WorkerHangError as e:
    print(f"caught WorkerHangError after {time.monotonic() - start:.1f}s: {e.report_path}", flush=True)
# alive: a fresh group answers, the hung one refuses politely, and the process ends on its own
fresh = InProcessWorkerGroup(W.EchoWorker, name_prefix="after_the_hang")
print("fresh group answers", fresh.add(1, 2), flush=True)
try:
    group.set_value(4)
except Exception as e:
    print("hung group refuses:", type(e).__name__, flush=True)
fresh.shutdown()
print("clean end", flush=True)
"""


def test_a_hang_in_a_background_launch_raises_and_the_process_lives_on(tmp_path):
    """SIGINT ignored (a background launch), the machine busy or not: the driver gets WorkerHangError
    where it waits, the report is printed and written, and the process carries on and exits 0."""
    import subprocess
    import sys

    tests_dir = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(os.path.dirname(tests_dir))
    env = {**os.environ, "PYTHONPATH": pythonpath_with(tests_dir, root)}
    out = subprocess.run(
        [sys.executable, "-c", BACKGROUND_DRIVER, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
        stdin=subprocess.DEVNULL,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "caught WorkerHangError after" in out.stdout
    assert "'sleep' gave no answer" in out.stderr and "stuck in sleep (" in out.stderr  # the report, printed
    assert os.listdir(tmp_path)  # ... and written
    assert "fresh group answers [3]" in out.stdout
    assert "hung group refuses: WorkerGroupShutDownError" in out.stdout
    assert out.stdout.rstrip().endswith("clean end")
