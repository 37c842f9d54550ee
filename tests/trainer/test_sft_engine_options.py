"""The SFT trainer's engine options that veRL's FSDP engine honours (engine.param_offload /
optimizer_offload / offload_policy, fsdp_size, seed, full_determinism): refused before, now acted on.
Expected values come from the options' definitions (which weights a seed draws, whether a 2-process
hybrid-sharded run sees what one process sees), not from this code's output."""

from __future__ import annotations

import os

import pytest
import torch
from safetensors.torch import load_file

from hybridflow.config.engine import engine_as_in_yaml
from hybridflow.config.errors import ConfigError
from hybridflow.config.loader import load_config
from hybridflow.config.sft_trainer import SFTRunConfig, SFTTrainerConfig
from hybridflow.main_sft import run_sft
from tests.trainer.test_sft_trainer import make_trainer, read_metrics, sft_overrides, torchrun_sft

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


def _config(strategy="fsdp", device="cpu", **engine) -> SFTTrainerConfig:
    return SFTTrainerConfig(
        engine=engine_as_in_yaml(dtype="auto", strategy=strategy, **engine),
        trainer=SFTRunConfig(device=device, logger="console"),
    )


def test_offload_and_hybrid_sharding_keys_are_checked_by_name():
    loggers = ("console",)
    notes = _config(param_offload=True).validate(1, loggers)
    assert any("engine.param_offload=True has no effect on cpu" in n for n in notes)
    with pytest.raises(ConfigError, match="engine.optimizer_offload=True needs engine.strategy=fsdp"):
        _config(strategy="ddp", device="cuda", optimizer_offload=True).validate(1, loggers)
    with pytest.raises(ConfigError, match=r"engine.fsdp_size=3 must divide the number of training ranks \(4\)"):
        _config(fsdp_size=3).validate(4, loggers)
    with pytest.raises(ConfigError, match=r"engine.fsdp_size=0 must be -1 \(shard over all ranks\)"):
        _config(fsdp_size=0).validate(1, loggers)
    assert any(
        "engine.fsdp_size=2 is unused with engine.strategy=ddp" in n
        for n in _config("ddp", fsdp_size=2).validate(2, loggers)
    )
    _config(fsdp_size=2).validate(4, loggers)  # two groups of two


def test_the_engine_gets_fsdp_size_and_offloads_only_on_cuda(tiny_model_dir, tiny_data_dir, tmp_path):
    trainer = make_trainer(
        tiny_model_dir, tiny_data_dir, tmp_path, **{"engine.fsdp_size": 1, "engine.param_offload": True}
    )
    assert trainer.engine.spec.fsdp_size == 1
    assert not trainer.engine.spec.param_offload  # cpu: the weights are in host memory already


def _lora_run(model_dir, data_dir, out, seed: int) -> dict[str, torch.Tensor]:
    overrides = sft_overrides(
        model_dir,
        data_dir,
        out,
        **{
            "model.lora_rank": 4,
            "model.lora_alpha": 8,
            "model.target_modules": "[q_proj,v_proj]",
            "trainer.total_training_steps": 1,
            "trainer.logger": "[file]",
            "engine.full_determinism": True,
            "engine.seed": seed,
        },
    )
    final = run_sft(load_config("sft_trainer", overrides))
    return load_file(os.path.join(final, "lora_adapter", "adapter_model.safetensors"))


def test_full_determinism_seeds_the_model_with_engine_seed(
    tiny_model_dir,
    tiny_data_dir,
    tmp_path,
    restore_torch_switches,  # noqa: F811
):
    """veRL's engine reseeds with engine.seed before it builds the model: LoRA's random A matrices are
    drawn from that seed (trainer.seed fixed), and the deterministic-kernel switches are on."""
    torch.use_deterministic_algorithms(False)
    a = _lora_run(tiny_model_dir, tiny_data_dir, str(tmp_path / "a"), seed=7)
    assert torch.are_deterministic_algorithms_enabled()
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    again = _lora_run(tiny_model_dir, tiny_data_dir, str(tmp_path / "again"), seed=7)
    other = _lora_run(tiny_model_dir, tiny_data_dir, str(tmp_path / "other"), seed=8)
    lora_a = sorted(k for k in a if ".lora_A." in k)
    assert lora_a and all(torch.equal(a[k], again[k]) for k in a)
    assert all(not torch.equal(a[k], other[k]) for k in lora_a)


@pytest.mark.slow
def test_hybrid_sharding_over_two_processes_matches_one_process(tiny_model_dir, tiny_data_dir, tmp_path):
    """torchrun, 2 gloo processes, engine.fsdp_size=1: two replicas of a one-process shard (the gradients
    averaged over the replicas) give one process's losses on the same global batches."""
    extra = {"data.train_batch_size": 8, "data.micro_batch_size_per_gpu": 2}
    out2, out1 = str(tmp_path / "hsdp"), str(tmp_path / "one")
    torchrun_sft(sft_overrides(tiny_model_dir, tiny_data_dir, out2, **extra, **{"engine.fsdp_size": 1}))
    run_sft(load_config("sft_trainer", sft_overrides(tiny_model_dir, tiny_data_dir, out1, **extra)))
    two, one = read_metrics(out2), read_metrics(out1)
    assert len(two) == len(one) > 0
    for a, b in zip(two, one, strict=True):
        assert a["train/loss"] == pytest.approx(b["train/loss"], rel=1e-4)


@pytest.mark.gpu
def test_param_offload_keeps_the_weights_in_host_memory_on_cuda(tiny_model_dir, tiny_data_dir, tmp_path):
    """One CUDA process (a group of one opened for FSDP2): after training steps the sharded weights and
    AdamW's state live on the host, and the loss is finite."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    import torch.distributed as dist

    from hybridflow.main_sft import init_distributed

    init_distributed("cuda", one_rank_group=True)
    try:
        trainer = make_trainer(
            tiny_model_dir, tiny_data_dir, tmp_path, **{"engine.param_offload": True, "trainer.device": "cuda"}
        )
        assert trainer.engine.spec.param_offload and trainer.engine.sharded
        trainer.fit()
        assert all(p.device.type == "cpu" for p in trainer.module.parameters())
        states = [t for s in trainer.optimizer.state.values() for t in s.values() if torch.is_tensor(t) and t.dim()]
        assert states and all(t.device.type == "cpu" for t in states)
        assert all(torch.isfinite(torch.tensor(m["train/loss"])) for m in read_metrics(str(tmp_path / "out")))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
