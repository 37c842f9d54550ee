"""SFT resume (veRL's trainer.resume_mode for the SFT trainer): a run stopped after a checkpoint and started
again continues exactly as the uninterrupted run did (the same losses, learning rates and final weights),
across an epoch boundary; a checkpoint without training state is refused by name, never overwritten."""

from __future__ import annotations

import os

import pytest
import torch
from safetensors.torch import load_file

from hybridflow.config.loader import ConfigError, load_config
from hybridflow.main_sft import run_sft
from hybridflow.trainer import sft_trainer
from hybridflow.trainer.sft_trainer import ENGINE_STATE_DIR, latest_hf_dir
from tests.trainer.test_sft_trainer import read_metrics, sft_overrides

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py

# 12 rows in batches of 4: 3 steps an epoch, so step 5 is in the second epoch; cosine schedule with warmup,
# so the learning rate of every step depends on the restored schedule
RUN = {
    "data.train_max_samples": 12,
    "trainer.total_training_steps": 5,
    "trainer.save_freq": 2,
    "trainer.test_freq": -1,
    "optim.lr_scheduler": "cosine",
    "optim.lr_warmup_steps": 2,
    "trainer.logger": "[file]",
}


def _config(model_dir, data_dir, out, **extra):
    return load_config("sft_trainer", sft_overrides(model_dir, data_dir, out, **{**RUN, **extra}))


def _weights(directory) -> dict[str, torch.Tensor]:
    return load_file(os.path.join(directory, "model.safetensors"))


def _stop_at(monkeypatch, step: int) -> None:
    """Interrupt the run as step ``step`` begins (the trainer counts the step before training it)."""
    original = sft_trainer.FSDPSFTTrainer.training_step

    def training_step(self, batch):
        if self.global_step == step:
            raise KeyboardInterrupt(f"simulated stop at step {step}")
        return original(self, batch)

    monkeypatch.setattr(sft_trainer.FSDPSFTTrainer, "training_step", training_step)


def test_a_stopped_run_resumes_exactly_like_the_uninterrupted_one(tiny_model_dir, tiny_data_dir, tmp_path):
    full = str(tmp_path / "full")
    final = run_sft(_config(tiny_model_dir, tiny_data_dir, full))
    reference = read_metrics(full)
    assert [r["step"] for r in reference] == [1, 2, 3, 4, 5] and reference[-1]["train/epoch"] == 1

    part = str(tmp_path / "part")
    with pytest.MonkeyPatch.context() as patch:
        _stop_at(patch, 5)  # steps 1-4 trained, the checkpoint of step 4 written
        with pytest.raises(KeyboardInterrupt):
            run_sft(_config(tiny_model_dir, tiny_data_dir, part))
    assert latest_hf_dir(part) == os.path.join(part, "global_step_4")
    assert os.path.isdir(os.path.join(part, "global_step_4", ENGINE_STATE_DIR))
    with pytest.MonkeyPatch.context() as patch:
        _stop_at(patch, 3)  # a second run, stopped after the checkpoint of step 2
        with pytest.raises(KeyboardInterrupt):
            run_sft(_config(tiny_model_dir, tiny_data_dir, str(tmp_path / "early")))

    # resume from step 2 (epoch 0, third batch) and from step 4 (epoch 1, second batch)
    for out, first_resumed in ((str(tmp_path / "early"), 3), (part, 5)):
        before = len(read_metrics(out))
        resumed_final = run_sft(_config(tiny_model_dir, tiny_data_dir, out))
        rows = read_metrics(out)
        assert len(rows) == before + 5 - first_resumed + 1  # the earlier lines are kept, the new ones appended
        resumed = {r["step"]: r for r in rows[before:]}
        assert sorted(resumed) == list(range(first_resumed, 6))
        for step, row in resumed.items():
            expected = reference[step - 1]
            assert row["train/lr"] == pytest.approx(expected["train/lr"], rel=1e-9), step
            assert row["train/loss"] == pytest.approx(expected["train/loss"], rel=1e-5), step
            assert row["train/epoch"] == expected["train/epoch"]
        got, want = _weights(resumed_final), _weights(final)
        assert got.keys() == want.keys()
        for name in want:
            torch.testing.assert_close(got[name], want[name], rtol=1e-5, atol=1e-6, msg=name)


def test_a_finished_run_started_again_returns_its_checkpoint(tiny_model_dir, tiny_data_dir, tmp_path):
    out = str(tmp_path / "out")
    extra = {"trainer.total_training_steps": 2, "data.train_max_samples": -1}
    final = run_sft(_config(tiny_model_dir, tiny_data_dir, out, **extra))
    lines, stamp = len(read_metrics(out)), os.path.getmtime(os.path.join(final, "model.safetensors"))
    assert run_sft(_config(tiny_model_dir, tiny_data_dir, out, **extra)) == final
    assert len(read_metrics(out)) == lines and os.path.getmtime(os.path.join(final, "model.safetensors")) == stamp


