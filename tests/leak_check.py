"""Tests leave nothing behind: the process state that one test could pass on to the next, compared before
and after (used by tests/conftest.py; tested in tests/test_leak_check.py).

The state is: the environment (os.environ), every catchable signal's handler (signal.getsignal), the live
non-daemon threads, the running child processes, the Ray session the process is connected to and its live
actors, and whether a torch.distributed default process group is initialised. A test, with its
function-scoped fixtures, must leave all six as it found them. A module-, class- or package-scoped fixture
must undo at its teardown what it changed from its setup on. What a session-scoped fixture changes while
it is set up (the shared Ray: ``ray.init`` sets RAY_AUTH_MODE, RAY_USAGE_STATS_ENABLED and
PYTHONBREAKPOINT, installs a SIGTERM handler and starts Ray's processes; a shared vLLM engine and its
processes) is the session's own and stays. Helpers a library keeps for the life of the process
(``LIFETIME_HELPERS``) are no test's child.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import NamedTuple

import pytest

# pytest's own, rewritten for each phase of each test
UNCHECKED_ENV = frozenset({"PYTEST_CURRENT_TEST"})
# set by a library when it is first imported, so by whichever test happens to import it first: accepted
# when the library was imported in between
IMPORT_TIME_ENV = {
    "cv2": frozenset({"LD_LIBRARY_PATH"}),  # opencv prepends its lib64 (imported by vLLM's engine)
    "ray": frozenset({"RAY_CLIENT_MODE"}),
    # scikit-learn, where installed, is imported by transformers.generation (seen on the GPU image)
    "sklearn": frozenset({"KMP_DUPLICATE_LIB_OK", "KMP_INIT_AT_FORK"}),
    "torch._dynamo": frozenset({"TORCHINDUCTOR_CACHE_DIR"}),  # torch._dynamo.package asks inductor's cache_dir()
    "vllm": frozenset(
        {
            "PYTORCH_NVML_BASED_CUDA_CHECK",
            "TORCHINDUCTOR_COMPILE_THREADS",
            "TORCHINDUCTOR_CACHE_DIR",
            "TRITON_CACHE_AUTOTUNING",
            "TILELANG_CLEANUP_TEMP_FILES",
        }
    ),
}
# how long the threads a test started may take, in all, to finish after it
THREAD_GRACE_S = 2.0
# how long the child processes a test started may take, in all, to exit after it (a vLLM engine core stops
# its own worker first; on a loaded 2-core machine that takes seconds)
CHILD_GRACE_S = 10.0
# helpers a library starts once and keeps for the life of the process that started them, by a word of their
# command line: not a test's leak, whichever test happened to start them
LIFETIME_HELPERS = (
    "multiprocessing.resource_tracker",  # shared memory and semaphores of multiprocessing
    "multiprocessing.forkserver",
    "hybridflow-orphan-reaper",  # hybridflow.utils.orphan_reaper: one per process, ends with it
)


@dataclass
class ProcessState:
    env: dict = field(default_factory=dict)
    signals: dict = field(default_factory=dict)  # signal number -> handler (signal.getsignal)
    threads: frozenset = frozenset()  # live non-daemon threads other than the main thread
    children: frozenset = frozenset()  # pids of this process's direct children (zombies and helpers included)
    ray_connected: bool = False  # ray.init() in effect (the session fixture's, or one a test left)
    actors: frozenset | None = None  # ids of the Ray session's live actors; None: no session, or GCS unreadable
    process_group: str | None = None  # the default torch.distributed group, described; None if none
    imported: frozenset = frozenset()  # the libraries of IMPORT_TIME_ENV already imported


class Leak(NamedTuple):
    kind: str  # "env", "signal", "thread", "process", "actor", "ray" or "process_group"
    key: object  # the variable's name, the signal number, the thread, the child (psutil.Process), the actor id
    text: str  # what the failure says


def _signal_handlers() -> dict:
    handlers = {}
    for sig in signal.valid_signals():
        try:
            handlers[sig] = signal.getsignal(sig)
        except (ValueError, OSError):  # not catchable on this platform
            continue
    return handlers


def _non_daemon_threads() -> frozenset:
    main = threading.main_thread()
    return frozenset(t for t in threading.enumerate() if not t.daemon and t is not main and t.is_alive())


def _child_pids() -> frozenset:
    """The direct children of this process: /proc's per-thread lists (~0.1 ms; psutil walks every process,
    ~6 ms, which every test would pay twice)."""
    pids = set()
    try:
        for tid in os.listdir("/proc/self/task"):
            with open(f"/proc/self/task/{tid}/children") as f:
                pids.update(int(pid) for pid in f.read().split())
    except OSError:  # not Linux, or a kernel without the children files
        import psutil

        return frozenset(child.pid for child in psutil.Process().children())
    return frozenset(pids)


def _running_child(pid: int):
    """The psutil.Process of child ``pid`` while it runs and is not a lifetime helper; else None."""
    import psutil

    try:
        child = psutil.Process(pid)
        if child.status() == psutil.STATUS_ZOMBIE or child.ppid() != os.getpid():
            return None
        command = " ".join(child.cmdline())
    except psutil.Error:
        return None
    return None if any(word in command for word in LIFETIME_HELPERS) else child


def _ray_connected() -> bool:
    ray = sys.modules.get("ray")  # no session can exist before ray is imported
    return ray is not None and ray.is_initialized()


def _live_actors() -> frozenset | None:
    """The ids of the live actors of the Ray session this process is connected to, or None without one (a
    WorkerGroup left without ``shutdown()`` keeps its workers and their CPUs for the rest of the session)."""
    if not _ray_connected():
        return None
    from ray._private import state

    try:
        return frozenset(state.actors(actor_state_name="ALIVE"))
    except Exception:  # noqa: BLE001 - the session is going down, or its GCS does not answer: nothing to compare
        return None


def _actor_name(actor_id: str) -> str:
    from ray._private import state

    info = state.actors(actor_id=actor_id) or {}
    name = f" {info['Name']!r}" if info.get("Name") else ""
    return f"{info.get('ActorClassName', '?')}{name} ({actor_id})"


def _process_group() -> str | None:
    dist = sys.modules.get("torch.distributed")  # no group can exist before torch.distributed is imported
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return None
    try:
        return f"backend {dist.get_backend()}, rank {dist.get_rank()} of {dist.get_world_size()}"
    except Exception as exc:  # noqa: BLE001 - describing the group must not fail the check
        return f"initialised ({type(exc).__name__} while describing it: {exc})"


def process_state() -> ProcessState:
    return ProcessState(
        env=dict(os.environ),
        signals=_signal_handlers(),
        threads=_non_daemon_threads(),
        children=_child_pids(),
        ray_connected=_ray_connected(),
        actors=_live_actors(),
        process_group=_process_group(),
        imported=frozenset(m for m in IMPORT_TIME_ENV if m in sys.modules),
    )


def _short(value, limit: int = 200) -> str:
    text = "unset" if value is None else repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _signal_name(sig) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


def _thread_name(thread: threading.Thread) -> str:
    target = getattr(thread, "_target", None)
    where = f", target {getattr(target, '__module__', '?')}.{getattr(target, '__qualname__', target)}" if target else ""
    return f"{thread.name!r} ({type(thread).__name__}{where})"


_MISSING = object()


def _timeout_plugin(old, new) -> bool:
    """pytest-timeout's SIGALRM timer (set for each test, reset to SIG_DFL early when the test fails)."""
    ours = [h for h in (old, new) if getattr(h, "__module__", None) == "pytest_timeout"]
    return bool(ours) and all(h in ours or h == signal.SIG_DFL for h in (old, new))


