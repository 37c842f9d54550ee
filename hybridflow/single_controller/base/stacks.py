"""Python stacks of a worker process, taken from outside it, for the watchdog's hang reports.

Two ways, best first:

- ``py-spy dump --nonblocking`` when the ``py-spy`` executable is on PATH (it reads the process's
  memory: works on a stopped process and shows where a thread sits in native code too);
- ``faulthandler``: every worker process registers ``SIGUSR1`` at start
  (:func:`install_stack_dump_handler`) to append all its threads' stacks to a per-pid file; the
  collector signals the process and reads what was appended. The handler runs in C, so it answers
  even while the interpreter is blocked inside a collective or holds the GIL in native code.

A stopped process (SIGSTOP, state ``T``) cannot run a signal handler: the collector notes the state,
queues SIGUSR1 and sends SIGCONT, so the dump shows where it was frozen (the watchdog kills the
group right after). A process under a debugger (``tracing-stop``) is left alone.

Everything here runs on the node of the process it inspects (see ``ray/health.py`` for the Ray task
that carries it there).
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import time
from dataclasses import dataclass, field

STACK_SIGNAL = signal.SIGUSR1
STACK_DIR = os.path.join(tempfile.gettempdir(), "hybridflow_stacks")
STACK_TOOL_ENV = "HYBRIDFLOW_STACK_TOOL"  # auto (py-spy when on PATH) | faulthandler
_installed_file = None


def stack_file_of(pid: int) -> str:
    return os.path.join(STACK_DIR, f"stacks_{pid}.txt")


def install_stack_dump_handler() -> bool:
    """Make SIGUSR1 append every thread's Python stack to ``stack_file_of(getpid())``. Idempotent.

    Skipped (False) when the process already has its own SIGUSR1 handler: it is the user's."""
    global _installed_file
    if (
        _installed_file is not None
        and not _installed_file.closed
        and _installed_file.name == stack_file_of(os.getpid())
    ):
        return True
    if signal.getsignal(STACK_SIGNAL) not in (signal.SIG_DFL, None):
        return False
    os.makedirs(STACK_DIR, exist_ok=True)
    _prune_dead()
    _installed_file = open(stack_file_of(os.getpid()), "w")  # kept open: the C handler writes to its fd
    faulthandler.register(STACK_SIGNAL, file=_installed_file, all_threads=True, chain=False)
    return True


def _prune_dead() -> None:
    """Remove the stack files of processes that are gone (workers are often SIGKILLed: no atexit)."""
    import psutil

    for name in os.listdir(STACK_DIR):
        m = re.fullmatch(r"stacks_(\d+)\.txt", name)
        if m and not psutil.pid_exists(int(m[1])):
            with contextlib.suppress(OSError):
                os.remove(os.path.join(STACK_DIR, name))


# ---------------------------------------------------------------- taking a dump


def process_state(pid: int) -> str:
    """psutil's status (running, sleeping, disk-sleep, stopped, tracing-stop, zombie) or 'gone'."""
    import psutil

    try:
        return psutil.Process(pid).status()
    except psutil.NoSuchProcess:
        return "gone"


