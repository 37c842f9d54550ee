"""The watchdog: every wait of the driver on workers has a deadline, and a passed deadline explains itself.

A deadline is an *idle* deadline: it passes when ``timeout_s`` go by with no answer and no progress.
A phase that reports progress (workers: ``report_progress()``; driver code: ``deadline.progress()``)
pushes it back, so a long generation that keeps moving is never cut, while a stuck one is.

Every wait is a loop of bounded waits in the waiting thread itself. When the deadline passes, that
thread takes the Python stacks of every worker of the group (py-spy or faulthandler, see
``stacks.py``), writes them to one file under ``Watchdog.report_dir``, logs (ERROR) which rank is stuck and
in which function, shuts the group's workers down and raises ``WorkerHangError``. Nothing here ends
or signals the process: the caller decides (``python -m hybridflow.main_ppo`` exits with a code of its
own; a user's script, a notebook or a test runner gets the exception and lives on).

Three ways to put a deadline around a wait (WorkerGroup calls of both backends use them already):

- ``wait_with_deadline(futures, deadline, group, what)``: Ray ObjectRefs and/or concurrent Futures;
- ``call_with_deadline(fn, *args, deadline=..., group=..., what=...)``: any blocking call, run in a
  thread of its own (``CallThread``) while the caller waits in bounded steps;
- ``await await_with_deadline(awaitable, deadline, group, what)`` inside asyncio code.

``deadline`` is a ``Deadline``, a number of seconds, or None (the group's watchdog, else the default).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import os
import queue
import re
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hybridflow.single_controller.base.errors import WorkerHangError
from hybridflow.single_controller.base.stacks import format_own_stacks, where

logger = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 1800.0
# a call's deadline grows with the rows each rank gets beyond this many (generous: seconds per row
# vary 1000x between a tiny CPU model and a 70B one; the deadline only has to catch a stuck call)
REFERENCE_ROWS_PER_RANK = 1024


@dataclass(frozen=True)
class Watchdog:
    """Deadline settings of a run. ``timeout_s`` None or <= 0 turns the watchdog off."""

    timeout_s: float | None = DEFAULT_TIMEOUT_S
    report_dir: str | None = None  # None: <tmp>/hybridflow_watchdog
    poll_s: float = 0.5

    @property
    def enabled(self) -> bool:
        return self.timeout_s is not None and self.timeout_s > 0

    def scaled_timeout(self, rows_per_rank: int = 0) -> float:
        return float(self.timeout_s) * max(1.0, rows_per_rank / REFERENCE_ROWS_PER_RANK)

    def deadline(self, rows_per_rank: int = 0, progress: Callable[[], Any] | None = None) -> Deadline | None:
        if not self.enabled:
            return None
        return Deadline(self.scaled_timeout(rows_per_rank), progress=progress)

    def report_directory(self) -> str:
        return self.report_dir or os.path.join(tempfile.gettempdir(), "hybridflow_watchdog")


_default = Watchdog()


def default_watchdog() -> Watchdog:
    return _default


class Deadline:
    """Passes ``timeout_s`` after the last progress (the start counts as progress).

    ``progress`` (optional) is read every few seconds; a changed reading counts as progress."""

    def __init__(self, timeout_s: float, progress: Callable[[], Any] | None = None, clock=time.monotonic):
        self.timeout_s = float(timeout_s)
        self._clock = clock
        self.started = self._last = self._last_poll = clock()
        self._progress_fn = progress
        self._reading: Any = None
        self._poll_every = min(2.0, self.timeout_s / 4)

    def progress(self) -> None:
        """Something moved: the deadline restarts from now."""
        self._last = self._clock()

    def _poll_progress(self, now: float) -> None:
        if self._progress_fn is None or now - self._last_poll < self._poll_every:
            return
        first = self._last_poll == self.started
        self._last_poll = now
        try:
            reading = self._progress_fn()
        except Exception:
            return
        if not first and reading != self._reading:
            self._last = now
        self._reading = reading

    def expired(self) -> bool:
        now = self._clock()
        self._poll_progress(now)
        return now - self._last >= self.timeout_s

    def remaining(self) -> float:
        return max(0.0, self.timeout_s - (self._clock() - self._last))

    @property
    def waited_s(self) -> float:
        return self._clock() - self.started


def _as_deadline(deadline, group, watchdog: Watchdog | None) -> Deadline | None:
    if isinstance(deadline, Deadline):
        return deadline
    progress = getattr(group, "_progress_reading", None)
    if deadline is not None:
        return Deadline(float(deadline), progress=progress) if float(deadline) > 0 else None
    wd = watchdog or getattr(group, "watchdog", None) or default_watchdog()
    return wd.deadline(progress=progress)


def _watchdog_of(group, watchdog: Watchdog | None) -> Watchdog:
    return watchdog or getattr(group, "watchdog", None) or default_watchdog()


# ---------------------------------------------------------------- the report


def _rank_line(rank, info: dict, pending: bool, method: str) -> str:
    where_from = f", {info['location']}" if info.get("location") else ""
    head = f"{'rank ' if isinstance(rank, int) else ''}{rank} (pid {info.get('pid')}{where_from})"
    state = info.get("state")
    if state in ("gone", "zombie"):
        return f"{head}: process gone (killed or exited)"
    if info.get("error"):
        return f"{head}: {info['error']}"
    spot = where(info.get("text", ""), method)
    if spot.startswith("unknown") and info.get("text", "").startswith("("):
        spot = f"unknown {info['text']}"
    if state == "stopped":
        return f"{head}: FROZEN (process stopped, e.g. SIGSTOP) at {spot}"
    if not pending:
        return f"{head}: answered"
    return f"{head}: still running {method!r}, stuck in {spot}"


def _stuck_order(stacks: dict, pending: list) -> list:
    frozen = [r for r, i in stacks.items() if i.get("state") == "stopped"]
    gone = [
        r for r in pending if stacks.get(r, {}).get("state") in ("gone", "zombie") or stacks.get(r, {}).get("error")
    ]
    rest = [r for r in pending if r not in frozen and r not in gone]
    return frozen + [r for r in gone if r not in frozen] + rest


def build_hang_error(
    what: str,
    deadline: Deadline,
    group=None,
    pending_ranks=None,
    watchdog: Watchdog | None = None,
    shutdown: bool = True,
) -> WorkerHangError:
    """Take the stacks, write the report, log the summary (ERROR), shut the group down; return the error."""
    wd = _watchdog_of(group, watchdog)
    name = getattr(group, "name", "driver")
    method = what
    started = time.monotonic()
    if group is not None:
        ranks = list(range(group.world_size))
        pending = list(ranks if pending_ranks is None else pending_ranks)
        stacks = group._collect_stacks(ranks)
    else:
        pending = ["driver"]
        stacks = {"driver": {"pid": os.getpid(), "state": "running", "tool": "traceback", "text": format_own_stacks()}}
    order = _stuck_order(stacks, pending)
    lines = [
        f"hybridflow watchdog: worker group {name!r}, {what!r} gave no answer and reported no progress "
        f"for {deadline.timeout_s:.1f}s (waited {deadline.waited_s:.1f}s in all; trainer.watchdog_timeout)"
    ]
    if group is not None:
        lines.append(f"waiting on ranks {pending}; answered: {[r for r in stacks if r not in pending]}")
    lines += [_rank_line(r, stacks[r], r in pending, method) for r in order]
    lines += [_rank_line(r, i, r in pending, method) for r, i in stacks.items() if r not in order]
    path = _write_report(wd.report_directory(), name, method, lines, stacks)
    lines.append(f"stacks of every rank: {path}" if path else "(the report file could not be written)")
    lines.append(f"(stacks taken in {time.monotonic() - started:.1f}s)")
    summary = "\n".join(lines)
    logger.error(summary)
    if group is not None and shutdown:
        with contextlib.suppress(Exception):  # a deadlocked collective cannot be undone: free the devices
            _shut_down(group, f"the watchdog found {method!r} hung; report: {path}")
        summary += "\nthe group's workers were shut down"
    first = order[0] if order else (pending[0] if pending else -1)
    return WorkerHangError(
        name,
        method,
        first if isinstance(first, int) else -1,
        summary,
        stuck_ranks=[r for r in order if isinstance(r, int)],
        report_path=path,
    )


def _shut_down(group, reason: str) -> None:
    """``group.shutdown(reason=...)``; a user's group whose ``shutdown`` takes no reason is shut down all the same."""
    try:
        group.shutdown(reason=reason)
    except TypeError:
        group.shutdown()


