"""Damaged or foreign checkpoints are refused naming the file, and nothing in them runs (issue 31, point 4).

Each step directory here is built the way the trainer lays it out (driver state through
``save_dataloader_state``, a real torch.distributed.checkpoint of a small module per role, one
extra-state file per rank), then damaged in one place.
"""

from __future__ import annotations

import os
import pathlib
import pickle
import warnings
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.distributed.checkpoint as dcp

from hybridflow.protocol import DataProto
from hybridflow.trainer import checkpoint as ckpt
from hybridflow.utils.safe_load import (
    CheckpointFileError,
    DamagedCheckpointError,
    UnsafeCheckpointError,
    load_torch_file,
    read_dcp_metadata,
)
from hybridflow.workers.checkpoint import get_rng_state


class _TouchOnLoad:
    """Unpickling this calls Path.touch(marker): proof that a loader ran code from the file."""

    def __init__(self, marker: pathlib.Path):
        self.marker = marker

    def __reduce__(self):
        return (pathlib.Path.touch, (self.marker,))


def _pending_group() -> DataProto:
    group = DataProto.from_dict(
        tensors={"input_ids": torch.arange(6).view(2, 3)}, meta_info={"global_steps": 4, "temperature": 0.7}
    )
    messages = np.empty(2, dtype=object)
    messages[0] = [{"role": "user", "content": "1+1"}]
    messages[1] = [{"role": "user", "content": "2+2"}]
    group.non_tensor_batch["raw_prompt"] = messages
    group.non_tensor_batch["data_source"] = np.array(["a", "b"], dtype=object)
    return group


