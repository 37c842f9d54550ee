"""A save that fails mid-write (a full disk) names where, leaves the previous checkpoint the latest and
leaves no partial directory behind; ``trainer.continue_after_failed_save`` goes on (issue 31, point 3).

In-process backend: the driver and the worker write in this process, so ENOSPC is injected by
wrapping ``torch.save`` for the file each case names.
"""

from __future__ import annotations

import errno
import os

import pytest
import torch

from hybridflow.config.loader import load_config
from hybridflow.main_ppo import run_ppo
from hybridflow.trainer import checkpoint as ckpt
from tests.trainer.e2e_helpers import base_overrides

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


def _full_disk_at(monkeypatch, step: int, file_prefix: str) -> list[str]:
    """Make torch.save raise ENOSPC for files named ``file_prefix*`` inside the step-``step`` save."""
    original, failed = torch.save, []

    def save(obj, f, *args, **kwargs):
        path = str(f)
        if f"global_step_{step}.tmp-" in path and os.path.basename(path).startswith(file_prefix):
            failed.append(path)
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)
        return original(obj, f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", save)
    return failed


def _config(tiny_model_dir, tiny_data_dir, tmp_path, *extra):
    overrides = base_overrides(tiny_model_dir, tiny_data_dir, tmp_path, steps=3, backend="inprocess")
    overrides += [
        f"trainer.default_local_dir={tmp_path / 'ckpt'}",
        "trainer.save_freq=1",
        "trainer.test_freq=-1",
        "trainer.logger=['console']",
        *extra,
    ]
    return load_config("ppo_trainer", overrides)


@pytest.mark.parametrize("writer, prefix", [("driver", "data.pt"), ("actor workers", "extra_state")])
def test_a_full_disk_stops_the_run_naming_the_writer_and_path(
    tiny_model_dir, tiny_data_dir, tmp_path, monkeypatch, writer, prefix
):
    failed = _full_disk_at(monkeypatch, 2, prefix)
    with pytest.raises(ckpt.CheckpointSaveError) as info:
        run_ppo(_config(tiny_model_dir, tiny_data_dir, tmp_path))
    message = str(info.value)
    assert failed and f"step 2 failed in the {writer} into" in message and "No space left on device" in message
    root = str(tmp_path / "ckpt")
    assert ckpt.read_latest_step(root) == 1 and sorted(ckpt.complete_steps(root)) == [1]
    assert sorted(os.listdir(root)) == ["global_step_1", ckpt.LATEST_FILE]  # the step-2 tmp dir is gone
    assert "continues from" in "\n".join(getattr(info.value, "__notes__", [])) and "global_step_1" in str(
        info.value.__notes__
    )


def test_continue_after_failed_save_goes_on_to_the_next_save(tiny_model_dir, tiny_data_dir, tmp_path, monkeypatch):
    failed = _full_disk_at(monkeypatch, 2, "data.pt")
    metrics = run_ppo(_config(tiny_model_dir, tiny_data_dir, tmp_path, "trainer.continue_after_failed_save=True"))
    root = str(tmp_path / "ckpt")
    assert failed and sorted(ckpt.complete_steps(root)) == [1, 3] and ckpt.read_latest_step(root) == 3
    assert metrics["checkpoint/failed_saves"] == 1 and metrics["training/global_step"] == 3
    assert not [name for name in os.listdir(root) if ".tmp-" in name]
