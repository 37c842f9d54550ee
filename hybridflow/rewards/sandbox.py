"""Run untrusted Python in a separate, limited process: the execution half of the code scorer.

Layers, strongest first; each kernel layer is probed once and used only where this machine allows:

- network namespace (``unshare(CLONE_NEWNET)``): no interface but a downed loopback;
- mount namespace with the whole filesystem read-only except the run's own empty directory, and an
  empty tmpfs over /proc (so /proc/<driver>/environ does not exist);
- (non-root drivers get both through a user namespace that maps only their own uid, if allowed;)
- an unprivileged, never-used uid per run (when the driver is root): RLIMIT_NPROC only binds
  non-root users, and /proc/<driver>/environ and root's files become unreadable;
- always: rlimits (CPU, address space, processes, file size, open files, no core), a new session
  killed as a group (and every process of the run's uid) on timeout, an empty environment,
  ``python -I -S``, an empty temporary cwd, and the audit hook of ``sandbox_child``.

``isolation()`` says which layers are in force; the code scorer reports it with every result.
"""

from __future__ import annotations

import ctypes
import functools
import json
import math
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, replace

from hybridflow.rewards.sandbox_child import BOOTSTRAP, EXIT_MEMORY, RESULT_MARKER

try:  # POSIX only; elsewhere the child runs with the audit hook and a timeout only
    import resource
except ImportError:  # pragma: no cover
    resource = None

_CLONE_NEWNS, _CLONE_NEWUSER, _CLONE_NEWNET = 0x00020000, 0x10000000, 0x40000000
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC = 0x1, 0x2, 0x4, 0x8
_MS_BIND, _MS_REC, _MS_PRIVATE = 0x1000, 0x4000, 0x40000
_AT_FDCWD, _AT_RECURSIVE, _MOUNT_ATTR_RDONLY = -100, 0x8000, 0x1
_SYS_MOUNT_SETATTR = {"x86_64": 442, "aarch64": 442}.get(os.uname().machine) if hasattr(os, "uname") else None
_PR_SET_PDEATHSIG, _PR_SET_NO_NEW_PRIVS = 1, 38
_LIBC = None
if sys.platform.startswith("linux"):
    try:  # loaded in the parent: a forked child must not dlopen
        _LIBC = ctypes.CDLL(None, use_errno=True)
    except OSError:  # pragma: no cover
        _LIBC = None


class _MountAttr(ctypes.Structure):
    _fields_ = [(n, ctypes.c_uint64) for n in ("attr_set", "attr_clr", "propagation", "userns_fd")]


@dataclass(frozen=True)
class Limits:
    """Per-run limits. ``timeout_s`` is wall time; CPU time is capped at ceil(timeout_s) + 1."""

    timeout_s: float = 5.0
    memory_mb: int = 1024
    max_processes: int = 4  # threads count too (Linux counts tasks per uid)
    max_file_mb: int = 16  # also caps captured stdout/stderr
    max_open_files: int = 64


@dataclass(frozen=True)
class ExecResult:
    stdout: str
    stderr: str
    returncode: int | None
    reason: str  # ok | timeout | memory | error
    wall_s: float
    result_json: str | None = None  # fn_name mode: the JSON of the return value


@dataclass(frozen=True)
class _Layers:
    python: str
    netns: bool = False
    readonly_fs: bool = False
    userns: bool = False  # non-root: namespaces through a user namespace that maps only our own uid
    hide_proc: bool = False  # an empty read-only tmpfs over /proc: no /proc/<driver>/environ
    drop_uid: bool = False
    audit_hook: bool = True


def _check(ret: int, what: str) -> None:
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _readonly_except(box: str) -> None:
    """In a fresh mount namespace: everything read-only, ``box`` a writable bind mount of itself."""
    path = box.encode()
    _check(_LIBC.mount(None, b"/", None, _MS_REC | _MS_PRIVATE, None), "mount private")
    _check(_LIBC.mount(path, path, None, _MS_BIND, None), "bind cwd")
    ro, rw = _MountAttr(_MOUNT_ATTR_RDONLY, 0, 0, 0), _MountAttr(0, _MOUNT_ATTR_RDONLY, 0, 0)
    size = ctypes.sizeof(_MountAttr)
    _check(_LIBC.syscall(_SYS_MOUNT_SETATTR, _AT_FDCWD, b"/", _AT_RECURSIVE, ctypes.byref(ro), size), "ro /")
    _check(_LIBC.syscall(_SYS_MOUNT_SETATTR, _AT_FDCWD, path, 0, ctypes.byref(rw), size), "rw cwd")
    os.chdir(box)  # onto the bind mount


