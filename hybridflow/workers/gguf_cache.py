"""Where a model path names a GGUF (the file, or a folder holding exactly one and no config.json), turn
it into a Hugging Face folder once and reuse it: every consumer (actor, ref, critic, reward model,
rollout engines, SFT, generation, eval) loads that folder like any other.

The cache is keyed by the file's real path, size and mtime, so an edited or replaced file converts
again. A conversion writes into a temporary folder renamed into place, so a crash never leaves a half
folder that looks valid; a lock file keeps concurrent workers from converting the same file twice."""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import time

from hybridflow.utils.atomic_folder import folder_written_atomically

logger = logging.getLogger(__name__)


def gguf_cache_root() -> str:
    """``$HYBRIDFLOW_CACHE/gguf`` where that is set, else ``~/.cache/hybridflow/gguf``."""
    base = os.environ.get("HYBRIDFLOW_CACHE") or os.path.join("~", ".cache", "hybridflow")
    return os.path.join(os.path.expanduser(base), "gguf")


def find_gguf(path: str, key: str = "model.path") -> str | None:
    """The GGUF file ``path`` names, or None where it names a Hugging Face folder (or nothing)."""
    if os.path.isfile(path):
        return path
    if not os.path.isdir(path) or os.path.exists(os.path.join(path, "config.json")):
        return None
    found = sorted(name for name in os.listdir(path) if name.endswith(".gguf"))
    if len(found) > 1:
        raise ValueError(
            f"{key}={path!r}: the folder holds {len(found)} GGUF files and no config.json; "
            f"name one of them: {', '.join(os.path.join(path, n) for n in found)}"
        )
    return os.path.join(path, found[0]) if found else None


def cache_dir_for(gguf_path: str) -> str:
    stat = os.stat(gguf_path)
    absolute = os.path.realpath(gguf_path)  # a link and its target share one entry
    digest = hashlib.sha256(f"{absolute}|{stat.st_size}|{stat.st_mtime_ns}".encode()).hexdigest()[:16]
    stem = os.path.splitext(os.path.basename(absolute))[0]
    return os.path.join(gguf_cache_root(), f"{stem}-{digest}")


@contextlib.contextmanager
def _file_lock(path: str):
    try:
        import fcntl
    except ImportError:  # not POSIX: the atomic rename alone keeps the cache consistent
        yield
        return
    with open(path, "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def hf_folder_for_gguf(gguf_path: str, key: str = "model.path") -> str:
    """The cached Hugging Face folder (fp32) for ``gguf_path``, converting it on first use."""
    from hybridflow.workers.gguf_model import check_gguf, write_hf_folder_from_gguf

    target = cache_dir_for(gguf_path)
    if os.path.isdir(target):
        return target
    check_gguf(gguf_path, key)  # before creating anything: an unreadable file leaves no trace
    os.makedirs(os.path.dirname(target), exist_ok=True)
    with _file_lock(target + ".lock"):
        if os.path.isdir(target):  # another process converted it while this one waited
            return target
        start = time.monotonic()
        with folder_written_atomically(target) as tmp:
            write_hf_folder_from_gguf(gguf_path, tmp, key=key)
        logger.warning(
            "converted GGUF %s to a Hugging Face folder %s in %.1f s", gguf_path, target, time.monotonic() - start
        )
    return target
