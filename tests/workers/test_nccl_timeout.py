"""``actor_rollout_ref.nccl_timeout``: how long a collective of the workers' process group waits before it
fails (veRL passes it to init_process_group; a long generation on one rank would otherwise fail the others'
wait at torch's default)."""

from __future__ import annotations

from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from hybridflow.config.loader import ConfigError, load_config
from hybridflow.main_ppo import build_trainer, checked_config
from hybridflow.utils.environ import restored_environ
from tests.trainer.e2e_helpers import base_overrides

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


def _config(tiny_model_dir, tiny_data_dir, tmp_path, timeout):
    overrides = base_overrides(tiny_model_dir, tiny_data_dir, tmp_path, backend="inprocess")
    return load_config("ppo_trainer", [*overrides, f"actor_rollout_ref.nccl_timeout={timeout}"])


def test_the_workers_process_group_waits_nccl_timeout(tiny_model_dir, tiny_data_dir, tmp_path):
    config = checked_config(_config(tiny_model_dir, tiny_data_dir, tmp_path, 1234))
    with restored_environ(["HYBRIDFLOW_DEVICE"]):
        trainer = build_trainer(config)
        trainer.init_workers()  # in process: the workers' group is this process's default group
        try:
            gloo = dist.group.WORLD._get_backend(torch.device("cpu"))
            assert gloo.options._timeout == timedelta(seconds=1234)
        finally:
            trainer.shutdown_workers()


def test_a_timeout_that_is_not_positive_is_refused(tiny_model_dir, tiny_data_dir, tmp_path):
    with pytest.raises(ConfigError, match="actor_rollout_ref.nccl_timeout=0 must be > 0"):
        checked_config(_config(tiny_model_dir, tiny_data_dir, tmp_path, 0))