def _preexec(layers: _Layers, limits: Limits, box: str, uid: int | None):
    """Runs in the forked child before exec (after chdir and setsid): namespaces, rlimits, uid."""

    def setup() -> None:
        flags = (_CLONE_NEWNET if layers.netns else 0) | (_CLONE_NEWNS if layers.readonly_fs else 0)
        if flags and layers.userns:
            real_uid, real_gid = os.getuid(), os.getgid()
            _check(_LIBC.unshare(flags | _CLONE_NEWUSER), "unshare")
            for name, text in (
                ("setgroups", "deny"),
                ("uid_map", f"{real_uid} {real_uid} 1"),
                ("gid_map", f"{real_gid} {real_gid} 1"),
            ):
                fd = os.open(f"/proc/self/{name}", os.O_WRONLY)
                try:
                    os.write(fd, text.encode())
                finally:
                    os.close(fd)
        elif flags:
            _check(_LIBC.unshare(flags), "unshare")
        if layers.readonly_fs:
            _readonly_except(box)
        if layers.hide_proc:
            proc_flags = _MS_RDONLY | _MS_NOSUID | _MS_NODEV | _MS_NOEXEC
            _check(_LIBC.mount(b"none", b"/proc", b"tmpfs", proc_flags, b"size=4k"), "hide /proc")
        if resource is not None:
            cpu = math.ceil(limits.timeout_s) + 1
            memory = limits.memory_mb * 2**20
            fsize = limits.max_file_mb * 2**20
            for name, soft, hard in (
                ("RLIMIT_CPU", cpu, cpu + 1),
                ("RLIMIT_AS", memory, memory),
                ("RLIMIT_NPROC", limits.max_processes, limits.max_processes),
                ("RLIMIT_FSIZE", fsize, fsize),
                ("RLIMIT_NOFILE", limits.max_open_files, limits.max_open_files),
                ("RLIMIT_CORE", 0, 0),
            ):
                resource.setrlimit(getattr(resource, name), (soft, hard))
        if uid is not None:
            os.setgroups([])
            os.setresgid(uid, uid, uid)
            os.setresuid(uid, uid, uid)
        if _LIBC is not None:
            _LIBC.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
            _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # after the uid change clears it

    return setup


def _kill_uid(uid: int) -> None:
    """SIGKILL every process owned by ``uid`` (one uid per run, so these are all the run's)."""
    for _ in range(20):
        found = False
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                with open(f"/proc/{pid}/status") as f:
                    owner = next(line for line in f if line.startswith("Uid:")).split()[1]
                if int(owner) == uid:
                    found = True
                    os.kill(int(pid), signal.SIGKILL)
            except (OSError, StopIteration, ValueError):
                continue
        if not found:
            return
        time.sleep(0.01)


def _read(path: str, limit: int) -> str:
    with open(path, "rb") as f:
        return f.read(limit).decode("utf-8", errors="replace")


def _spawn(layers: _Layers, code: str, stdin: str, limits: Limits, fn_name: str | None) -> ExecResult:
    root = tempfile.mkdtemp(prefix="hf_sandbox_")
    uid = random.randrange(2**20, 2**31 - 2) if layers.drop_uid else None
    try:
        os.chmod(root, 0o711)  # the child may traverse to code.py, not list or read stdout files
        box = os.path.join(root, "box")
        os.mkdir(box, 0o700)
        code_path = os.path.join(root, "code.py")
        with open(code_path, "w", encoding="utf-8") as f:
            f.write(code)
        os.chmod(code_path, 0o644)
        if uid is not None:
            os.chown(box, uid, uid)
        with open(os.path.join(root, "stdin"), "w", encoding="utf-8") as f:
            f.write(stdin)
        argv = [layers.python, "-I", "-S", "-c", BOOTSTRAP, code_path, fn_name or "", "1" if layers.audit_hook else "0"]
        with (
            open(os.path.join(root, "stdin"), "rb") as fin,
            open(os.path.join(root, "stdout"), "wb") as fout,
            open(os.path.join(root, "stderr"), "wb") as ferr,
        ):
            start = time.monotonic()
            proc = subprocess.Popen(
                argv,
                stdin=fin,
                stdout=fout,
                stderr=ferr,
                cwd=box,
                env={},
                close_fds=True,
                start_new_session=True,
                preexec_fn=_preexec(layers, limits, box, uid),
            )
            timed_out = False
            try:
                proc.wait(timeout=limits.timeout_s)
            except subprocess.TimeoutExpired:
                timed_out = True
            # Kill whatever is left either way: the group, and (with a run uid) anything that left it.
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            if uid is not None:
                _kill_uid(uid)
            proc.wait()
            wall = time.monotonic() - start
        cap = limits.max_file_mb * 2**20
        stdout, stderr = _read(os.path.join(root, "stdout"), cap), _read(os.path.join(root, "stderr"), cap)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    rc = proc.returncode
    cpu_killed = rc in (-signal.SIGXCPU, -signal.SIGKILL)
    if timed_out or cpu_killed:
        reason = "timeout"
    elif rc == EXIT_MEMORY or "MemoryError" in stderr:
        reason = "memory"
    elif rc != 0:
        reason = "error"
    else:
        reason = "ok"
    result_json = None
    if fn_name and RESULT_MARKER in stdout:
        stdout, _, tail = stdout.rpartition(RESULT_MARKER)
        result_json = tail.strip()
    return ExecResult(stdout, stderr, None if timed_out else rc, reason, wall, result_json)