def _write_report(directory: str, group: str, method: str, lines: list[str], stacks: dict) -> str | None:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{group}_{method}")[:80]
    try:
        os.makedirs(directory, exist_ok=True)
        path = os.path.join(directory, f"hang_{stamp}_{slug}_{os.getpid()}.txt")
        with open(path, "w") as f:
            f.write("\n".join(lines) + "\n")
            for rank, info in stacks.items():
                f.write(
                    f"\n===== rank {rank}: pid {info.get('pid')} {info.get('location', '')} state={info.get('state')} "
                    f"via {info.get('tool')} =====\n{info.get('error') or info.get('text') or '(no stack)'}\n"
                )
        return path
    except OSError:
        return None


# ---------------------------------------------------------------- the waits


def _ref_type():
    if "ray" not in sys.modules:  # nothing can be a Ray ObjectRef; Ray stays optional
        return None
    import ray

    return ray.ObjectRef


def wait_with_deadline(
    futures: list,
    deadline=None,
    group=None,
    what: str = "wait",
    ranks: list | None = None,
    watchdog: Watchdog | None = None,
    threads: list | None = None,
) -> list:
    """Values of ``futures`` (Ray ObjectRefs, concurrent Futures or plain values), in order.

    A future that fails raises at once. When the deadline passes, the stacks of ``group`` (or of the
    driver when None) are reported and ``WorkerHangError`` is raised; ``ranks[i]`` is the rank
    behind ``futures[i]`` (default: i) so the report says who did not answer. ``threads``: idents of
    this process's threads doing the work; their time in a debugger (``breakpoint()``) is the
    user's, not a hang."""
    futures = list(futures)
    threads = [t for t in (threads or []) if t is not None]
    d = _as_deadline(deadline, group, watchdog)
    poll = _watchdog_of(group, watchdog).poll_s
    ref_type = _ref_type()
    ranks = list(range(len(futures))) if ranks is None else list(ranks)
    pending = set(range(len(futures)))
    while True:
        pending = {i for i in pending if not _done(futures[i], ref_type)}
        if not pending:
            break
        ref_pending = [futures[i] for i in pending if ref_type and isinstance(futures[i], ref_type)]
        other_pending = [futures[i] for i in pending if not (ref_type and isinstance(futures[i], ref_type))]
        if ref_pending:
            import ray

            ready, _ = ray.wait(ref_pending, num_returns=1, timeout=poll if not other_pending else 0.05)
            if ready:
                ray.get(ready)  # fail fast: a failed rank's peers may be stuck waiting for it
        if other_pending:
            done, _ = concurrent.futures.wait(
                other_pending, timeout=poll if not ref_pending else 0.05, return_when=concurrent.futures.FIRST_EXCEPTION
            )
            for f in done:
                f.result()
        if d is not None and any(_debugger_active(t) for t in threads):
            d.progress()
        if d is not None and d.expired():
            raise build_hang_error(what, d, group, sorted(ranks[i] for i in pending), watchdog)
    out = []
    for f in futures:
        if ref_type and isinstance(f, ref_type):
            import ray

            out.append(ray.get(f))
        elif isinstance(f, concurrent.futures.Future):
            out.append(f.result())
        else:
            out.append(f)
    return out


