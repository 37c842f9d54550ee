"""``ray_kwargs.timeline_json_file`` is Ray's record of its workers' calls: a run without Ray workers refuses
it before anything starts (the Ray run that writes it is ``test_ppo_e2e``'s default-suite run)."""

from __future__ import annotations

import pytest

from hybridflow.config.loader import ConfigError, load_config
from hybridflow.main_ppo import checked_config
from hybridflow.single_controller.factory import write_timeline
from tests.trainer.e2e_helpers import base_overrides


def test_the_in_process_backend_refuses_a_timeline_by_its_keys(tiny_model_dir, tiny_data_dir, tmp_path):
    overrides = base_overrides(tiny_model_dir, tiny_data_dir, tmp_path, backend="inprocess")
    config = load_config("ppo_trainer", [*overrides, f"ray_kwargs.timeline_json_file={tmp_path / 't.json'}"])
    with pytest.raises(ConfigError, match="ray_kwargs.timeline_json_file=.*trainer.backend=inprocess runs no Ray"):
        checked_config(config)
    checked_config(load_config("ppo_trainer", overrides))  # the same run without the key is fine


def test_write_timeline_needs_the_ray_backend(tmp_path):
    with pytest.raises(ValueError, match="trainer.backend=inprocess runs no Ray workers"):
        write_timeline("inprocess", str(tmp_path / "t.json"))
    assert not (tmp_path / "t.json").exists()
