"""Driver bookkeeping: atomic step directories, the latest file, pruning, leftovers, resume modes."""

import os

import pytest

from hybridflow.trainer.checkpoint import (
    COMPLETE_MARKER,
    LATEST_FILE,
    begin_save,
    cleanup_partial_saves,
    commit_save,
    complete_steps,
    find_latest_checkpoint,
    load_dataloader_state,
    prune_checkpoints,
    read_latest_step,
    resolve_resume,
    save_dataloader_state,
    step_of,
)


def _save(root, step, payload="w"):
    """What the trainer does: workers write into the tmp dir, the driver adds data.pt, then commit."""
    tmp = begin_save(str(root), step)
    os.makedirs(os.path.join(tmp, "actor"))
    with open(os.path.join(tmp, "actor", "weights"), "w") as f:
        f.write(payload)
    save_dataloader_state(tmp, {"step": step})
    return commit_save(str(root), step, tmp)


def _listing(root):
    return sorted(os.listdir(root))


def test_commit_makes_a_complete_step_and_writes_latest_last(tmp_path):
    tmp = begin_save(str(tmp_path), 3)
    assert os.path.basename(tmp).startswith("global_step_3.tmp-")
    # before commit: nothing counts, no latest file
    assert find_latest_checkpoint(str(tmp_path)) is None and not (tmp_path / LATEST_FILE).exists()
    save_dataloader_state(tmp, {"epoch": 1, "batch": 4})
    final = commit_save(str(tmp_path), 3, tmp)
    assert final == str(tmp_path / "global_step_3")
    assert _listing(tmp_path) == ["global_step_3", LATEST_FILE]  # tmp dir renamed away, no tmp files
    assert (tmp_path / "global_step_3" / COMPLETE_MARKER).exists()
    assert read_latest_step(str(tmp_path)) == 3
    assert find_latest_checkpoint(str(tmp_path)) == final
    assert load_dataloader_state(final) == {"epoch": 1, "batch": 4}


def test_interrupted_save_is_never_latest_and_is_cleaned(tmp_path):
    _save(tmp_path, 2)
    tmp = begin_save(str(tmp_path), 4)  # workers wrote part of step 4, then the driver died
    os.makedirs(os.path.join(tmp, "actor"))
    assert find_latest_checkpoint(str(tmp_path)) == str(tmp_path / "global_step_2")
    assert resolve_resume("auto", str(tmp_path)) == str(tmp_path / "global_step_2")
    assert cleanup_partial_saves(str(tmp_path)) == [tmp]
    assert _listing(tmp_path) == ["global_step_2", LATEST_FILE]
    assert cleanup_partial_saves(str(tmp_path)) == []


def test_latest_file_naming_a_missing_or_incomplete_dir_falls_back(tmp_path):
    _save(tmp_path, 1)
    _save(tmp_path, 2)
    # a global_step_5 without the marker (e.g. copied by hand, or written by a non-atomic tool)
    os.makedirs(tmp_path / "global_step_5" / "actor")
    (tmp_path / LATEST_FILE).write_text("5\n")
    assert find_latest_checkpoint(str(tmp_path)) == str(tmp_path / "global_step_2")
    (tmp_path / LATEST_FILE).write_text("9\n")  # names a directory that does not exist
    assert find_latest_checkpoint(str(tmp_path)) == str(tmp_path / "global_step_2")
    (tmp_path / LATEST_FILE).write_text("garbage")
    assert find_latest_checkpoint(str(tmp_path)) == str(tmp_path / "global_step_2")
    # a valid latest file wins over a higher complete step (the user may have rolled back)
    (tmp_path / LATEST_FILE).write_text("1\n")
    assert find_latest_checkpoint(str(tmp_path)) == str(tmp_path / "global_step_1")
    assert list(complete_steps(str(tmp_path))) == [1, 2]


def test_recommit_same_step_replaces_it(tmp_path):
    _save(tmp_path, 3, payload="old")
    _save(tmp_path, 3, payload="new")
    assert (tmp_path / "global_step_3" / "actor" / "weights").read_text() == "new"
    assert _listing(tmp_path) == ["global_step_3", LATEST_FILE]


def test_crash_between_marker_and_rename_is_recovered(tmp_path):
    _save(tmp_path, 1)
    tmp = begin_save(str(tmp_path), 2)
    (tmp_path / os.path.basename(tmp) / COMPLETE_MARKER).write_text("2\n")  # marker written, rename never ran
    stale = begin_save(str(tmp_path), 2)  # plus an older, incomplete attempt at the same step
    assert find_latest_checkpoint(str(tmp_path)) == str(tmp_path / "global_step_1")
    assert cleanup_partial_saves(str(tmp_path)) == [stale]
    assert find_latest_checkpoint(str(tmp_path)) == str(tmp_path / "global_step_2")


def test_prune_keeps_newest_complete_steps(tmp_path):
    for step in (1, 2, 3, 4, 5):
        _save(tmp_path, step)
    tmp = begin_save(str(tmp_path), 6)
    for keep_all in (None, -1, 0):
        assert prune_checkpoints(str(tmp_path), keep_all) == []
    removed = prune_checkpoints(str(tmp_path), 2)
    assert removed == [str(tmp_path / f"global_step_{s}") for s in (1, 2, 3)]
    assert _listing(tmp_path) == sorted(["global_step_4", "global_step_5", os.path.basename(tmp), LATEST_FILE])
    assert prune_checkpoints(str(tmp_path), 2) == []


def test_resume_modes(tmp_path, monkeypatch):
    root = str(tmp_path / "run")
    assert resolve_resume("auto", root) is None  # nothing saved yet (directory absent): start fresh
    _save(root, 1)
    _save(root, 7)
    assert resolve_resume("auto", root) == os.path.join(root, "global_step_7")
    assert resolve_resume("disable", root) is None
    assert resolve_resume("resume_path", root, os.path.join(root, "global_step_1")) == os.path.join(
        root, "global_step_1"
    )
    monkeypatch.chdir(root)  # a relative path is taken from the working directory, as in veRL
    assert resolve_resume("resume_path", "elsewhere", "global_step_1/") == os.path.join(root, "global_step_1")

    with pytest.raises(ValueError, match="resume_from_path"):
        resolve_resume("resume_path", root, None)
    with pytest.raises(ValueError, match="global_step_"):
        resolve_resume("resume_path", root, root)
    with pytest.raises(FileNotFoundError, match="global_step_3"):
        resolve_resume("resume_path", root, os.path.join(root, "global_step_3"))
    os.makedirs(os.path.join(root, "global_step_9"))
    with pytest.raises(ValueError, match="not a complete checkpoint"):
        resolve_resume("resume_path", root, os.path.join(root, "global_step_9"))
    with pytest.raises(ValueError, match="auto, disable, resume_path"):
        resolve_resume("latest", root)


def test_step_of():
    assert step_of("/ckpt/global_step_12") == 12
    assert step_of("/ckpt/global_step_12/") == 12
    assert step_of("/ckpt/global_step_12/actor") == 12
    for bad in ("/ckpt/actor", "/ckpt/global_step_x", "/ckpt/global_step_3.tmp-ab"):
        with pytest.raises(ValueError, match="global_step_"):
            step_of(bad)