def _done(f, ref_type) -> bool:
    if ref_type and isinstance(f, ref_type):
        import ray

        return bool(ray.wait([f], timeout=0)[0])
    if isinstance(f, concurrent.futures.Future):
        return f.done()
    return True


def _debugger_active(thread_ident: int) -> bool:
    """A pdb/bdb session (``breakpoint()``) in that thread: its time is the user's, not a hang."""
    import bdb

    frame = sys._current_frames().get(thread_ident)
    while frame is not None:
        if isinstance(getattr(frame.f_trace, "__self__", None), bdb.Bdb):
            return True
        frame = frame.f_back
    return False


class CallThread:
    """A daemon thread that runs the calls given to it, one after another, each answering a Future.

    Work that cannot itself be waited on with a timeout (a blocking call into a library, a worker
    method run in the driver's process) runs here, so that the thread that waits for it can wait in
    bounded steps, check its deadline and raise ``WorkerHangError`` where it waits. A call that never
    returns keeps this thread; the process can still exit (daemon), and ``close()`` stops the thread
    once its current call is done."""

    def __init__(self, name: str = "hybridflow-call"):
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self.busy = False  # a call is running (it may be stuck: a hang)
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._thread.start()

    @property
    def ident(self) -> int | None:
        return self._thread.ident

    def is_current(self) -> bool:
        return threading.current_thread() is self._thread

    def submit(self, fn: Callable, *args, **kwargs) -> concurrent.futures.Future:
        future: concurrent.futures.Future = concurrent.futures.Future()
        self._jobs.put((future, fn, args, kwargs))
        return future

    def _serve(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            future, fn, args, kwargs = job
            if not future.set_running_or_notify_cancel():
                continue
            self.busy = True
            try:
                future.set_result(fn(*args, **kwargs))
            except BaseException as e:  # noqa: BLE001 - handed to the waiting thread
                future.set_exception(e)
            finally:
                self.busy = False

    def close(self) -> None:
        """No more calls; the thread ends after the one it runs (not waited for: it may be stuck)."""
        self._jobs.put(None)


def call_with_deadline(
    fn: Callable, *args, deadline=None, group=None, what: str = "call", watchdog: Watchdog | None = None, **kwargs
):
    """``fn(*args, **kwargs)`` under a deadline: it runs in a thread of its own while the calling
    thread waits in bounded steps; past the deadline the calling thread gets ``WorkerHangError`` (the
    stuck thread is left behind, a daemon). Time ``fn`` spends in a debugger does not count."""
    runner = CallThread(name=f"hybridflow-call:{what}"[:60])
    try:
        future = runner.submit(fn, *args, **kwargs)
        return wait_with_deadline([future], deadline, group, what, watchdog=watchdog, threads=[runner.ident])[0]
    finally:
        runner.close()


async def await_with_deadline(
    awaitable, deadline=None, group=None, what: str = "await", watchdog: Watchdog | None = None
):
    """``await awaitable`` under a deadline; on expiry it is cancelled and ``WorkerHangError`` raised
    (the report is built off the event loop)."""
    d = _as_deadline(deadline, group, watchdog)
    if d is None:
        return await awaitable
    poll = _watchdog_of(group, watchdog).poll_s
    task = asyncio.ensure_future(awaitable)
    while True:
        done, _ = await asyncio.wait({task}, timeout=poll)
        if done:
            return task.result()
        if d.expired():
            task.cancel()
            loop = asyncio.get_running_loop()
            raise await loop.run_in_executor(None, build_hang_error, what, d, group, None, watchdog)
