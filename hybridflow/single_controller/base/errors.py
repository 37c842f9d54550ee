"""Errors raised on the driver for failures inside workers."""


class WorkerError(RuntimeError):
    """A registered worker method raised; names the group, method and rank and carries the traceback.

    ``cause`` is the worker's own exception where the backend has it (None else), for callers that
    tell one failure from another by its type (a dead rollout engine). Pickles by its fields."""

    cause: BaseException | None = None

    def __init__(self, group: str, method: str, rank: int, detail: str, cause: BaseException | None = None):
        self.group, self.method, self.rank, self.cause = group, method, rank, cause
        super().__init__(f"worker group {group!r}, method {method!r}, rank {rank} failed:\n{detail}")

    def __reduce__(self):  # every subclass: the message as it is, the fields (and notes) in __dict__
        return _rebuilt, (type(self), self.args), self.__dict__


def _rebuilt(cls: type, args: tuple) -> BaseException:
    error = cls.__new__(cls)
    error.args = args
    return error


class WorkerDiedError(WorkerError):
    """The worker process died (killed, os._exit, out of memory) while a call was pending."""

    def __init__(self, group: str, method: str, rank: int, detail: str):
        RuntimeError.__init__(
            self,
            f"worker group {group!r}, rank {rank} died while running {method!r} "
            f"(process killed, exited or out of memory):\n{detail}",
        )
        self.group, self.method, self.rank = group, method, rank


# how a backend says that the process behind a call is gone (Ray's RayActorError and its subclasses),
# matched by name so that this layer imports no backend
PROCESS_GONE_ERRORS = ("RayActorError",)


def is_process_gone(error: BaseException) -> bool:
    """True when ``error`` says that the process which was to answer a call is gone (killed, crashed)."""
    return isinstance(error, WorkerDiedError) or any(c.__name__ in PROCESS_GONE_ERRORS for c in type(error).__mro__)


class WorkerHangError(WorkerError):
    """A watchdog deadline passed: the call gave no answer and reported no progress in time.

    ``rank`` is the first rank found stuck, ``stuck_ranks`` all of them, ``report_path`` the file with
    every rank's Python stacks (None when it could not be written)."""

    def __init__(self, group: str, method: str, rank: int, detail: str, stuck_ranks=(), report_path=None):
        RuntimeError.__init__(self, detail)
        self.group, self.method, self.rank = group, method, rank
        self.stuck_ranks = list(stuck_ranks)
        self.report_path = report_path


class WorkerGroupShutDownError(WorkerError):
    """A call on a worker group that was shut down (by ``shutdown()``, or by the watchdog after a hang).

    ``reason`` says why the group went down; ``method`` is the call that was refused."""

    def __init__(self, group: str, method: str, reason: str):
        RuntimeError.__init__(self, f"worker group {group!r} was shut down ({reason}) and cannot run {method!r}")
        self.group, self.method, self.rank = group, method, -1
        self.reason = reason
