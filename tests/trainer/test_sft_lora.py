"""SFT with LoRA (veRL's model.lora_rank / lora_alpha / target_modules / lora_adapter_path for the SFT trainer):
only the adapters train; the checkpoint folder is the merged model, loadable as a plain Hugging Face model, and
its ``lora_adapter/`` is the adapter as peft saves it. Expected outputs come from peft itself (the adapter
folder read by ``PeftModel.from_pretrained``) and from transformers (the merged folder), not from our code."""

from __future__ import annotations

import json
import os

import pytest
import torch
from safetensors.torch import load_file

from hybridflow.config.loader import load_config
from hybridflow.main_sft import run_sft
from hybridflow.trainer.sft_trainer import LORA_ADAPTER_DIR
from tests.trainer.test_sft_trainer import read_metrics, sft_overrides

peft = pytest.importorskip("peft")
pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py

LORA = {"model.lora_rank": 4, "model.lora_alpha": 8, "model.target_modules": "[q_proj,v_proj]", "optim.lr": 5e-2}


def _run(model_dir, data_dir, out, **extra) -> str:
    return run_sft(load_config("sft_trainer", sft_overrides(model_dir, data_dir, out, **{**LORA, **extra})))


def _logits(model, ids) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=ids).logits


def test_lora_sft_trains_the_adapters_and_saves_a_merged_model_and_the_adapter(tiny_model_dir, tiny_data_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    out = _run(tiny_model_dir, tiny_data_dir, str(tmp_path / "out"), **{"trainer.logger": "[file]"})
    losses = [m["train/loss"] for m in read_metrics(str(tmp_path / "out"))]
    assert len(losses) == 2 and losses[1] < losses[0]  # lr 5e-2 on the adapters: the same batch size, a lower loss

    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    merged = AutoModelForCausalLM.from_pretrained(out)  # a plain model folder: what model.path reads next
    adapter_dir = os.path.join(out, LORA_ADAPTER_DIR)
    config = json.load(open(os.path.join(adapter_dir, "adapter_config.json")))
    assert (config["r"], config["lora_alpha"], sorted(config["target_modules"])) == (4, 8, ["q_proj", "v_proj"])
    saved = load_file(os.path.join(adapter_dir, "adapter_model.safetensors"))
    assert saved and all(".lora_A." in k or ".lora_B." in k for k in saved)
    assert any(".lora_B." in k and v.abs().sum() > 0 for k, v in saved.items())  # B left 0: the adapter trained

    # only the targets moved: every other weight of the merged model is the base model's
    base_sd, merged_sd = base.state_dict(), merged.state_dict()
    moved = {k for k in base_sd if not torch.equal(base_sd[k], merged_sd[k])}
    assert moved and all(k.endswith(("q_proj.weight", "v_proj.weight")) for k in moved), sorted(moved)

    # peft's own reading of the adapter over the base model gives the merged model's outputs
    ids = torch.randint(4, base.config.vocab_size, (2, 12))
    with_adapter = peft.PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model_dir), adapter_dir)
    torch.testing.assert_close(_logits(merged, ids), _logits(with_adapter, ids), rtol=1e-4, atol=1e-4)
    assert not torch.allclose(_logits(base, ids), _logits(merged, ids))


