"""The orphan reaper's process (see orphan_reaper.py): standard library only, started with ``python -I``.

Reads "pid <pid> <start time>", "unpid <pid>", "path <glob>", "unpath <glob>" and "exit" lines from stdin. At the
end of stdin without "exit" first, its owner is dead: it stops the processes that are still the ones it was told
of (same start time) and their descendants, SIGTERM then SIGKILL, and removes what the globs match.
argv: REAPER_TAG, the owner's pid, the grace period in seconds between SIGTERM and SIGKILL.
"""

import glob
import os
import shutil
import signal
import sys
import time


def stat(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return fields  # fields[0]: state, fields[1]: parent pid, fields[19]: start time


def start_time(pid):
    """The process's start time (clock ticks since boot): with the pid, who it is; None once it is gone."""
    fields = stat(pid)
    return None if fields is None or fields[0] in ("Z", "X") else fields[19]


def descendants(roots):
    children = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            fields = stat(int(name))
            if fields is not None:
                children.setdefault(int(fields[1]), []).append(int(name))
    found, todo = [], list(roots)
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def main():
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    procs, paths = {}, set()
    for line in sys.stdin:
        kind, _, arg = line.rstrip("\n").partition(" ")
        if kind == "exit":
            return
        if kind == "pid":
            pid, start = arg.split()
            procs[int(pid)] = start
        elif kind == "unpid":
            procs.pop(int(arg), None)
        elif kind == "path":
            paths.add(arg)
        elif kind == "unpath":
            paths.discard(arg)

    alive = [pid for pid, start in procs.items() if start_time(pid) == start]
    targets = {pid: start_time(pid) for pid in alive + descendants(alive)}
    for sig, wait_s in ((signal.SIGTERM, float(sys.argv[3])), (signal.SIGKILL, 5.0)):
        for pid, start in targets.items():
            if start is not None and start_time(pid) == start:
                try:
                    os.kill(pid, sig)
                except OSError:
                    pass
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline and any(start_time(p) == s for p, s in targets.items() if s is not None):
            time.sleep(0.1)
    for pattern in paths:
        for path in glob.glob(pattern):
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path, ignore_errors=True)
            else:
                try:
                    os.unlink(path)
                except OSError:
                    pass
    if targets or paths:
        print(
            f"hybridflow: process {sys.argv[2]} ended without cleaning up; stopped {len(targets)} of its processes "
            f"and removed what {len(paths)} path pattern(s) matched",
            file=sys.stderr,
        )


if __name__ == "__main__":
    main()
