"""The watchdog's primitives without Ray: idle deadlines, the three wait wrappers, the stack parser,
and the in-process backend's calls under a deadline."""

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
    wait_with_deadline,
    watch,
)
from hybridflow.single_controller.base.stacks import parse_stacks, where
from hybridflow.single_controller.inprocess import InProcessWorkerGroup


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
    assert d.expired()      # t=15: 8 s idle


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


def test_watch_interrupts_blocking_code(tmp_path):
    wd = Watchdog(timeout_s=0.5, report_dir=str(tmp_path), poll_s=0.1)
    start = time.monotonic()
    with pytest.raises(WorkerHangError) as info:
        with watch("weight sync", watchdog=wd) as d:
            assert isinstance(d, Deadline)
            time.sleep(20)
    assert time.monotonic() - start < 5
    assert info.value.report_path.startswith(str(tmp_path))
    # progress inside the block keeps it alive past the deadline
    with watch("weight sync", watchdog=wd) as d:
        for _ in range(10):
            time.sleep(0.1)
            d.progress()


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
    child = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "STACKS_PY": stacks.__file__})
    try:
        assert child.stdout.readline().strip() == "ready"
        if freeze:
            os.kill(child.pid, signal.SIGSTOP)
            time.sleep(0.2)
        info = dump_stacks(child.pid)
        assert info["state"] == ("stopped" if freeze else "sleeping") and info["tool"] == "faulthandler"
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


UNINTERRUPTIBLE = """
import signal, time
from hybridflow.single_controller.base import watch
signal.signal(signal.SIGINT, signal.SIG_IGN)  # nothing can interrupt the main thread's wait
with watch("stuck forever", 0.5, grace_s=0.5):
    time.sleep(60)
print("not reached")
"""


def test_watch_exits_the_process_when_the_main_thread_never_comes_back(tmp_path):
    import subprocess
    import sys

    from hybridflow.single_controller.base.watchdog import EXIT_CODE_HANG

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    start = time.monotonic()
    out = subprocess.run([sys.executable, "-c", UNINTERRUPTIBLE], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": root, "TMPDIR": str(tmp_path)})
    assert out.returncode == EXIT_CODE_HANG, out.stderr[-2000:]
    assert "'stuck forever' gave no answer" in out.stderr and f"exiting with code {EXIT_CODE_HANG}" in out.stderr
    assert "not reached" not in out.stdout
    assert os.listdir(tmp_path / "hybridflow_watchdog")  # the report was written before the exit
    assert time.monotonic() - start < 60  # not the 60 s sleep