def test_lora_adapter_path_continues_a_saved_adapter(tiny_model_dir, tiny_data_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    first = _run(tiny_model_dir, tiny_data_dir, str(tmp_path / "first"))
    adapter_dir = os.path.join(first, LORA_ADAPTER_DIR)
    # zero steps of training from the saved adapter: the run starts where the first one ended (a learning rate
    # of 0 keeps the weights), its own rank/alpha read from the adapter (the run's lora_rank is ignored)
    again = _run(
        tiny_model_dir,
        tiny_data_dir,
        str(tmp_path / "again"),
        **{"model.lora_adapter_path": adapter_dir, "model.lora_rank": 0, "optim.lr": 0.0},
    )
    first_model, again_model = AutoModelForCausalLM.from_pretrained(first), AutoModelForCausalLM.from_pretrained(again)
    ids = torch.randint(4, first_model.config.vocab_size, (2, 12))
    torch.testing.assert_close(_logits(again_model, ids), _logits(first_model, ids), rtol=1e-5, atol=1e-5)
    with pytest.raises(FileNotFoundError, match="model.lora_adapter_path=.*no adapter_config.json"):
        _run(tiny_model_dir, tiny_data_dir, str(tmp_path / "bad"), **{"model.lora_adapter_path": str(tmp_path)})


def test_lora_sft_resumes_its_adapter_and_optimizer(tiny_model_dir, tiny_data_dir, tmp_path):
    """A run of 3 steps equals a run of 2 steps continued to 3 (resume_mode=auto reads engine/, peft names)."""
    full = _run(tiny_model_dir, tiny_data_dir, str(tmp_path / "full"), **{"trainer.total_training_steps": 3})
    part = str(tmp_path / "part")
    _run(tiny_model_dir, tiny_data_dir, part, **{"trainer.total_training_steps": 2, "trainer.save_freq": 1})
    resumed = _run(tiny_model_dir, tiny_data_dir, part, **{"trainer.total_training_steps": 3, "trainer.save_freq": 1})
    a, b = load_file(os.path.join(full, "model.safetensors")), load_file(os.path.join(resumed, "model.safetensors"))
    for name in a:
        torch.testing.assert_close(b[name], a[name], rtol=1e-5, atol=1e-6, msg=name)


def test_tokenizer_path_and_override_config(tiny_model_dir, tiny_data_dir, tmp_path):
    """model.tokenizer_path: the tokenizer from its own folder; model.override_config: onto the model's config."""
    from transformers import AutoConfig, AutoTokenizer

    tokenizer_only = tmp_path / "tokenizer"
    AutoTokenizer.from_pretrained(tiny_model_dir).save_pretrained(tokenizer_only)
    out = _run(
        tiny_model_dir,
        tiny_data_dir,
        str(tmp_path / "out"),
        **{"model.tokenizer_path": str(tokenizer_only), "+model.override_config.attention_dropout": 0.25},
    )
    assert AutoConfig.from_pretrained(out).attention_dropout == 0.25  # the trained model's config, saved
    with pytest.raises(FileNotFoundError, match="model.tokenizer_path='/nowhere': no such folder"):
        _run(tiny_model_dir, tiny_data_dir, str(tmp_path / "x"), **{"model.tokenizer_path": "/nowhere"})


@pytest.mark.slow
def test_lora_sft_on_two_processes_saves_what_one_process_saves(tiny_model_dir, tiny_data_dir, tmp_path):
    """torchrun, 2 gloo processes (FSDP2 shards the adapters too): the merged model and the adapter of a
    2-step run equal the one-process run's (the same global batches, the same update; AdamW at lr 5e-2 turns
    the summation order's last bits in near-zero gradients into differences up to ~5e-5 of weights ~0.1)."""
    from tests.trainer.test_sft_trainer import torchrun_sft

    extra = {**LORA, "data.train_batch_size": 8, "data.micro_batch_size_per_gpu": 2, "trainer.logger": "[file]"}
    one = _run(tiny_model_dir, tiny_data_dir, str(tmp_path / "one"), **extra)
    torchrun_sft(sft_overrides(tiny_model_dir, tiny_data_dir, str(tmp_path / "two"), **extra))
    two = os.path.join(str(tmp_path / "two"), os.path.basename(one))
    for file in ("model.safetensors", os.path.join(LORA_ADAPTER_DIR, "adapter_model.safetensors")):
        a, b = load_file(os.path.join(one, file)), load_file(os.path.join(two, file))
        assert a.keys() == b.keys()
        for name in a:
            assert (b[name] - a[name]).abs().max() < 2e-4, f"{file}: {name}"
