"""The watchdog on Ray worker groups: a deadlocked collective and a frozen (SIGSTOPped) worker are
reported with every rank's stacks, the stuck rank and its function named, and the group shut down;
a call that reports progress outlives its deadline."""

import os
import re
import shutil
import signal
import time

import pytest

ray = pytest.importorskip("ray")
psutil = pytest.importorskip("psutil")

import workers_for_tests as W  # noqa: E402

from hybridflow.single_controller.base import Watchdog, WorkerHangError  # noqa: E402
from hybridflow.single_controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup  # noqa: E402

ray.cloudpickle.register_pickle_by_value(W)


@pytest.fixture
def group(ray_session, tmp_path):
    pool = RayResourcePool(process_on_nodes=[2], use_gpu=False)
    wg = RayWorkerGroup(pool, RayClassWithInitArgs(cls=ray.remote(W.HangWorker)), name_prefix=f"hang_{time.time_ns()}")
    # 5 s: long enough for the ranks that are not stuck to answer on a loaded 2-core machine
    wg.set_watchdog(Watchdog(timeout_s=5.0, report_dir=str(tmp_path / "watchdog")))
    yield wg
    wg.shutdown()
    pool.release()


def _gone(pids, within_s=20.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if not any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE for p in pids):
            return True
        time.sleep(0.2)
    return False


def _report(err: WorkerHangError) -> str:
    assert err.report_path and os.path.exists(err.report_path)
    with open(err.report_path) as f:
        return f.read()


def test_deadlocked_collective(group, tmp_path):
    pids = group.pid()
    assert group.join_process_group() == [0, 1]
    start = time.monotonic()
    with pytest.raises(WorkerHangError) as info:
        group.all_reduce_only_on(0)  # rank 0 waits in all_reduce for a rank 1 that already returned
    elapsed = time.monotonic() - start
    err = info.value
    msg = str(err)
    # rank 0 is the one stuck, in torch's all_reduce, called from the worker's own method
    assert err.rank == 0 and err.stuck_ranks == [0]
    assert "waiting on ranks [0]; answered: [1]" in msg
    stuck_line = next(line for line in msg.splitlines() if line.startswith("rank 0"))
    assert "still running 'all_reduce_only_on', stuck in all_reduce (" in stuck_line
    # py-spy 0.4 names the method with its class (HangWorker.all_reduce_only_on), faulthandler without
    assert re.search(r"<- (HangWorker\.)?all_reduce_only_on \(", stuck_line) and "workers_for_tests.py" in stuck_line
    # the file holds both ranks' full stacks and sits where the watchdog was told
    report = _report(err)
    assert os.path.dirname(err.report_path) == str(tmp_path / "watchdog")
    assert "===== rank 0" in report and "===== rank 1" in report and "distributed_c10d.py" in report
    # deadline 5 s + taking the stacks; far from gloo's own 600 s timeout
    assert 5.0 <= elapsed < 30, elapsed
    assert _gone(pids), "the hung group's workers were not shut down"


@pytest.mark.parametrize("tool", ["faulthandler", "py-spy"])
def test_frozen_worker(group, tool, monkeypatch, tmp_path):
    if tool == "py-spy" and shutil.which("py-spy") is None:
        pytest.skip("py-spy is not on PATH (optional: pip install py-spy)")
    monkeypatch.setenv("HYBRIDFLOW_STACK_TOOL", tool)
    pids = group.pid()
    # rank 1 sleeps long: on a loaded machine the SIGSTOP below came once only after a 2 s sleep had ended
    handles = group.execute_all_async("sleep", 2.0, marker_dir=str(tmp_path), rank_seconds={1: 60.0})
    deadline = time.monotonic() + 30
    while not os.path.exists(tmp_path / "sleeping.1") and time.monotonic() < deadline:
        time.sleep(0.02)
    time.sleep(0.05)  # from the marker's write into time.sleep
    os.kill(pids[1], signal.SIGSTOP)  # alive but frozen inside sleep()
    try:
        with pytest.raises(WorkerHangError) as info:
            group._resolve("sleep", [0, 1], handles)
    finally:
        if psutil.pid_exists(pids[1]):
            os.kill(pids[1], signal.SIGCONT)
    err = info.value
    msg = str(err)
    assert err.rank == 1 and err.stuck_ranks[0] == 1  # the frozen rank comes first
    line = next(line for line in msg.splitlines() if line.startswith("rank 1"))
    assert "FROZEN (process stopped" in line, line
    # the one-line summary names the busy thread's innermost frame, which on a loaded machine was once another
    # thread's wait; the report's stacks of the stopped rank always hold the method's frame
    report = _report(err)
    assert f"===== rank 1: pid {pids[1]} " in report and f"state=stopped via {tool} =====" in report
    rank1 = report.split(f"===== rank 1: pid {pids[1]} ", 1)[1].split("===== rank", 1)[0]
    assert "workers_for_tests.py" in rank1 and "sleep" in rank1, rank1[-2000:]
    assert _gone(pids)


def test_progress_extends_the_deadline(group):
    group.set_watchdog(Watchdog(timeout_s=2.5, report_dir=group.watchdog.report_dir))
    # 12 × 0.5 s = 6 s of work, 2.4× the deadline, reporting progress every 0.5 s: no verdict
    start = time.monotonic()
    assert group.work(12, 0.5, True) == [0, 1]
    assert time.monotonic() - start >= 6.0
    # the same work without progress reports is stuck as far as the watchdog can tell
    with pytest.raises(WorkerHangError) as info:
        group.work(12, 0.5, False)
    assert sorted(info.value.stuck_ranks) == [0, 1]


def test_future_of_a_non_blocking_call_waits_under_the_deadline(group):
    group.set_watchdog(Watchdog(timeout_s=3.0, report_dir=group.watchdog.report_dir))
    assert group.sleep_later(0.1).get() == [0, 1]
    future = group.sleep_later(30)  # returns at once; the wait is in get()
    start = time.monotonic()
    with pytest.raises(WorkerHangError) as info:
        future.get()
    assert time.monotonic() - start < 20 and re.search(r"stuck in (HangWorker\.)?sleep_later \(", str(info.value))


@pytest.mark.slow
def test_worker_stuck_in_init(ray_session, tmp_path, monkeypatch):
    """The group's construction waits under the process default watchdog; the stuck rank's pid is
    found in Ray's actor table although its __init__ never returned. (Slow: the deadline must
    outlast starting the processes, 5-20 s here, so that rank 1's handler is in place.)"""
    from hybridflow.single_controller.base import watchdog

    monkeypatch.setattr(watchdog, "_default", Watchdog(timeout_s=25.0, report_dir=str(tmp_path)))
    pool = RayResourcePool(process_on_nodes=[2], use_gpu=False)
    try:
        with pytest.raises(WorkerHangError) as info:
            RayWorkerGroup(pool, RayClassWithInitArgs(cls=ray.remote(W.SlowInitWorker)), name_prefix="slow_init")
    finally:
        pool.release()
    err = info.value
    assert err.method == "__init__" and 1 in err.stuck_ranks
    line = next(line for line in str(err).splitlines() if line.startswith("rank 1"))
    assert re.search(r"stuck in (SlowInitWorker\.)?__init__ \(", line) and "workers_for_tests.py" in line, line
