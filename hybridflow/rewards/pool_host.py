"""The process behind a ``RewardPool`` (``python -m hybridflow.rewards.pool_host``): it builds the run's reward
manager once from the ``RewardRecipe`` it is sent and forks the scoring processes from itself.

Why a process of its own: forking the trainer's process is not safe. A fork's copy frees the thread-local
state of every thread but the forking one, and what that state holds may not survive it: torch keeps
DTensor's sharding cache there, and where it held the last reference to a gloo process group the copy
segfaulted in the group's destructor, joining threads the copy does not have (seen in every pool process
of a CI run, after FSDP2 tests in the same process). This host is a fresh interpreter that runs nothing
else, so its forks are plain ones; and unlike multiprocessing's spawn or fork server, it does not import
the trainer's ``__main__`` again, so a script of yours needs no ``if __name__ == "__main__"`` guard.

The wire (``multiprocessing.connection`` over two pipes): the trainer sends the pickled recipe, then
``(task, row)`` pairs; the host says ``(None, True, "ready")`` once it has built the manager (or
``(None, False, error)`` if it could not), then answers each row with ``(task, ok, result or exception)``,
the last item pickled on its own (an answer this side cannot unpickle fails that row only).
The host ends at the end of its input, and with the thread that started it (the death signal); its
scoring processes end with it.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import pickle
import signal
import sys
import threading
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from multiprocessing.connection import Connection

_PR_SET_PDEATHSIG = 1
_LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None  # loaded before any fork


def end_with_parent_thread(thread_id: int) -> None:
    """SIGKILL this process when the thread that started it ends (Linux). The signal is not sent for a
    thread that ended before we asked: then this raises."""
    if _LIBC is None:
        return
    _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if not os.path.exists(f"/proc/{os.getppid()}/task/{thread_id}"):
        raise RuntimeError(f"the thread that started this reward process ({thread_id}) has ended")


_MANAGER = None  # in a scoring process: the reward manager, inherited from the host


def _install(manager, host_thread: int) -> None:
    global _MANAGER
    _MANAGER = manager
    end_with_parent_thread(host_thread)


def _score_row(row) -> list:
    return _MANAGER.score_rows(row)


def _answer(outbox: Connection, lock: threading.Lock, task: int, future) -> None:
    """Send a finished score back; a result or exception that cannot be pickled here goes as its text."""
    if future.cancelled():  # the host is ending: nobody waits
        return
    err = future.exception()
    try:
        payload = pickle.dumps((task, err is None, pickle.dumps(future.result() if err is None else err)))
    except Exception as unpicklable:  # noqa: BLE001 - its text is what helps
        text = f"{type(err).__name__}: {err}" if err is not None else f"the result cannot be pickled: {unpicklable!r}"
        payload = pickle.dumps((task, False, pickle.dumps(RuntimeError(text))))
    with lock:
        try:
            outbox.send_bytes(payload)
        except OSError:  # the trainer has gone: nothing to tell
            pass


def serve(inbox: Connection, outbox: Connection, processes: int) -> None:
    """Build the manager from the recipe, then score each row received in a forked process until the input ends."""
    import hybridflow.protocol  # noqa: F401 - what rows unpickle into (1.4 s of imports): once, before the forks

    recipe = pickle.loads(inbox.recv_bytes())
    manager = recipe.build(num_examine=0)  # the forked processes inherit it: the reward function is never pickled
    pool = ProcessPoolExecutor(
        processes, get_context("fork"), initializer=_install, initargs=(manager, threading.get_native_id())
    )
    pool.submit(int).result()  # the processes fork on the first call: before the first row, not on it
    lock = threading.Lock()
    outbox.send_bytes(pickle.dumps((None, True, pickle.dumps("ready"))))
    try:
        while True:
            try:
                task, row = pickle.loads(inbox.recv_bytes())
            except EOFError:
                return
            future = pool.submit(_score_row, row)
            future.add_done_callback(lambda f, task=task: _answer(outbox, lock, task, f))
    finally:
        workers = list((pool._processes or {}).values())
        pool.shutdown(wait=False, cancel_futures=True)
        for worker in workers:
            worker.kill()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("inbox_fd", type=int)
    parser.add_argument("outbox_fd", type=int)
    parser.add_argument("processes", type=int)
    parser.add_argument("parent_thread", type=int)
    args = parser.parse_args(argv)
    end_with_parent_thread(args.parent_thread)
    inbox = Connection(args.inbox_fd, writable=False)
    outbox = Connection(args.outbox_fd, readable=False)
    try:
        serve(inbox, outbox, args.processes)
    except BaseException as err:  # told to the trainer, which fails what waits with it
        try:
            outbox.send_bytes(
                pickle.dumps((None, False, pickle.dumps(RuntimeError(f"the reward host failed: {err!r}"))))
            )
        except OSError:
            pass
        raise


if __name__ == "__main__":
    main()