def test_a_checkpoint_without_training_state_is_refused_not_replaced(tiny_model_dir, tiny_data_dir, tmp_path):
    out = str(tmp_path / "out")
    weights_only = {"trainer.total_training_steps": 2, "checkpoint.save_contents": "[hf_model]"}
    final = run_sft(_config(tiny_model_dir, tiny_data_dir, out, **weights_only))
    assert not os.path.exists(os.path.join(final, ENGINE_STATE_DIR))
    saved = _weights(final)
    with pytest.raises(ValueError, match=r"holds no training state .* trainer.resume_mode=disable .* model.path="):
        run_sft(_config(tiny_model_dir, tiny_data_dir, out, **{"trainer.total_training_steps": 3}))
    for name, tensor in _weights(final).items():
        assert torch.equal(tensor, saved[name])  # nothing written was replaced
    # resume_mode=disable starts over in the same directory
    run_sft(_config(tiny_model_dir, tiny_data_dir, out, **weights_only, **{"trainer.resume_mode": "disable"}))
    assert [r["step"] for r in read_metrics(out)] == [1, 2, 1, 2]


def test_resume_path_continues_the_named_checkpoint(tiny_model_dir, tiny_data_dir, tmp_path):
    src = str(tmp_path / "src")
    run_sft(_config(tiny_model_dir, tiny_data_dir, src, **{"trainer.total_training_steps": 2, "trainer.save_freq": 1}))
    other = str(tmp_path / "other")
    named = os.path.join(src, "global_step_1")
    trainer = sft_trainer.FSDPSFTTrainer(
        _config(
            tiny_model_dir,
            tiny_data_dir,
            other,
            **{"trainer.resume_mode": "resume_path", "trainer.resume_from_path": named},
        )
    )
    assert trainer.global_step == 1 and trainer.resumed_from == named
    weights = _weights(named)
    for name, param in trainer.module.state_dict().items():
        if name in weights:
            assert torch.equal(param, weights[name]), name
    assert trainer.lr_scheduler.last_epoch == 1  # the schedule stepped once, as when it was saved
    with pytest.raises(FileNotFoundError, match="trainer.resume_from_path="):
        sft_trainer.FSDPSFTTrainer(
            _config(
                tiny_model_dir,
                tiny_data_dir,
                other,
                **{"trainer.resume_mode": "resume_path", "trainer.resume_from_path": str(tmp_path / "nowhere")},
            )
        )
    with pytest.raises(ConfigError, match="resume_mode=resume_path needs trainer.resume_from_path"):
        sft_trainer.FSDPSFTTrainer(
            _config(tiny_model_dir, tiny_data_dir, other, **{"trainer.resume_mode": "resume_path"})
        )


@pytest.mark.slow
def test_two_processes_resume_on_two_or_on_one(tiny_model_dir, tiny_data_dir, tmp_path):
    """torchrun, 2 gloo processes (FSDP2): a run saved at step 2 resumes on 2 processes and on 1 (the
    checkpoint resharded) and gives the uninterrupted run's step-3 loss either way."""
    import shutil

    from tests.trainer.test_sft_trainer import torchrun_sft

    extra = {"data.train_batch_size": 8, "data.micro_batch_size_per_gpu": 2, "trainer.logger": "[file]"}

    def torchrun(out, steps):
        torchrun_sft(
            sft_overrides(tiny_model_dir, tiny_data_dir, out, **extra, **{"trainer.total_training_steps": steps})
        )

    reference = str(tmp_path / "reference")  # uninterrupted, one process
    run_sft(
        load_config(
            "sft_trainer",
            sft_overrides(tiny_model_dir, tiny_data_dir, reference, **extra, **{"trainer.total_training_steps": 3}),
        )
    )
    expected = read_metrics(reference)[-1]
    assert expected["step"] == 3

    two = str(tmp_path / "two")
    torchrun(two, 2)
    one = str(tmp_path / "one")
    shutil.copytree(two, one)
    torchrun(two, 3)  # resumed on 2 processes
    run_sft(  # resumed on 1 process
        load_config(
            "sft_trainer",
            sft_overrides(tiny_model_dir, tiny_data_dir, one, **extra, **{"trainer.total_training_steps": 3}),
        )
    )
    for out in (two, one):
        last = read_metrics(out)[-1]
        assert last["step"] == 3 and last["train/loss"] == pytest.approx(expected["train/loss"], rel=1e-4), out