def _stop_process_tree(child, grace_s: float = 5.0) -> None:
    """SIGTERM a leaked child and its descendants, SIGKILL what is left after ``grace_s``."""
    import psutil

    try:
        tree = [child, *child.children(recursive=True)]
    except psutil.Error:
        return
    for proc in tree:
        with contextlib.suppress(psutil.Error):
            proc.terminate()
    _gone, alive = psutil.wait_procs(tree, timeout=grace_s)
    for proc in alive:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    psutil.wait_procs(alive, timeout=grace_s)


class StateGuard:
    """The bookkeeping of one test session: what session fixtures own, the threads already reported, the
    state before each wider-scoped fixture's setup, and the wider fixtures' leaks not yet reported."""

    def __init__(self, grace_s: float = THREAD_GRACE_S, child_grace_s: float = CHILD_GRACE_S):
        self.grace_s = grace_s
        self.child_grace_s = child_grace_s
        self.owned = ProcessState()
        self.reported_threads: set = set()
        self.reported_actors: set = set()
        self._wider_before: dict = {}
        self._wider_reports: list[str] = []

    # ------------------------------------------------------------------ comparing

    def leaks(self, before: ProcessState, after: ProcessState) -> list[Leak]:
        """What changed from ``before`` to ``after``, one Leak per item; [] when nothing did. New non-daemon
        threads get up to ``grace_s`` seconds (in all) to finish first, new child processes and actors
        ``child_grace_s``. What a session fixture set up in between (``own``) is no change, nor are the
        variables a library set when imported in between."""
        found = []
        import_time = set().union(*(IMPORT_TIME_ENV[m] for m in after.imported - before.imported))
        for key in sorted(set(before.env) | set(after.env)):
            old, new = before.env.get(key), after.env.get(key)
            if old == new or key in UNCHECKED_ENV or key in import_time:
                continue
            if self.owned.env.get(key, _MISSING) == new:
                continue
            found.append(Leak("env", key, f"environment variable {key}: {_short(old)} -> {_short(new)}"))
        for sig in sorted(set(before.signals) | set(after.signals)):
            old, new = before.signals.get(sig), after.signals.get(sig)
            if old != new and self.owned.signals.get(sig, _MISSING) != new and not _timeout_plugin(old, new):
                found.append(Leak("signal", sig, f"signal handler {_signal_name(sig)}: {_short(old)} -> {_short(new)}"))
        deadline = time.monotonic() + self.grace_s
        for thread in sorted(
            after.threads - before.threads - self.owned.threads - self.reported_threads, key=lambda t: t.name
        ):
            thread.join(timeout=max(0.0, deadline - time.monotonic()))
            if thread.is_alive():
                self.reported_threads.add(thread)  # reported once, not again by every later check
                found.append(
                    Leak(
                        "thread",
                        thread,
                        f"non-daemon thread {_thread_name(thread)} still running {self.grace_s:g} s after the test",
                    )
                )
        found.extend(self._child_leaks(after.children - before.children - self.owned.children))
        if before.actors is not None and after.actors is not None:  # one Ray session before and after
            found.extend(self._actor_leaks(after.actors - before.actors - (self.owned.actors or frozenset())))
        if not before.ray_connected and after.ray_connected and not self.owned.ray_connected:
            found.append(Leak("ray", None, "a Ray session started by the test is still connected (ray.init)"))
        if before.process_group != after.process_group and not (
            after.process_group is not None and after.process_group == self.owned.process_group
        ):
            found.append(
                Leak(
                    "process_group",
                    None,
                    "torch.distributed default process group: "
                    f"{before.process_group or 'none'} -> "
                    f"{after.process_group or 'none (destroyed)'}",
                )
            )
        return found

    def _child_leaks(self, new_pids) -> list[Leak]:
        """The new children still running after ``child_grace_s`` in all. Polled, not waited for: waiting
        would reap an exited child before the code that started it (a Popen, a multiprocessing.Process) does."""
        deadline = time.monotonic() + self.child_grace_s
        running = [child for child in map(_running_child, sorted(new_pids)) if child is not None]
        while running and time.monotonic() < deadline:
            time.sleep(0.05)
            running = [child for child in running if _running_child(child.pid) is not None]
        import psutil

        leaks = []
        for child in running:
            try:
                command = " ".join(child.cmdline())
            except psutil.Error:  # gone meanwhile: nothing to report
                continue
            command = command if len(command) <= 120 else command[:117] + "..."
            leaks.append(
                Leak(
                    "process",
                    child,
                    f"child process {child.pid} ({command}) still running {self.child_grace_s:g} s after the test",
                )
            )
        return leaks

    def _actor_leaks(self, new_ids) -> list[Leak]:
        """The new actors still alive after ``child_grace_s`` in all (``ray.kill`` returns before the actor
        is dead)."""
        deadline = time.monotonic() + self.child_grace_s
        alive = set(new_ids) - self.reported_actors
        while alive and time.monotonic() < deadline:
            time.sleep(0.1)
            alive &= _live_actors() or set()  # None: the session went down, and its actors with it
        self.reported_actors |= alive  # reported once: an actor cannot be stopped from here without its handle
        return [
            Leak(
                "actor",
                actor_id,
                f"Ray actor {_actor_name(actor_id)} still alive {self.child_grace_s:g} s after the test",
            )
            for actor_id in sorted(alive)
        ]

    @staticmethod
    def restore(before: ProcessState, leaks: list[Leak]) -> None:
        """Put back what can be put back (variables, signal handlers; a new process group is destroyed, a
        child process stopped, a Ray session shut down), so that the next test does not inherit it. A thread,
        or an actor without its handle, cannot be stopped from outside: only reported."""
        for leak in leaks:
            if leak.kind == "env":
                if leak.key in before.env:
                    os.environ[leak.key] = before.env[leak.key]
                else:
                    os.environ.pop(leak.key, None)
            elif leak.kind == "signal":
                handler = before.signals.get(leak.key)
                if handler is not None:  # None: installed from C, Python cannot put it back
                    try:
                        signal.signal(leak.key, handler)
                    except (ValueError, OSError, TypeError):
                        pass
            elif leak.kind == "process":
                _stop_process_tree(leak.key)
            elif leak.kind == "ray":
                import ray

                ray.shutdown()
            elif leak.kind == "process_group" and before.process_group is None:
                import torch.distributed as dist

                if dist.is_initialized():
                    dist.destroy_process_group()

    def check(self, before: ProcessState, who: str) -> str | None:
        """Compare now with ``before``; on a leak put things back and return the failure message."""
        leaks = self.leaks(before, process_state())
        if not leaks:
            return None
        self.restore(before, leaks)
        return f"{who} left state behind:\n  " + "\n  ".join(leak.text for leak in leaks)

    # ------------------------------------------------------------------ fixtures wider than one test

    def own(self, before: ProcessState, after: ProcessState) -> None:
        """Record what a session-scoped fixture's setup changed as the session's own."""
        for key in set(before.env) | set(after.env):
            if before.env.get(key) != after.env.get(key):
                self.owned.env[key] = after.env.get(key)
        for sig, handler in after.signals.items():
            if before.signals.get(sig) != handler:
                self.owned.signals[sig] = handler
        self.owned.threads = self.owned.threads | (after.threads - before.threads)
        self.owned.children = self.owned.children | (after.children - before.children)
        self.owned.ray_connected = self.owned.ray_connected or (after.ray_connected and not before.ray_connected)
        if after.actors is not None:
            self.owned.actors = (self.owned.actors or frozenset()) | (after.actors - (before.actors or frozenset()))
        if after.process_group is not None and before.process_group is None:
            self.owned.process_group = after.process_group

    def wider_set_up(self, fixturedef, before: ProcessState) -> None:
        self._wider_before[id(fixturedef)] = before

    def wider_torn_down(self, fixturedef, where: str) -> None:
        """After a module/class/package fixture's teardown: it must have undone what changed since its setup."""
        before = self._wider_before.pop(id(fixturedef), None)
        if before is None:  # a function or session fixture, or one this guard did not see set up
            return
        message = self.check(before, f"{fixturedef.scope}-scoped fixture {fixturedef.argname!r} of {where}")
        if message:
            self._wider_reports.append(message)

    def take_wider_report(self) -> str | None:
        """The wider fixtures' leaks found since the last call, if any (then forgotten)."""
        if not self._wider_reports:
            return None
        message = "\n".join(self._wider_reports)
        self._wider_reports.clear()
        return message