def _write_step(root: pathlib.Path, step: int, world: int = 2) -> pathlib.Path:
    tmp = ckpt.begin_save(str(root), step)
    ckpt.save_dataloader_state(
        tmp,
        {
            "dataloader": {"epoch": 0, "position": step},
            "pending_groups": [_pending_group()],
            "driver_rng": get_rng_state(),
        },
    )
    actor = pathlib.Path(ckpt.role_dir(tmp, "actor"))
    model = torch.nn.Linear(4, 3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save({"model": model.state_dict()}, checkpoint_id=str(actor / "dcp"), no_dist=True)
    for rank in range(world):
        torch.save(
            {"lr_scheduler": {"last_epoch": step}, "rng": get_rng_state(), "extra_state": None},
            actor / f"extra_state_world_size_{world}_rank_{rank}.pt",
        )
    return pathlib.Path(ckpt.commit_save(str(root), step, tmp))


def _trainer_cfg(root, mode="auto", skip=False, path=None):
    return SimpleNamespace(
        resume_mode=mode, default_local_dir=str(root), resume_from_path=path, resume_skip_damaged=skip
    )


def test_driver_state_round_trips_through_a_weights_only_load(tmp_path):
    step = _write_step(tmp_path, 1)
    state = ckpt.load_dataloader_state(str(step))
    group = state["pending_groups"][0]
    assert isinstance(group, DataProto)
    assert torch.equal(group.batch["input_ids"], torch.arange(6).view(2, 3))
    assert group.non_tensor_batch["raw_prompt"][1] == [{"role": "user", "content": "2+2"}]
    assert group.non_tensor_batch["raw_prompt"].shape == (2,)  # one object per row, not a 2-D array
    assert group.meta_info == {"global_steps": 4, "temperature": 0.7}
    assert state["dataloader"] == {"epoch": 0, "position": 1}
    assert isinstance(state["driver_rng"]["numpy"][1], np.ndarray)


def test_a_pickle_that_would_run_code_is_refused_and_never_runs(tmp_path):
    marker = tmp_path / "ran"
    path = tmp_path / "data.pt"
    torch.save({"dataloader": _TouchOnLoad(marker)}, path)
    with pytest.raises(UnsafeCheckpointError, match="data.pt") as info:
        load_torch_file(str(path))
    assert "it asks for getattr" in str(info.value)  # Path.touch pickles as getattr(Path, "touch")
    assert "add_safe_globals" not in str(info.value)  # no advice to switch the protection off
    assert not marker.exists()
    # the plain torch.load this replaces would have run it
    torch.load(path, weights_only=False)
    assert marker.exists()


def test_a_foreign_dcp_metadata_is_refused_and_never_runs(tmp_path):
    step = _write_step(tmp_path, 1)
    metadata = step / "actor" / "dcp" / ".metadata"
    assert read_dcp_metadata(str(metadata)).state_dict_metadata  # the real one reads
    marker = tmp_path / "ran"
    metadata.write_bytes(pickle.dumps(_TouchOnLoad(marker)))
    with pytest.raises(UnsafeCheckpointError, match=r"\.metadata"):
        read_dcp_metadata(str(metadata))
    with pytest.raises(UnsafeCheckpointError, match=r"\.metadata"):
        ckpt.verify_checkpoint(str(step), ["actor"])
    assert not marker.exists()


@pytest.mark.parametrize(
    "damage, names",
    [
        ("truncate data.pt", "data.pt"),
        ("empty data.pt", "data.pt"),
        ("missing rank", "extra_state_world_size_2_rank_1.pt"),
        ("truncate a rank", "extra_state_world_size_2_rank_0.pt"),
        ("truncate a shard", ".distcp"),
        ("missing role", "critic"),
    ],
)
def test_a_damaged_step_is_refused_naming_the_file(tmp_path, damage, names):
    step = _write_step(tmp_path, 1)
    ckpt.verify_checkpoint(str(step), ["actor"])  # whole
    actor = step / "actor"
    roles = ["actor"]
    if damage == "truncate data.pt":
        data = (step / "data.pt").read_bytes()
        (step / "data.pt").write_bytes(data[: len(data) // 2])
    elif damage == "empty data.pt":
        (step / "data.pt").write_bytes(b"")
    elif damage == "missing rank":
        os.remove(actor / "extra_state_world_size_2_rank_1.pt")
    elif damage == "truncate a rank":
        path = actor / "extra_state_world_size_2_rank_0.pt"
        path.write_bytes(path.read_bytes()[:100])
    elif damage == "truncate a shard":
        shard = next((actor / "dcp").glob("*.distcp"))
        shard.write_bytes(shard.read_bytes()[:10])
    else:
        roles = ["actor", "critic"]
    with pytest.raises(CheckpointFileError, match=names.replace(".", r"\.")) as info:
        ckpt.verify_checkpoint(str(step), roles)
    assert isinstance(info.value, DamagedCheckpointError)


def test_resume_refuses_a_damaged_latest_unless_asked_to_fall_back(tmp_path):
    _write_step(tmp_path, 1)
    latest = _write_step(tmp_path, 2)
    os.remove(latest / "actor" / "extra_state_world_size_2_rank_1.pt")
    with pytest.raises(CheckpointFileError, match="resume_skip_damaged") as info:
        ckpt.resumable_checkpoint(_trainer_cfg(tmp_path), ["actor"])
    assert "extra_state_world_size_2_rank_1.pt" in str(info.value) and "global_step_2" in str(info.value)
    assert ckpt.resumable_checkpoint(_trainer_cfg(tmp_path, skip=True), ["actor"]) == str(tmp_path / "global_step_1")
    # a checkpoint the user named is never swapped for another
    named = _trainer_cfg(tmp_path, mode="resume_path", skip=True, path=str(latest))
    with pytest.raises(CheckpointFileError, match="extra_state_world_size_2_rank_1.pt"):
        ckpt.resumable_checkpoint(named, ["actor"])


def test_fall_back_never_turns_into_a_fresh_start(tmp_path):
    for step in (1, 2):
        path = _write_step(tmp_path, step)
        (path / "data.pt").write_bytes(b"junk")
    with pytest.raises(CheckpointFileError, match="no older whole checkpoint"):
        ckpt.resumable_checkpoint(_trainer_cfg(tmp_path, skip=True), ["actor"])


def test_prompt_groups_come_back_only_as_the_classes_the_trainer_names(tmp_path):
    from hybridflow.trainer.ppo.rollouter import CHECKPOINT_TYPES, PromptGroup

    tmp = ckpt.begin_save(str(tmp_path), 1)
    group = PromptGroup(gen_index=3, position=1, epoch=0, prompts=_pending_group())
    ckpt.save_dataloader_state(tmp, {"pending_groups": [group]})
    back = ckpt.load_dataloader_state(tmp, restorable=CHECKPOINT_TYPES)["pending_groups"][0]
    assert isinstance(back, PromptGroup) and (back.gen_index, back.position, back.epoch) == (3, 1, 0)
    assert back.prompts.non_tensor_batch["data_source"].tolist() == ["a", "b"]
    with pytest.raises(ValueError, match="PromptGroup"):
        ckpt.load_dataloader_state(tmp)  # a caller that restores no class gets no object built
