"""Clean up after this process when it dies without doing so itself (SIGKILL, the OOM killer, a killed Ray actor).

vLLM's engine core process waits on its sockets for good once the process that started it is gone: a SIGKILLed
trainer left the engine core and its worker behind (the model and the KV cache; on a GPU, its memory), and the
/dev/shm files the weights travel through. The reaper is a small process (standard library only, its own session,
SIGINT ignored) that reads from a pipe what to clean up: processes (pid and start time, so a reused pid is never
hit) and paths (glob patterns). The pipe ends when the process holding its other end ends, however it ends;
without a goodbye first, the reaper stops the processes it was told of (SIGTERM, SIGKILL after a grace period;
their descendants too) and removes the paths. What the owner cleaned up itself it takes back (``forget_*``), so a
clean exit leaves nothing for the reaper to do. Linux only (it reads /proc); elsewhere it is not started.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
from collections import Counter

from hybridflow.utils.orphan_reaper_process import start_time

logger = logging.getLogger(__name__)

REAPER_TAG = "hybridflow-orphan-reaper"  # in the reaper's command line: how tests and ps tell it apart
GRACE_S = 10.0  # from SIGTERM to SIGKILL: vLLM's engine core stops its workers on SIGTERM

# the reaper's own program: standard library only, run as ``python -I <it> REAPER_TAG <owner pid> <grace s>``
_REAPER_PROGRAM = os.path.join(os.path.dirname(os.path.abspath(__file__)), "orphan_reaper_process.py")


def child_pids(pid: int) -> set[int]:
    """The direct children of ``pid``."""
    import psutil

    try:
        return {child.pid for child in psutil.Process(pid).children()}
    except psutil.NoSuchProcess:
        return set()


class WatchNewChildren:
    """While a block runs (``with``), hands ``reaper`` each new child of this process that ``is_wanted(pid)``
    accepts as soon as it appears (polled): a process killed while, say, vLLM is still starting leaves nothing
    behind either. ``found``: the pids handed over, in order."""

    def __init__(self, reaper: OrphanReaper, is_wanted, poll_s: float = 0.2):
        self.reaper, self.is_wanted, self.poll_s = reaper, is_wanted, poll_s
        self.found: list[int] = []
        self._stop = threading.Event()

    def __enter__(self) -> WatchNewChildren:
        self._before = child_pids(os.getpid())
        self._thread = threading.Thread(target=self._watch, name="orphan-reaper-watch", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self._poll()  # what appeared after the last poll

    def _watch(self) -> None:
        while not self._stop.wait(self.poll_s):
            self._poll()

    def _poll(self) -> None:
        # a child not (yet) wanted is asked again next time: right after its fork it still shows our command line
        for pid in sorted(child_pids(os.getpid()) - self._before - set(self.found)):
            if self.is_wanted(pid):
                self.reaper.watch_process(pid)
                self.found.append(pid)


class OrphanReaper:
    """This process's reaper (module docstring). Owners register what they start and take it back when they
    clean it up themselves; counted, so two owners may register the same path pattern."""

    def __init__(self, grace_s: float = GRACE_S):
        self.owner = os.getpid()
        self._lock = threading.Lock()
        self._paths: Counter = Counter()
        self._proc = subprocess.Popen(
            [sys.executable, "-I", _REAPER_PROGRAM, REAPER_TAG, str(self.owner), str(grace_s)],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            start_new_session=True,  # a Ctrl-C or a kill of the owner's process group does not end it first
            close_fds=True,
            text=True,
        )
        self._broken = False

    @property
    def pid(self) -> int:
        return self._proc.pid

    def _send(self, line: str) -> None:
        with self._lock:
            if self._broken:
                return
            try:
                self._proc.stdin.write(line + "\n")
                self._proc.stdin.flush()
            except (BrokenPipeError, OSError, ValueError) as e:
                self._broken = True  # cleaning up after a crash is a courtesy: never fail the run over it
                logger.warning(
                    "the orphan reaper (pid %s) is gone (%s): a crash will leave processes behind", self.pid, e
                )

    def watch_process(self, pid: int) -> None:
        start = start_time(pid)  # as the reaper reads it (/proc/<pid>/stat), to compare with it
        if start is not None:
            self._send(f"pid {pid} {start}")

    def forget_process(self, pid: int) -> None:
        self._send(f"unpid {pid}")

    def watch_path(self, pattern: str) -> None:
        """Remove what matches ``pattern`` (a glob; a folder with its contents) if this process dies."""
        with self._lock:
            self._paths[pattern] += 1
            first = self._paths[pattern] == 1
        if first:
            self._send(f"path {pattern}")

    def forget_path(self, pattern: str) -> None:
        with self._lock:
            if self._paths[pattern] <= 0:
                return
            self._paths[pattern] -= 1
            last = self._paths[pattern] == 0
        if last:
            self._send(f"unpath {pattern}")

    def close(self) -> None:
        """Say goodbye (nothing is cleaned up) and let the reaper end."""
        self._send("exit")
        with self._lock:
            self._broken = True
            try:
                self._proc.stdin.close()
            except OSError:
                pass
        try:
            self._proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()


_reaper: OrphanReaper | None = None
_reaper_lock = threading.Lock()


def orphan_reaper() -> OrphanReaper | None:
    """The reaper of this process, started on first use; None where there is no /proc (not Linux). A forked
    child gets a reaper of its own: the parent's reaper must not outlive the parent on the child's behalf."""
    global _reaper
    if not os.path.isdir("/proc/self"):
        return None
    with _reaper_lock:
        if _reaper is None or _reaper.owner != os.getpid():
            try:
                _reaper = OrphanReaper()
            except OSError as e:
                logger.warning("could not start the orphan reaper (%s): a crash will leave processes behind", e)
                return None
        return _reaper


def _after_fork_in_child() -> None:
    """A forked child holds a copy of the pipe's write end, which would keep the parent's reaper waiting until
    the child ends too: point that descriptor at /dev/null (the file object stays valid; nothing is written)."""
    global _reaper_lock
    _reaper_lock = threading.Lock()  # another thread may have held it at the fork
    reaper = _reaper
    if reaper is None or reaper._proc.stdin is None or reaper._proc.stdin.closed:
        return
    reaper._broken, reaper._lock = True, threading.Lock()
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, reaper._proc.stdin.fileno())
        finally:
            os.close(devnull)
    except OSError:
        pass


os.register_at_fork(after_in_child=_after_fork_in_child)
