"""Putting ``os.environ`` back: a run, an engine start or a group sets variables for itself only."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Iterator, Mapping


def snapshot_environ(keys: Iterable[str] | None = None) -> dict[str, str | None]:
    """The values of ``keys`` (None: not set), or of the whole environment when ``keys`` is None."""
    return dict(os.environ) if keys is None else {k: os.environ.get(k) for k in keys}


def restore_environ(snapshot: Mapping[str, str | None], drop_others: bool = False) -> None:
    """Set each variable of ``snapshot`` back (None: unset it); ``drop_others`` also unsets every
    variable the snapshot does not have (for a snapshot of the whole environment)."""
    if drop_others:
        for key in [k for k in os.environ if k not in snapshot]:
            del os.environ[key]
    for key, value in snapshot.items():
        if value is None:
            os.environ.pop(key, None)
        elif os.environ.get(key) != value:
            os.environ[key] = value


@contextlib.contextmanager
def restored_environ(keys: Iterable[str] | None = None) -> Iterator[None]:
    """The variables ``keys`` (None: the whole environment) are as they were once the block ends."""
    snapshot = snapshot_environ(keys)
    try:
        yield
    finally:
        restore_environ(snapshot, drop_others=keys is None)
