"""A bad sample: one its reward function cannot score. The scorer raised, returned NaN / None / a
non-number, or did not return within ``reward.score_timeout_s``. By default the step fails naming the
sample; ``reward.bad_sample_score`` gives such samples that score instead, logs each and counts them in
``reward/bad_samples``, so one odd sample does not end a long run.

Deadlines: the scorer runs on a daemon thread while the manager waits at most the timeout. A Python
thread cannot be stopped, so a call past its deadline is left running on its thread (a daemon: the
process can still exit) and the next call gets a fresh thread."""

from __future__ import annotations

import concurrent.futures
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass

BAD_SAMPLES_METRIC = "reward/bad_samples"


@dataclass(frozen=True)
class ScoreFailure:
    """In a scorer's results, in place of a score: the scorer raised or ran past its deadline on this sample."""

    error: BaseException


class SampleScoreError(Exception):
    """The scorer failed on the ``position``-th sample it was given (the manager names the batch row)."""

    def __init__(self, position: int, cause: BaseException):
        super().__init__(f"position {position}: {type(cause).__name__}: {cause}")
        self.position, self.cause = position, cause


class ScorerTimeoutError(TimeoutError):
    """A scorer did not return within its deadline; its thread is left running."""


def scorer_failed_message(index: int, data_source, error: BaseException) -> str:
    return f"compute_score failed on sample {index} (data_source={data_source!r}): {type(error).__name__}: {error}"


def check_bad_sample_settings(bad_sample_score: float | None, score_timeout_s: float | None) -> None:
    """ValueError naming the key when a setting cannot work."""
    if bad_sample_score is not None and not float("-inf") < float(bad_sample_score) < float("inf"):
        raise ValueError(f"reward.bad_sample_score={bad_sample_score} must be a finite number or null")
    if score_timeout_s is not None and not float(score_timeout_s) > 0:
        raise ValueError(f"reward.score_timeout_s={score_timeout_s} must be > 0 (null: no deadline)")


def _serve(jobs: queue.SimpleQueue) -> None:
    while (job := jobs.get()) is not None:
        future, fn, kwargs = job
        try:
            future.set_result(fn(**kwargs))
        except BaseException as e:  # noqa: BLE001 - handed to the waiting thread
            future.set_exception(e)


class DeadlineCaller:
    """``caller(fn, **kwargs)``: ``fn(**kwargs)`` on a daemon thread, waited for at most ``timeout_s``
    (None: called in the caller's thread, no deadline). Calls run one after another, as they would
    inline; ``close()`` lets the thread end."""

    def __init__(self, timeout_s: float | None, what: str = "compute_score"):
        self.timeout_s, self.what = timeout_s, what
        self._jobs: queue.SimpleQueue | None = None

    def __call__(self, fn: Callable, /, **kwargs):
        if self.timeout_s is None:
            return fn(**kwargs)
        if self._jobs is None:
            self._jobs = queue.SimpleQueue()
            threading.Thread(target=_serve, args=(self._jobs,), name=f"hybridflow-{self.what}", daemon=True).start()
        future: concurrent.futures.Future = concurrent.futures.Future()
        self._jobs.put((future, fn, kwargs))
        done, _ = concurrent.futures.wait([future], timeout=self.timeout_s)
        if not done:  # (a TimeoutError the scorer raised itself is its own error, not this one)
            self.close()
            raise ScorerTimeoutError(
                f"{self.what} did not return within reward.score_timeout_s={self.timeout_s:g} s; "
                "its thread is left running (a Python thread cannot be stopped)"
            )
        return future.result()

    def close(self) -> None:
        if self._jobs is not None:
            self._jobs.put(None)  # the thread ends after its current call (never, if that one hangs)
            self._jobs = None
