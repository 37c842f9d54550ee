"""Driver-side checkpoint bookkeeping: where a step is saved, when it counts, which one to resume.

Layout under ``trainer.default_local_dir``::

    global_step_N/
        actor/  critic/        written by the workers (hybridflow.workers.checkpoint)
        data.pt                dataloader state, written by the driver
        COMPLETE               written last, before the rename below: the step is whole
    global_step_N.tmp-<hex>/   a save in progress (or one a crash interrupted)
    latest_checkpointed_iteration.txt   the step number, replaced atomically after the rename

A save goes ``tmp = begin_save(dir, N)`` -> workers and driver write into ``tmp`` ->
``commit_save(dir, N, tmp)``. A crash at any point leaves either the previous state or the new
one: a ``*.tmp-*`` directory is never read as a checkpoint, and the latest file is trusted only
when it names a complete directory. Every file is read back without running code it may hold
(``hybridflow.utils.safe_load``); ``verify_checkpoint`` refuses a directory that is not whole.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
import shutil
import uuid

import numpy as np
import torch

from hybridflow.config.trainer import RESUME_MODES
from hybridflow.protocol import DataProto
from hybridflow.utils.safe_load import CheckpointFileError, DamagedCheckpointError, load_torch_file, read_dcp_metadata

logger = logging.getLogger(__name__)

LATEST_FILE = "latest_checkpointed_iteration.txt"
COMPLETE_MARKER = "COMPLETE"
DATA_FILE = "data.pt"
_STEP_DIR = re.compile(r"^global_step_(\d+)$")
_TMP_DIR = re.compile(r"^global_step_(\d+)\.tmp-[0-9a-f]+$")


def step_dir_name(step: int) -> str:
    return f"global_step_{int(step)}"


def step_of(path: str) -> int:
    """The N of the last ``global_step_N`` component of ``path`` (``.../global_step_7/actor`` -> 7)."""
    for part in reversed(os.path.normpath(str(path)).split(os.sep)):
        m = _STEP_DIR.match(part)
        if m:
            return int(m.group(1))
    raise ValueError(f"{path!r} has no 'global_step_<N>' component")


def is_complete(step_path: str) -> bool:
    return os.path.isfile(os.path.join(step_path, COMPLETE_MARKER))


def complete_steps(default_local_dir: str) -> dict[int, str]:
    """{step: path} of every complete ``global_step_N`` directory (tmp and unmarked ones excluded)."""
    if not os.path.isdir(default_local_dir):
        return {}
    found = {}
    for name in os.listdir(default_local_dir):
        m = _STEP_DIR.match(name)
        path = os.path.join(default_local_dir, name)
        if m and os.path.isdir(path) and is_complete(path):
            found[int(m.group(1))] = path
    return dict(sorted(found.items()))


def _fsync_dir(path: str) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # not supported on every platform/filesystem
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _write_atomic(path: str, text: str) -> None:
    tmp = f"{path}.tmp-{uuid.uuid4().hex}"
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


# --- save ------------------------------------------------------------------------------------------
class CheckpointSaveError(RuntimeError):
    """A write of a checkpoint failed (e.g. ENOSPC); the step's tmp directory was removed and the previous
    complete checkpoint is still the latest."""

    def __init__(self, step: int, writer: str, cause: BaseException):
        self.step, self.writer = step, writer
        super().__init__(
            f"saving the checkpoint of step {step} failed in {writer}: {type(cause).__name__}: {cause}; "
            "the previous complete checkpoint stays the latest"
        )


def begin_save(default_local_dir: str, step: int) -> str:
    """Create and return a fresh temporary directory for step ``step``; workers save into it."""
    os.makedirs(default_local_dir, exist_ok=True)
    tmp_dir = os.path.join(default_local_dir, f"{step_dir_name(step)}.tmp-{uuid.uuid4().hex}")
    os.makedirs(tmp_dir)
    return tmp_dir


def commit_save(default_local_dir: str, step: int, tmp_dir: str) -> str:
    """Mark ``tmp_dir`` complete, move it to ``global_step_N`` and then point the latest file at it.

    An existing ``global_step_N`` is replaced: it is first renamed to a tmp name (so a crash between
    the two renames leaves two complete tmp dirs, which ``cleanup_partial_saves`` promotes back).
    """
    if not os.path.isdir(tmp_dir):
        raise FileNotFoundError(f"nothing to commit: {tmp_dir!r} does not exist")
    final = os.path.join(default_local_dir, step_dir_name(step))
    with open(os.path.join(tmp_dir, COMPLETE_MARKER), "w") as f:
        f.write(f"{int(step)}\n")
        f.flush()
        os.fsync(f.fileno())
    old = None
    if os.path.exists(final):
        old = f"{final}.tmp-{uuid.uuid4().hex}"
        os.rename(final, old)
    os.rename(tmp_dir, final)
    _fsync_dir(default_local_dir)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    _write_atomic(os.path.join(default_local_dir, LATEST_FILE), f"{int(step)}\n")
    return final


def prune_checkpoints(default_local_dir: str, max_to_keep: int | None) -> list[str]:
    """Delete all but the newest ``max_to_keep`` complete steps (None or <= 0 keeps all)."""
    if max_to_keep is None or int(max_to_keep) <= 0:
        return []
    steps = complete_steps(default_local_dir)
    doomed = list(steps.values())[: max(0, len(steps) - int(max_to_keep))]
    for path in doomed:
        # drop the marker first: a crash mid-delete leaves an incomplete dir, never a broken "complete" one
        os.remove(os.path.join(path, COMPLETE_MARKER))
        shutil.rmtree(path, ignore_errors=True)
    return doomed


def cleanup_partial_saves(default_local_dir: str) -> list[str]:
    """Remove leftover ``global_step_N.tmp-*`` dirs; returns the removed paths.

    Exception: when ``global_step_N`` is missing but a tmp dir for N is complete (a crash between
    the marker and the rename), the newest such tmp dir is renamed into place instead and the
    commit is finished (the latest file moves forward to it).
    """
    if not os.path.isdir(default_local_dir):
        return []
    by_step: dict[int, list[str]] = {}
    for name in os.listdir(default_local_dir):
        m = _TMP_DIR.match(name)
        if m:
            by_step.setdefault(int(m.group(1)), []).append(os.path.join(default_local_dir, name))
    removed = []
    for name in os.listdir(default_local_dir):  # an interrupted write of the latest file
        if name.startswith(LATEST_FILE + ".tmp-"):
            os.remove(os.path.join(default_local_dir, name))
            removed.append(os.path.join(default_local_dir, name))
    for step, paths in by_step.items():
        final = os.path.join(default_local_dir, step_dir_name(step))
        whole = [p for p in paths if os.path.isdir(p) and is_complete(p)]
        if not os.path.exists(final) and whole:
            keep = max(whole, key=lambda p: os.path.getmtime(os.path.join(p, COMPLETE_MARKER)))
            os.rename(keep, final)  # finish the interrupted commit, latest file included
            paths = [p for p in paths if p != keep]
            latest = read_latest_step(default_local_dir)
            if latest is None or latest < step:
                _write_atomic(os.path.join(default_local_dir, LATEST_FILE), f"{step}\n")
        for p in paths:
            if os.path.isdir(p):
                shutil.rmtree(p, ignore_errors=True)
            else:
                os.remove(p)
            removed.append(p)
    return removed


# --- resume ----------------------------------------------------------------------------------------
def read_latest_step(default_local_dir: str) -> int | None:
    try:
        with open(os.path.join(default_local_dir, LATEST_FILE)) as f:
            return int(f.read().strip())
    except (FileNotFoundError, ValueError):
        return None


def find_latest_checkpoint(default_local_dir: str) -> str | None:
    """The step dir named by the latest file if it is complete, else the highest complete one."""
    step = read_latest_step(default_local_dir)
    if step is not None:
        path = os.path.join(default_local_dir, step_dir_name(step))
        if is_complete(path):
            return path
    steps = complete_steps(default_local_dir)
    return steps[max(steps)] if steps else None


def resolve_resume(resume_mode: str, default_local_dir: str, resume_from_path: str | None = None) -> str | None:
    """veRL's ``trainer.resume_mode``: the step directory to resume from, or None to start fresh.

    auto: the latest complete checkpoint under ``default_local_dir`` (None if there is none);
    disable: None; resume_path: ``resume_from_path``, which must be a complete ``global_step_N`` dir.
    """
    if resume_mode == "disable":
        return None
    if resume_mode == "auto":
        return find_latest_checkpoint(default_local_dir)
    if resume_mode != "resume_path":
        raise ValueError(f"trainer.resume_mode must be one of {', '.join(RESUME_MODES)}, got {resume_mode!r}")
    if not resume_from_path:
        raise ValueError("trainer.resume_mode=resume_path needs trainer.resume_from_path (a global_step_<N> directory)")
    path = os.path.abspath(str(resume_from_path))
    if "global_step_" not in os.path.basename(os.path.normpath(path)):
        raise ValueError(f"trainer.resume_from_path must name a global_step_<N> directory, got {resume_from_path!r}")
    if not os.path.isdir(path):
        raise FileNotFoundError(f"trainer.resume_from_path {resume_from_path!r} does not exist")
    if not is_complete(path):
        raise ValueError(
            f"trainer.resume_from_path {resume_from_path!r} is not a complete checkpoint "
            f"(no {COMPLETE_MARKER} marker: the save was interrupted)"
        )
    step_of(path)  # a malformed name such as global_step_x fails here
    return path


# --- the driver's own state ------------------------------------------------------------------------
def role_dir(step_path: str, role: str) -> str:
    """Where the workers of ``role`` (actor, critic) save inside a (tmp or final) step directory."""
    return os.path.join(step_path, role)


def save_dataloader_state(step_path: str, state: dict) -> str:
    """Written with plain types only (DataProto groups as dicts of tensors and lists), so that it loads
    back with ``weights_only=True``."""
    path = os.path.join(step_path, DATA_FILE)
    torch.save(_plain(state), path)
    return path


def load_dataloader_state(step_path: str, restorable: tuple[type, ...] = ()) -> dict | None:
    """The driver state; ``restorable``: the dataclasses it may hold (the async sources' prompt groups),
    rebuilt by name from that list only."""
    path = os.path.join(step_path, DATA_FILE)
    if not os.path.exists(path):
        return None
    return _from_plain(load_torch_file(path), {f"{c.__module__}.{c.__qualname__}": c for c in restorable})


_PROTO = "__dataproto__"
_DATACLASS = "__dataclass__"


def _plain(obj):
    """``obj`` with each DataProto replaced by a tagged dict of tensors, lists and plain meta_info."""
    if isinstance(obj, DataProto):
        tensors = {k: v for k, v in obj.batch.items()} if obj.batch is not None else {}
        columns = {k: list(v) for k, v in obj.non_tensor_batch.items()}
        return {_PROTO: {"tensors": tensors, "columns": columns, "meta_info": _plain(obj.meta_info)}}
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        fields = {f.name: _plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
        return {_DATACLASS: f"{type(obj).__module__}.{type(obj).__qualname__}", "fields": fields}
    if isinstance(obj, dict):
        return {k: _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_plain(v) for v in obj)
    return obj


def _from_plain(obj, restorable: dict[str, type]):
    if isinstance(obj, dict) and set(obj) == {_DATACLASS, "fields"}:
        cls = restorable.get(obj[_DATACLASS])
        if cls is None:
            raise ValueError(f"the driver state holds a {obj[_DATACLASS]}, which this trainer does not restore")
        return cls(**_from_plain(obj["fields"], restorable))
    if isinstance(obj, dict) and set(obj) == {_PROTO}:
        saved = obj[_PROTO]
        columns = {}
        for key, values in saved["columns"].items():
            column = np.empty(len(values), dtype=object)  # one object per row, lists and dicts included
            column[:] = values if not values or not isinstance(values[0], (list, tuple)) else _objects(values)
            columns[key] = column
        return DataProto.from_dict(tensors=saved["tensors"], non_tensors=columns, meta_info=saved["meta_info"])
    if isinstance(obj, dict):
        return {k: _from_plain(v, restorable) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_from_plain(v, restorable) for v in obj)
    return obj


def _objects(values: list) -> list:
    """numpy would turn a list of equal-length lists into a 2-D array; a column keeps one object per row."""
    out = np.empty(len(values), dtype=object)
    for i, value in enumerate(values):
        out[i] = value
    return list(out)


# --- is a step directory whole? ---------------------------------------------------------------------
_EXTRA_STATE = re.compile(r"^extra_state_world_size_(\d+)_rank_(\d+)\.pt$")


def verify_checkpoint(step_path: str, roles: list[str]) -> None:
    """Refuse a step directory that is not whole or not ours, naming the file: the driver state and, per
    role, the DCP metadata (read with an allow-list), every shard it lists (present and long enough) and
    one extra-state file per rank (read with ``weights_only``). Raises ``CheckpointFileError``."""
    load_torch_file(os.path.join(step_path, DATA_FILE))
    for role in roles:
        directory = role_dir(step_path, role)
        dcp_dir = os.path.join(directory, "dcp")
        metadata = read_dcp_metadata(os.path.join(dcp_dir, ".metadata"))
        for info in {(i.relative_path, i.offset + i.length) for i in (metadata.storage_data or {}).values()}:
            shard, needed = os.path.join(dcp_dir, info[0]), info[1]
            size = os.path.getsize(shard) if os.path.isfile(shard) else None
            if size is None or size < needed:
                state = "missing" if size is None else f"truncated ({size} of {needed} bytes)"
                raise DamagedCheckpointError(shard, state)
        ranks: dict[int, set[int]] = {}
        for name in os.listdir(directory):
            m = _EXTRA_STATE.match(name)
            if m:
                ranks.setdefault(int(m.group(1)), set()).add(int(m.group(2)))
        for world, present in ranks.items():
            for rank in range(world):
                path = os.path.join(directory, f"extra_state_world_size_{world}_rank_{rank}.pt")
                if rank not in present:
                    raise DamagedCheckpointError(path, f"missing: the step was saved by {world} ranks")
                load_torch_file(path)


def resumable_checkpoint(trainer_cfg, roles: list[str]) -> str | None:
    """The step directory to resume from (``resolve_resume``), verified whole. A damaged or foreign one
    is refused naming its file, unless ``trainer.resume_skip_damaged`` asks to fall back to the newest
    whole one (auto mode; a ``resume_from_path`` the user named is never replaced)."""
    t = trainer_cfg
    path = resolve_resume(t.resume_mode, t.default_local_dir, t.resume_from_path)
    if path is None:
        return None
    try:
        verify_checkpoint(path, roles)
        return path
    except CheckpointFileError as e:
        if t.resume_mode != "auto" or not t.resume_skip_damaged:
            hint = (
                " (trainer.resume_skip_damaged=True resumes from the newest whole one)"
                if t.resume_mode == "auto"
                else ""
            )
            raise CheckpointFileError(e.path, f"{e.detail}; cannot resume from {path}{hint}") from e
        logger.warning("skipping checkpoint %s: %s", path, e)
    for step, older in reversed(list(complete_steps(t.default_local_dir).items())):
        if step >= step_of(path):
            continue
        try:
            verify_checkpoint(older, roles)
            return older
        except CheckpointFileError as e:
            logger.warning("skipping checkpoint %s: %s", older, e)
    raise CheckpointFileError(path, f"damaged, and no older whole checkpoint under {t.default_local_dir!r}")
