"""Resume: a run stopped after its step-2 checkpoint and rerun with resume_mode=auto must continue
exactly as the uninterrupted run did (same prompts in the same order, same samples, same losses).

In-process backend (one process, deterministic, no Ray start-up). The prompt order is recorded per
step from the batch's ``index`` values by wrapping ``RayPPOTrainer.train_step``.
"""

from __future__ import annotations

import logging
import os

import pytest

from hybridflow.config.loader import load_config
from hybridflow.main_ppo import run_ppo
from hybridflow.trainer import checkpoint as ckpt
from hybridflow.trainer.ppo import ray_trainer
from tests.trainer.e2e_helpers import base_overrides

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py

# metrics that depend on the sampled responses and on the weights: equal only if the generation RNG,
# the weights, the optimizer and the data position were all restored
COMPARED = ("critic/score/mean", "actor/pg_loss", "actor/entropy", "response_length/mean", "actor/grad_norm")


class StepRecorder:
    """Records (step, prompt indices, metrics) per train_step; optionally stops the run before a step."""

    def __init__(self, monkeypatch, stop_before_step: int | None = None):
        self.steps: dict[int, dict] = {}
        original = getattr(ray_trainer.RayPPOTrainer.train_step, "unwrapped", ray_trainer.RayPPOTrainer.train_step)
        recorder = self

        def train_step(trainer, batch):
            if stop_before_step is not None and trainer.global_steps == stop_before_step:
                raise KeyboardInterrupt(f"simulated stop before step {stop_before_step}")
            index = [int(i) for i in batch.non_tensor_batch["index"]]
            metrics = original(trainer, batch)
            recorder.steps[trainer.global_steps] = {"index": index, "metrics": dict(metrics)}
            return metrics

        train_step.unwrapped = original  # a second recorder in the same test wraps the real method
        monkeypatch.setattr(ray_trainer.RayPPOTrainer, "train_step", train_step)


def _config(tiny_model_dir, tiny_data_dir, tmp_path, ckpt_dir, *extra):
    overrides = base_overrides(tiny_model_dir, tiny_data_dir, tmp_path, steps=4, backend="inprocess")
    overrides += [
        f"trainer.default_local_dir={ckpt_dir}",
        "trainer.save_freq=2",
        "trainer.test_freq=-1",
        "trainer.logger=['console']",
        "actor_rollout_ref.actor.use_kl_loss=True",
        "actor_rollout_ref.model.enable_gradient_checkpointing=False",
        *extra,
    ]
    return load_config("ppo_trainer", overrides)


def test_resume_continues_exactly_like_the_uninterrupted_run(
    tiny_model_dir, tiny_data_dir, tmp_path, monkeypatch, caplog
):
    caplog.set_level(logging.INFO, logger="hybridflow")
    # 1) uninterrupted: 4 steps, checkpoints at 2 and 4; keep only the newest one
    full = StepRecorder(monkeypatch)
    run_ppo(_config(tiny_model_dir, tiny_data_dir, tmp_path, tmp_path / "full", "trainer.max_actor_ckpt_to_keep=1"))
    assert sorted(full.steps) == [1, 2, 3, 4]
    assert sorted(ckpt.complete_steps(str(tmp_path / "full"))) == [4]  # step 2 pruned by max_actor_ckpt_to_keep=1
    seen = [i for s in full.steps.values() for i in s["index"]]
    assert len(seen) == len(set(seen)) == 16  # 4 steps × 4 prompts, no repeats inside the epoch of 64

    # 2) interrupted: the same run stops before step 3 (after the step-2 checkpoint) ...
    part_dir = tmp_path / "part"
    first = StepRecorder(monkeypatch, stop_before_step=3)
    with pytest.raises(KeyboardInterrupt) as info:
        run_ppo(_config(tiny_model_dir, tiny_data_dir, tmp_path, part_dir))
    assert "resume_mode=auto continues from" in "\n".join(getattr(info.value, "__notes__", []))
    assert sorted(first.steps) == [1, 2] and ckpt.read_latest_step(str(part_dir)) == 2
    # ... and a rerun (resume_mode=auto is the default) does steps 3 and 4 only
    second = StepRecorder(monkeypatch)
    caplog.clear()
    run_ppo(_config(tiny_model_dir, tiny_data_dir, tmp_path, part_dir))
    assert "global_step_2 (global step 2)" in caplog.text
    assert sorted(second.steps) == [3, 4]

    for step in (1, 2):
        assert first.steps[step]["index"] == full.steps[step]["index"]
    for step in (3, 4):
        assert second.steps[step]["index"] == full.steps[step]["index"], f"step {step}: other prompts after resume"
        for key in COMPARED:
            assert second.steps[step]["metrics"][key] == full.steps[step]["metrics"][key], (step, key)
    assert ckpt.read_latest_step(str(part_dir)) == 4


def test_resume_ignores_interrupted_saves_and_a_dangling_latest(
    tiny_model_dir, tiny_data_dir, tmp_path, monkeypatch, caplog
):
    """A tmp save dir and a latest file naming a missing step are never taken (integration check)."""
    root = tmp_path / "ckpt_dir"
    run_ppo(_config(tiny_model_dir, tiny_data_dir, tmp_path, root, "trainer.total_training_steps=2"))
    assert sorted(ckpt.complete_steps(str(root))) == [2]
    # a crash mid-save of step 4 (a tmp dir with partial content) and a latest file pointing at step 6
    partial = root / "global_step_4.tmp-0123abcd"
    (partial / "actor").mkdir(parents=True)
    (partial / "actor" / "garbage.pt").write_bytes(b"not a checkpoint")
    (root / ckpt.LATEST_FILE).write_text("6\n")
    (root / "global_step_6").mkdir()  # no COMPLETE marker: a half-written step

    recorder = StepRecorder(monkeypatch)
    caplog.set_level(logging.INFO, logger="hybridflow")
    run_ppo(
        _config(tiny_model_dir, tiny_data_dir, tmp_path, root, "trainer.total_training_steps=3", "trainer.save_freq=-1")
    )
    out = caplog.text
    assert f"resumed from {root / 'global_step_2'} (global step 2)" in out
    assert sorted(recorder.steps) == [3]
    assert not partial.exists()  # the interrupted save was cleaned up
    assert os.path.isdir(root / "global_step_2")


def test_resume_path_must_name_a_complete_checkpoint(tiny_model_dir, tiny_data_dir, tmp_path):
    bad = tmp_path / "global_step_3"
    bad.mkdir()
    config = _config(
        tiny_model_dir,
        tiny_data_dir,
        tmp_path,
        tmp_path / "c",
        "trainer.resume_mode=resume_path",
        f"trainer.resume_from_path={bad}",
    )
    with pytest.raises(ValueError, match="not a complete checkpoint"):
        run_ppo(config)
