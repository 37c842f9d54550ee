"""A second copy of each saved checkpoint (veRL's ``trainer.default_hdfs_dir``): after a checkpoint is
complete in ``default_local_dir``, its ``global_step_N`` folder is copied to ``<copy_dir>/global_step_N``
and the copy's own ``latest_checkpointed_iteration.txt`` names it, so the copy is a checkpoint directory
a run can resume from (``default_local_dir=<copy_dir>``).

``hdfs://`` destinations go through the ``hdfs dfs`` command line, as veRL's ``hdfs_io`` does; any other
path is a local or mounted folder. Other URL schemes are refused by name: there is no client for them
here. A copy that fails raises after the local checkpoint is complete, so nothing written is lost.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile

HDFS_PREFIX = "hdfs://"
_KEPT = "the local checkpoint is complete"


def check_copy_dir(copy_dir: str | None, key: str) -> str | None:
    """Why ``copy_dir`` cannot receive checkpoints (None: it can, or it is unset)."""
    if not copy_dir:
        return None
    text = str(copy_dir)
    if text.startswith(HDFS_PREFIX):
        if shutil.which("hdfs") is None:
            return f"{key}={text}: copying to HDFS runs the `hdfs` command line, which is not on PATH"
        return None
    if "://" in text:
        scheme = text.split("://", 1)[0]
        return f"{key}={text}: {scheme}:// is not supported; give an hdfs:// URL or a local or mounted folder"
    return None


def copy_checkpoint(step_dir: str, copy_dir: str, step: int, tracker_name: str) -> str:
    """Copy the complete checkpoint folder ``step_dir`` to ``copy_dir/global_step_<step>``, then write the
    copy's tracker file ``tracker_name`` (last, as locally: a tracker names only a complete folder).
    Returns the copy's path; raises naming both paths when the copy fails."""
    name = f"global_step_{step}"
    if str(copy_dir).startswith(HDFS_PREFIX):
        return _copy_to_hdfs(step_dir, str(copy_dir).rstrip("/"), name, step, tracker_name)
    root = os.path.abspath(os.path.expanduser(str(copy_dir)))
    target = os.path.join(root, name)
    try:
        os.makedirs(root, exist_ok=True)
        shutil.copytree(step_dir, target, dirs_exist_ok=True)
        _write_atomically(os.path.join(root, tracker_name), str(step))
    except OSError as err:
        raise OSError(
            f"copying checkpoint {step_dir} to {target} failed (the local checkpoint is complete): {err}"
        ) from err
    return target


def _write_atomically(path: str, text: str) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def _copy_to_hdfs(step_dir: str, root: str, name: str, step: int, tracker_name: str) -> str:
    target = f"{root}/{name}"
    with tempfile.TemporaryDirectory() as tmp:
        tracker = os.path.join(tmp, tracker_name)
        with open(tracker, "w") as f:
            f.write(str(step))
        for args in (["-mkdir", "-p", root], ["-put", "-f", step_dir, target], ["-put", "-f", tracker, root]):
            _hdfs(args, step_dir, target)
    return target


def _hdfs(args: list[str], step_dir: str, target: str) -> None:
    command = [shutil.which("hdfs") or "hdfs", "dfs", *args]
    try:
        done = subprocess.run(command, capture_output=True, text=True, check=False)
    except OSError as err:
        raise OSError(f"copying checkpoint {step_dir} to {target}: cannot run {command[0]}: {err}") from err
    if done.returncode != 0:
        raise OSError(
            f"copying checkpoint {step_dir} to {target} failed ({_KEPT}): "
            f"`{' '.join(command)}` exited {done.returncode}: {done.stderr.strip()[-500:]}"
        )