def _py_spy(pid: int, timeout_s: float) -> str | None:
    exe = shutil.which("py-spy")
    if exe is None or os.environ.get(STACK_TOOL_ENV, "auto") == "faulthandler":
        return None
    try:
        out = subprocess.run(
            [exe, "dump", "--pid", str(pid), "--nonblocking", "--full-filenames"],
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
    except (subprocess.TimeoutExpired, OSError):
        return None
    return out.stdout if out.returncode == 0 and out.stdout.strip() else None


def _faulthandler(pid: int, state: str, timeout_s: float) -> str | None:
    path = stack_file_of(pid)
    if not os.path.exists(path):
        return None  # no handler registered: SIGUSR1's default action would kill the process
    start = os.path.getsize(path)
    os.kill(pid, STACK_SIGNAL)
    if state == "stopped":
        os.kill(pid, signal.SIGCONT)  # the queued SIGUSR1 runs first: the dump shows where it froze
    deadline = time.monotonic() + timeout_s
    text, last_size = "", start
    while time.monotonic() < deadline:
        size = os.path.getsize(path)
        if size > start and size == last_size:  # written and no longer growing
            with open(path) as f:
                f.seek(start)
                text = f.read()
            break
        last_size = size
        time.sleep(0.05)
    return text or None


def dump_stacks(pid: int, timeout_s: float = 5.0) -> dict:
    """``{"pid", "state", "tool", "text"}`` for a process on this node; never raises."""
    state = process_state(pid)
    info = {"pid": pid, "state": state, "tool": None, "text": ""}
    if state in ("gone", "zombie"):
        return info
    if state == "tracing-stop":
        info["text"] = "(a debugger is attached to this process: stacks not taken)"
        return info
    try:
        text = _py_spy(pid, timeout_s)
        if text:
            info.update(tool="py-spy", text=text)
            return info
        text = _faulthandler(pid, state, timeout_s)
        if text:
            info.update(tool="faulthandler", text=text)
        else:
            info["text"] = (
                "(no stack: py-spy is not on PATH and the process has no faulthandler answering "
                "(not registered yet: still importing or starting?))"
            )
    except Exception as e:  # a report with a hole beats no report
        info["text"] = f"(taking the stack failed: {type(e).__name__}: {e})"
    return info


# ---------------------------------------------------------------- reading a dump


@dataclass
class Frame:
    func: str
    file: str
    line: int

    def __str__(self):
        return f"{self.func} ({self.file}:{self.line})"


@dataclass
class Thread:
    header: str
    frames: list[Frame] = field(default_factory=list)  # innermost first


_FH_FRAME = re.compile(r'^\s*File "(?P<file>.+)", line (?P<line>\d+) in (?P<func>\S+)')
_SPY_FRAME = re.compile(r"^\s+(?P<func>\S+) \((?P<file>.+):(?P<line>\d+)\)")


def parse_stacks(text: str) -> list[Thread]:
    """Threads of a faulthandler or py-spy dump, frames innermost first (both tools print them so)."""
    threads: list[Thread] = []
    for line in text.splitlines():
        if line.startswith(("Thread ", "Current thread ")):
            threads.append(Thread(line.strip()))
            continue
        m = _FH_FRAME.match(line) or _SPY_FRAME.match(line)
        if m and threads:
            threads[-1].frames.append(Frame(m["func"], m["file"], int(m["line"])))
    return [t for t in threads if t.frames]


_LIBRARY_DIRS = tuple({sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib", "platlib")})


def _is_library(path: str) -> bool:
    # py-spy prints library files relative to their sys.path entry: a relative path is a library's
    return not os.path.isabs(path) or path.startswith(_LIBRARY_DIRS) or "site-packages" in path


def busy_thread(threads: list[Thread], method: str | None) -> Thread | None:
    """The thread running ``method``: one with a frame of that name (fused role methods are
    ``<role>_<name>``), else one with code outside the libraries, else the first."""
    if not threads:
        return None
    if method:
        for t in threads:
            # py-spy 0.4 prints qualified names (``MyWorker.step``), faulthandler the bare one (``step``)
            names = (f.func.rsplit(".", 1)[-1] for f in t.frames)
            if any(name == method or method.endswith("_" + name) for name in names if name not in ("inner", "forward")):
                return t
    for t in threads:
        if any(not _is_library(f.file) for f in t.frames):
            return t
    return threads[0]


def where(text: str, method: str | None = None) -> str:
    """One line: the innermost frame of the busy thread, and the innermost frame of the caller's own
    code when that is a different one (``all_reduce (torch/...) <- my_step (my_worker.py:12)``)."""
    thread = busy_thread(parse_stacks(text), method)
    if thread is None:
        return "unknown (no stack)"
    inner = thread.frames[0]
    own = next((f for f in thread.frames if not _is_library(f.file)), None)
    if own is None or own is inner:
        return str(inner)
    return f"{inner} <- {own}"


def format_own_stacks(first: int | None = None) -> str:
    """This process's threads in faulthandler's layout (for workers living in the driver's process);
    the watchdog's own monitor threads are left out. ``first``: the thread ident to list first (the
    one running the watched call, so that it is the one a report names)."""
    import threading
    import traceback

    names = {t.ident: t.name for t in threading.enumerate()}
    parts = []
    frames = sorted(sys._current_frames().items(), key=lambda item: item[0] != first)
    for ident, frame in frames:
        if names.get(ident, "").startswith("watchdog:"):
            continue
        lines = [f"Thread 0x{ident:016x} [{names.get(ident, '?')}] (most recent call first):"]
        for fs in reversed(traceback.extract_stack(frame)):
            lines.append(f'  File "{fs.filename}", line {fs.lineno} in {fs.name}')
        parts.append("\n".join(lines))
    return "\n\n".join(parts) + "\n"


def main() -> None:  # pragma: no cover - manual use: python -m hybridflow.single_controller.base.stacks PID
    info = dump_stacks(int(sys.argv[1]))
    print(f"pid {info['pid']} state {info['state']} via {info['tool']}\n{info['text']}")


if __name__ == "__main__":  # pragma: no cover
    main()
