"""A worker process killed with SIGKILL in the middle of a step (Ray, 2 workers).

The driver must stop within seconds with an error naming the worker group (role), rank and method,
leave no partial checkpoint behind, and a rerun with resume_mode=auto must continue from the last
complete checkpoint with exactly the prompts an uninterrupted run would have seen.
"""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from hybridflow.config.loader import load_config
from hybridflow.data.rl_dataset import RLHFDataset
from hybridflow.data.sampler import create_rl_dataloader
from hybridflow.main_ppo import run_ppo
from hybridflow.single_controller.base.errors import WorkerDiedError, WorkerError
from hybridflow.trainer import checkpoint as ckpt
from hybridflow.trainer.ppo import ray_trainer
from tests.trainer.e2e_helpers import base_overrides

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py

KILL_AFTER_S = 0.3  # into step 2; a 2-worker step on this machine takes well over a second


def _config(tiny_model_dir, tiny_data_dir, tmp_path):
    overrides = base_overrides(tiny_model_dir, tiny_data_dir, tmp_path, steps=2, world=2, backend="ray")
    overrides += [
        "trainer.save_freq=1",
        "trainer.test_freq=-1",
        "trainer.logger=['console']",
        "actor_rollout_ref.model.enable_gradient_checkpointing=False",
    ]
    return load_config("ppo_trainer", overrides)


def _expected_order(config, tokenizer, steps: int) -> list[list[int]]:
    """Reference: the prompts a fresh loader hands out, batch by batch (no training involved)."""
    dataset = RLHFDataset(config.data.train_files, tokenizer, config.data)
    loader = create_rl_dataloader(dataset, batch_size=int(config.data.train_batch_size), seed=int(config.data.seed))
    out = []
    for batch in loader:
        out.append([int(i) for i in batch["index"]])
        if len(out) == steps:
            return out
    raise AssertionError("dataset too small")


class Recorder:
    """Wraps train_step: records the batch's prompt indices; at ``kill_step`` a thread kills rank 1."""

    def __init__(self, monkeypatch, kill_step: int | None = None):
        self.order: dict[int, list[int]] = {}
        self.kill_time: float | None = None
        self.killed_pid: int | None = None
        original = getattr(ray_trainer.RayPPOTrainer.train_step, "unwrapped", ray_trainer.RayPPOTrainer.train_step)
        rec = self

        def train_step(trainer, batch):
            rec.order[trainer.global_steps] = [int(i) for i in batch.non_tensor_batch["index"]]
            if trainer.global_steps == kill_step:
                pids = trainer.actor_rollout_wg.execute_all_sync("get_pid")
                assert len(set(pids)) == 2 and os.getpid() not in pids

                def kill():
                    time.sleep(KILL_AFTER_S)
                    rec.killed_pid, rec.kill_time = pids[1], time.monotonic()
                    os.kill(pids[1], signal.SIGKILL)

                threading.Thread(target=kill, daemon=True).start()
            return original(trainer, batch)

        train_step.unwrapped = original
        monkeypatch.setattr(ray_trainer.RayPPOTrainer, "train_step", train_step)


@pytest.mark.slow  # two Ray runs with 2 workers: ~1-2 minutes on 2 shared cores
def test_killed_worker_stops_the_driver_and_resume_loses_no_prompt(
    tiny_model_dir, tiny_data_dir, tiny_tokenizer, ray_session, tmp_path, monkeypatch
):
    config = _config(tiny_model_dir, tiny_data_dir, tmp_path)
    root = config.trainer.default_local_dir
    expected = _expected_order(config, tiny_tokenizer, steps=2)

    first = Recorder(monkeypatch, kill_step=2)
    with pytest.raises(WorkerError) as info:
        run_ppo(config)
    stopped = time.monotonic()
    assert first.kill_time is not None, "the kill never happened"
    assert stopped - first.kill_time < 10.0, f"driver needed {stopped - first.kill_time:.1f}s to notice the dead worker"
    err = info.value
    print(f"driver stopped {stopped - first.kill_time:.2f}s after the kill with:\n{err}")
    # the role's worker group, the killed rank (not the survivor whose collective broke) and the method
    assert isinstance(err, WorkerDiedError) and err.rank == 1, err
    assert err.group.endswith(":actor_rollout") and err.method.startswith("actor_rollout_"), (err.group, err.method)
    text = str(err)
    assert repr(err.group) in text and f"rank {err.rank}" in text and repr(err.method) in text
    notes = "\n".join(getattr(err, "__notes__", []))
    assert "global step 2" in notes and os.path.join(root, "global_step_1") in notes

    # no partial checkpoint: only step 1 is there, no tmp dir, latest names it
    assert sorted(ckpt.complete_steps(root)) == [1]
    assert not [n for n in os.listdir(root) if ".tmp-" in n], os.listdir(root)
    assert ckpt.read_latest_step(root) == 1

    second = Recorder(monkeypatch)
    run_ppo(config)  # resume_mode=auto (the default)
    assert sorted(second.order) == [2]
    assert [first.order[1], second.order[2]] == expected  # nothing lost, nothing repeated
    assert first.order[2] == expected[1]  # the interrupted step is redone with the same prompts
    assert sorted(ckpt.complete_steps(root)) == [1, 2]
