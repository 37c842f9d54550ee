"""trainer.default_hdfs_dir for main_sft (veRL's SFT checkpoint handler copies each checkpoint there): the
copy is a complete checkpoint folder with its own tracker, a run resumes from it, hdfs:// goes through the
`hdfs dfs` command line, and destinations nothing here can write are refused by key at start-up."""

from __future__ import annotations

import os
import stat

import pytest

from hybridflow.config.errors import ConfigError
from hybridflow.config.loader import load_config
from hybridflow.main_sft import run_sft
from hybridflow.utils.checkpoint_copy import copy_checkpoint
from tests.trainer.test_sft_trainer import read_metrics, sft_overrides

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


def _sft(model_dir, data_dir, out, **extra) -> str:
    return run_sft(load_config("sft_trainer", sft_overrides(model_dir, data_dir, out, **extra)))


def test_each_checkpoint_is_copied_and_a_run_resumes_from_the_copy(tiny_model_dir, tiny_data_dir, tmp_path):
    local, copy = str(tmp_path / "local"), str(tmp_path / "copy")
    extra = {"trainer.save_freq": 1, "trainer.max_ckpt_to_keep": 1, "trainer.logger": "[file]"}
    final = _sft(tiny_model_dir, tiny_data_dir, local, **extra, **{"trainer.default_hdfs_dir": copy})
    assert sorted(os.listdir(local)) == ["global_step_2", "latest_checkpointed_iteration.txt", "metrics.jsonl"]
    # the copy keeps every step (max_ckpt_to_keep prunes default_local_dir only), and names the newest
    assert sorted(os.listdir(copy)) == ["global_step_1", "global_step_2", "latest_checkpointed_iteration.txt"]
    assert open(os.path.join(copy, "latest_checkpointed_iteration.txt")).read() == "2"
    for root, _dirs, files in os.walk(final):
        for name in files:
            rel = os.path.relpath(os.path.join(root, name), final)
            with open(os.path.join(final, rel), "rb") as a, open(os.path.join(copy, "global_step_2", rel), "rb") as b:
                assert a.read() == b.read(), rel

    # the copy is a checkpoint directory: a longer run pointed at it continues from step 2
    resumed = _sft(
        tiny_model_dir, tiny_data_dir, copy, **{"trainer.total_training_steps": 3, "trainer.logger": "[file]"}
    )
    assert resumed == os.path.join(copy, "global_step_3")
    assert [m["step"] for m in read_metrics(copy) if "train/loss" in m] == [3]


FAKE_HDFS = """#!/bin/sh
# a stand-in for `hdfs dfs`: logs its arguments, maps hdfs://cluster/<path> to $FAKE_HDFS_ROOT/<path>
echo "$@" >> "$FAKE_HDFS_ROOT/calls.log"
shift  # dfs
op="$1"; shift
case "$op" in
  -mkdir) mkdir -p "$FAKE_HDFS_ROOT/${2#hdfs://cluster/}" ;;
  -put) src="$2"; dst="$FAKE_HDFS_ROOT/${3#hdfs://cluster/}"
        if [ -d "$dst" ]; then cp -r "$src" "$dst/"; else cp -r "$src" "$dst"; fi ;;
  *) exit 2 ;;
esac
"""


def test_an_hdfs_destination_goes_through_the_hdfs_command_line(tmp_path, monkeypatch):
    step_dir = tmp_path / "global_step_5"
    (step_dir / "engine").mkdir(parents=True)
    (step_dir / "model.safetensors").write_bytes(b"weights")
    (step_dir / "engine" / "state.pt").write_bytes(b"state")
    bin_dir, root = tmp_path / "bin", tmp_path / "hdfs"
    bin_dir.mkdir(), root.mkdir()
    script = bin_dir / "hdfs"
    script.write_text(FAKE_HDFS)
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_HDFS_ROOT", str(root))

    target = copy_checkpoint(str(step_dir), "hdfs://cluster/runs/a/", 5, "latest_checkpointed_iteration.txt")
    assert target == "hdfs://cluster/runs/a/global_step_5"
    assert (root / "runs/a/global_step_5/model.safetensors").read_bytes() == b"weights"
    assert (root / "runs/a/global_step_5/engine/state.pt").read_bytes() == b"state"
    assert (root / "runs/a/latest_checkpointed_iteration.txt").read_text() == "5"
    calls = (root / "calls.log").read_text().splitlines()
    assert calls[0] == "dfs -mkdir -p hdfs://cluster/runs/a"
    assert calls[1] == f"dfs -put -f {step_dir} hdfs://cluster/runs/a/global_step_5"

    (bin_dir / "hdfs").write_text("#!/bin/sh\necho 'put: Permission denied' >&2\nexit 1\n")
    with pytest.raises(
        OSError,
        match=r"to hdfs://cluster/runs/a/global_step_5 failed \(the local checkpoint is complete\)"
        r".*exited 1: put: Permission denied",
    ):
        copy_checkpoint(str(step_dir), "hdfs://cluster/runs/a", 5, "latest_checkpointed_iteration.txt")
    assert (step_dir / "model.safetensors").read_bytes() == b"weights"  # nothing local touched


def test_destinations_without_a_client_are_refused_by_key(tiny_model_dir, tiny_data_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no hdfs command here
    for where, why in (
        ("s3://bucket/run", "s3:// is not supported; give an hdfs:// URL or a local or mounted folder"),
        ("hdfs://cluster/run", "copying to HDFS runs the `hdfs` command line, which is not on PATH"),
    ):
        with pytest.raises(ConfigError, match=f"trainer.default_hdfs_dir={where}: {why}"):
            _sft(tiny_model_dir, tiny_data_dir, str(tmp_path / "out"), **{"trainer.default_hdfs_dir": where})
    assert not os.path.exists(tmp_path / "out")
