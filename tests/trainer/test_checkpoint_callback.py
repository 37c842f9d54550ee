"""``trainer.checkpoint_callback_class``: veRL 0.9's save hook runs on the driver after each complete save, a
hook written against veRL's import path loads unchanged, its exception ends the run with the checkpoint kept,
and a class that cannot be found is refused at start-up naming the key."""

from __future__ import annotations

import json
import os

import pytest

from hybridflow.config.loader import ConfigError, load_config
from hybridflow.main_ppo import run_ppo
from hybridflow.trainer import checkpoint as ckpt
from hybridflow.trainer.checkpoint_callback import CheckpointCallback, build_checkpoint_callback
from hybridflow.trainer.config_checks import validate_ppo_config
from tests.trainer.e2e_helpers import base_overrides

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py

# written as a veRL 0.9 user writes it: veRL's import path, keyword arguments, **kwargs
HOOK = """
import json
import os

from verl.trainer.ppo.checkpoint_callback import CheckpointCallback


class RecordSaves(CheckpointCallback):
    def on_save(self, trainer, global_step, checkpoint_dir, async_save=False, **kwargs):
        root = self.config.trainer.default_local_dir
        with open(os.path.join(root, "latest_checkpointed_iteration.txt")) as f:
            latest = int(f.read())
        entry = {
            "step": global_step,
            "dir": checkpoint_dir,
            "latest": latest,
            "listing": sorted(os.listdir(checkpoint_dir)),
            "trainer_step": trainer.global_steps,
            "async_save": async_save,
        }
        with open(os.path.join(os.path.dirname(root), "saves.jsonl"), "a") as f:
            f.write(json.dumps(entry) + "\\n")


class FailingUpload(CheckpointCallback):
    def on_save(self, trainer, global_step, checkpoint_dir, **kwargs):
        raise ConnectionError(f"upload of {checkpoint_dir} refused")


class NoHook:
    pass
"""


def _hook_file(tmp_path) -> str:
    path = tmp_path / "my_hooks.py"
    path.write_text(HOOK)
    return str(path)


def _config(tiny_model_dir, tiny_data_dir, tmp_path, hook: str, *extra):
    overrides = base_overrides(tiny_model_dir, tiny_data_dir, tmp_path, steps=3, backend="inprocess")
    overrides += [
        f"trainer.default_local_dir={tmp_path / 'ckpt'}",
        "trainer.test_freq=-1",
        "trainer.logger=['console']",
        f"trainer.checkpoint_callback_class={hook}",
        *extra,
    ]
    return load_config("ppo_trainer", overrides)


def test_the_hook_sees_each_complete_checkpoint_on_the_driver(tiny_model_dir, tiny_data_dir, tmp_path):
    hook = f"{_hook_file(tmp_path)}:RecordSaves"
    run_ppo(_config(tiny_model_dir, tiny_data_dir, tmp_path, hook, "trainer.save_freq=2"))
    with open(tmp_path / "saves.jsonl") as f:
        saves = [json.loads(line) for line in f]
    root = str(tmp_path / "ckpt")
    assert [s["step"] for s in saves] == [2, 3]  # every save_freq steps and the last step
    for s in saves:
        assert s["dir"] == os.path.join(root, f"global_step_{s['step']}")
        assert s["latest"] == s["step"] == s["trainer_step"]  # the tracker already names it
        assert ckpt.DATA_FILE in s["listing"] and "actor" in s["listing"]  # renamed into place, whole
        assert s["async_save"] is False


def test_an_exception_from_the_hook_ends_the_run_and_keeps_the_checkpoint(tiny_model_dir, tiny_data_dir, tmp_path):
    hook = f"{_hook_file(tmp_path)}:FailingUpload"
    with pytest.raises(ConnectionError, match="upload of .*global_step_1 refused") as info:
        run_ppo(_config(tiny_model_dir, tiny_data_dir, tmp_path, hook, "trainer.save_freq=1"))
    assert "trainer.checkpoint_callback_class" in "\n".join(info.value.__notes__)
    root = str(tmp_path / "ckpt")
    assert sorted(ckpt.complete_steps(root)) == [1] and ckpt.read_latest_step(root) == 1


def _validate(tiny_model_dir, tiny_data_dir, tmp_path, hook: str):
    return validate_ppo_config(_config(tiny_model_dir, tiny_data_dir, tmp_path, hook))


@pytest.mark.parametrize(
    "name, message", [("NoHook", "without an on_save method"), ("Missing", "defines no 'Missing'")]
)
def test_a_class_that_is_not_a_hook_is_refused_at_start_up(tiny_model_dir, tiny_data_dir, tmp_path, name, message):
    hook = f"{_hook_file(tmp_path)}:{name}"
    with pytest.raises(ConfigError, match=f"trainer.checkpoint_callback_class={hook}: .*{message}"):
        _validate(tiny_model_dir, tiny_data_dir, tmp_path, hook)


def test_a_module_path_that_does_not_import_is_refused_at_start_up(tiny_model_dir, tiny_data_dir, tmp_path):
    with pytest.raises(ConfigError, match="trainer.checkpoint_callback_class=no_such_pkg.hooks.Upload: ImportError"):
        _validate(tiny_model_dir, tiny_data_dir, tmp_path, "no_such_pkg.hooks.Upload")


def test_veRLs_dotted_path_and_no_class_give_the_base_hook(tiny_model_dir, tiny_data_dir, tmp_path):
    dotted = _config(tiny_model_dir, tiny_data_dir, tmp_path, "verl.trainer.ppo.checkpoint_callback.CheckpointCallback")
    hook = build_checkpoint_callback(dotted)
    assert type(hook) is CheckpointCallback and hook.config is dotted
    assert (
        type(build_checkpoint_callback(_config(tiny_model_dir, tiny_data_dir, tmp_path, "null"))) is CheckpointCallback
    )
