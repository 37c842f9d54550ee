"""A folder that appears whole or not at all: readers (a cache lookup, a resume, vLLM) never see half of one."""

from __future__ import annotations

import contextlib
import os
import shutil
import uuid


@contextlib.contextmanager
def folder_written_atomically(target: str):
    """Yields a fresh temporary folder beside ``target`` to write into; it becomes ``target`` (one rename)
    only when the block ends without error, and is removed otherwise."""
    parent = os.path.dirname(os.path.abspath(target))
    os.makedirs(parent, exist_ok=True)
    tmp = os.path.join(parent, f".tmp-{os.path.basename(os.path.abspath(target))}-{uuid.uuid4().hex}")
    try:
        yield tmp
        os.rename(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