class LeakCheckPlugin:
    """The hooks that watch fixtures wider than one test. Registered as a plugin (tests/conftest.py's
    pytest_configure), not as conftest hooks: a conftest's hooks do not see session-scoped fixtures,
    whose node (the session) lies outside the conftest's directory."""

    def __init__(self, guard: StateGuard):
        self.guard = guard

    @pytest.hookimpl(wrapper=True)
    def pytest_fixture_setup(self, fixturedef, request):
        if fixturedef.scope == "function":
            return (yield)
        before = process_state()
        try:
            return (yield)
        finally:
            if fixturedef.scope == "session":
                self.guard.own(before, process_state())
            else:
                self.guard.wider_set_up(fixturedef, before)

    def pytest_fixture_post_finalizer(self, fixturedef, request):
        self.guard.wider_torn_down(fixturedef, getattr(request.node, "nodeid", "?"))

    def _fail_on_wider_leaks(self):
        message = self.guard.take_wider_report()
        if message:
            pytest.fail(message, pytrace=False)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_setup(self, item):
        result = yield  # a parametrized wider fixture is torn down here when its parameter changes
        self._fail_on_wider_leaks()
        return result

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_teardown(self, item, nextitem):
        result = yield  # the wider fixtures the next test does not use are torn down here
        self._fail_on_wider_leaks()
        return result