def _candidate_pythons() -> list[str]:
    found = [sys.executable, getattr(sys, "_base_executable", ""), shutil.which("python3") or ""]
    found += [f"/usr/bin/python3.{sys.version_info.minor}", "/usr/bin/python3", "/usr/local/bin/python3"]
    unique = []
    for path in found:
        if path and os.path.exists(path) and path not in unique:
            unique.append(path)
    return unique


_PROBE = "open('probe', 'w').write('1'); print(open('probe').read())"


def _works(layers: _Layers) -> bool:
    try:
        result = _spawn(layers, _PROBE, "", Limits(timeout_s=10.0), None)
    except (OSError, subprocess.SubprocessError):
        return False
    return result.reason == "ok" and result.stdout.strip() == "1"


@functools.lru_cache(maxsize=1)
def _detect() -> _Layers:
    """Probe each kernel layer once; keep those that start a working child."""
    layers = _Layers(python=sys.executable)
    if _LIBC is None or resource is None:
        return layers
    if os.geteuid() != 0:  # unprivileged: namespaces only inside a user namespace, if the OS allows one
        layers = replace(layers, userns=True)
    for change in ({"netns": True}, {"readonly_fs": True}):
        if change.get("readonly_fs") and _SYS_MOUNT_SETATTR is None:
            continue
        if _works(replace(layers, **change)):
            layers = replace(layers, **change)
    if layers.readonly_fs and _works(replace(layers, hide_proc=True)):
        layers = replace(layers, hide_proc=True)
    if layers.userns and not (layers.netns or layers.readonly_fs):
        layers = replace(layers, userns=False)
    if os.geteuid() == 0:
        for python in _candidate_pythons():  # root's own python may sit in an unreadable /root
            if _works(replace(layers, python=python, drop_uid=True)):
                return replace(layers, python=python, drop_uid=True)
    return layers


def isolation(limits: Limits | None = None) -> str:
    """A one-line description of the isolation a run gets on this machine."""
    layers, limits = _detect(), limits or Limits()
    nproc = "enforced" if layers.drop_uid or os.geteuid() != 0 else "NOT enforced (root)"
    parts = [
        f"rlimits(cpu={math.ceil(limits.timeout_s) + 1}s, as={limits.memory_mb}MB, "
        f"nproc={limits.max_processes} {nproc}, fsize={limits.max_file_mb}MB, nofile={limits.max_open_files})",
        f"wall timeout {limits.timeout_s}s with process-group kill",
        "empty env, python -I -S, empty temp cwd",
        ("network namespace" + (" (in a user namespace)" if layers.userns else ""))
        if layers.netns
        else "NO network namespace",
        "read-only filesystem outside cwd" if layers.readonly_fs else "filesystem writable where the user may write",
        "/proc hidden" if layers.hide_proc else "/proc visible",
        "unprivileged per-run uid" if layers.drop_uid else "same uid as the driver",
        "audit hook (fork/exec/subprocess/socket/ctypes/writes outside cwd denied)"
        if layers.audit_hook
        else "no audit hook",
    ]
    return "; ".join(parts)


def run_python(
    code: str,
    stdin: str = "",
    limits: Limits | None = None,
    fn_name: str | None = None,
    call_args: list | None = None,
    audit_hook: bool = True,
) -> ExecResult:
    """Run ``code`` once in a fresh sandboxed interpreter; with ``fn_name`` also call it on ``call_args``."""
    layers = replace(_detect(), audit_hook=audit_hook)
    if fn_name:
        stdin = json.dumps(list(call_args or []))
    return _spawn(layers, code, stdin, limits or Limits(), fn_name)


def kernel_layers() -> dict[str, bool]:
    """Which kernel layers are in force here (for tests and reports)."""
    layers = _detect()
    return {
        "netns": layers.netns,
        "readonly_fs": layers.readonly_fs,
        "drop_uid": layers.drop_uid,
        "userns": layers.userns,
        "hide_proc": layers.hide_proc,
    }
