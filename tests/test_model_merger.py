"""The model merger: a trained checkpoint becomes a Hugging Face directory that loads with the very same
outputs; ``convert`` does a whole run once; bad inputs fail with a message that says what to do."""

import json
import os

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoModelForTokenClassification, AutoTokenizer, GenerationConfig

from hybridflow.model_merger import convert_run, main, unwrapped_state_dict
from hybridflow.models.tiny import build_tiny_config, build_tiny_model, build_tiny_tokenizer
from hybridflow.trainer.checkpoint import begin_save, commit_save
from hybridflow.workers.checkpoint import save_engine_checkpoint
from hybridflow.workers.engine.fsdp import EngineSpec, TrainEngine
from tests.yaml_sections import optim

IDS = torch.tensor([[5, 17, 40, 2, 9, 33, 61, 7]])


def _config(**kw):
    return build_tiny_config(
        100,
        hidden_size=32,
        num_layers=2,
        num_heads=2,
        num_kv_heads=1,
        intermediate_size=64,
        max_position_embeddings=32,
        **kw,
    )


def _trained(model) -> TrainEngine:
    """One AdamW step, so the merged weights differ from any fresh init."""
    engine = TrainEngine(model, EngineSpec(strategy="fsdp", device="cpu"))
    engine.setup_optimizer(optim(lr=1e-2), total_steps=1)
    out = engine.module(input_ids=IDS)
    out.logits.float().pow(2).mean().backward()
    engine.optimizer.step()
    return engine


def _causal_lm(tied: bool = True):
    model = build_tiny_model(_config(tie_word_embeddings=tied), seed=0)
    model.generation_config = GenerationConfig(do_sample=True, top_k=0, eos_token_id=2, pad_token_id=0)
    return model


def _critic():
    return build_tiny_model(_config(num_labels=1), seed=0, head="token_classification")  # the value head


def _logits(model) -> torch.Tensor:
    with torch.no_grad():
        return model.eval()(input_ids=IDS).logits


@pytest.fixture(scope="module")
def tokenizer():
    return build_tiny_tokenizer()


@pytest.mark.parametrize("tied", [True, False])
def test_merge_loads_with_identical_logits(tmp_path, tokenizer, tied):
    engine = _trained(_causal_lm(tied))
    ckpt, out = str(tmp_path / "global_step_1" / "actor"), str(tmp_path / "hf")
    save_engine_checkpoint(engine, ckpt, tokenizer=tokenizer)
    main(["merge", "--backend", "fsdp", "--local_dir", ckpt, "--target_dir", out])

    merged = AutoModelForCausalLM.from_pretrained(out)
    assert type(merged).__name__ == "Qwen2ForCausalLM" and merged.config.tie_word_embeddings == tied
    assert torch.equal(_logits(merged), _logits(engine.module))  # same fp32 weights -> same logits
    assert merged.generation_config.top_k == 0 and merged.generation_config.do_sample  # the trained model's
    text = "1+2=3"
    assert AutoTokenizer.from_pretrained(out)(text).input_ids == tokenizer(text).input_ids
    assert os.path.exists(os.path.join(out, "model.safetensors"))


def test_merge_casts_dtype_and_reads_config_from_hf_model_path(tmp_path, tokenizer):
    engine = _trained(_causal_lm())
    ckpt, base = str(tmp_path / "ckpt"), str(tmp_path / "base")
    save_engine_checkpoint(engine, ckpt, tokenizer=tokenizer)
    os.rename(os.path.join(ckpt, "huggingface"), base)  # e.g. a checkpoint copied without its config
    with pytest.raises(SystemExit) as err:
        main(["merge", "--local_dir", ckpt, "--target_dir", str(tmp_path / "x")])
    assert err.value.code == 2
    main(
        ["merge", "--local_dir", ckpt, "--target_dir", str(tmp_path / "hf"), "--hf_model_path", base, "--dtype", "bf16"]
    )
    merged = AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf"))
    assert merged.dtype == torch.bfloat16
    expected = engine.module.state_dict()["model.norm.weight"].to(torch.bfloat16)
    assert torch.equal(merged.state_dict()["model.norm.weight"], expected)


def test_convert_run_writes_each_step_once(tmp_path, tokenizer):
    run = str(tmp_path / "run")
    actor, critic = _trained(_causal_lm()), _trained(_critic())
    for step in (1, 2):
        tmp = begin_save(run, step)
        save_engine_checkpoint(actor, os.path.join(tmp, "actor"), tokenizer=tokenizer)
        save_engine_checkpoint(critic, os.path.join(tmp, "critic"), tokenizer=tokenizer)
        commit_save(run, step, tmp)
    begin_save(run, 3)  # an interrupted save: not converted

    written = convert_run(run)
    assert written == [os.path.join(run, f"global_step_{s}", f"hf_{r}") for s in (1, 2) for r in ("actor", "critic")]
    assert convert_run(run) == []  # already converted: skipped
    merged_critic = AutoModelForTokenClassification.from_pretrained(os.path.join(run, "global_step_2", "hf_critic"))
    assert type(merged_critic).__name__ == "Qwen2ForTokenClassification"
    assert torch.equal(_logits(merged_critic), _logits(critic.module))  # (1, 8, 1) values, exactly

    other = str(tmp_path / "exports")
    main(["convert", "--checkpoint_dir", run, "--target_root", other])
    assert sorted(os.listdir(os.path.join(other, "global_step_1"))) == ["hf_actor", "hf_critic"]
    with open(os.path.join(other, "global_step_1", "hf_actor", "config.json")) as f:
        assert json.load(f)["architectures"] == ["Qwen2ForCausalLM"]


def test_clear_errors(tmp_path, capsys):
    def fails(argv, message):
        with pytest.raises(SystemExit) as err:
            main(argv)
        assert err.value.code == 2
        assert message in capsys.readouterr().err

    missing = str(tmp_path / "missing")
    fails(["merge", "--local_dir", missing, "--target_dir", str(tmp_path / "o")], "does not exist")
    fails(["convert", "--checkpoint_dir", missing], "does not exist")
    os.makedirs(tmp_path / "global_step_4" / "actor")
    fails(
        ["merge", "--local_dir", str(tmp_path / "global_step_4"), "--target_dir", str(tmp_path / "o")],
        f"pass {tmp_path / 'global_step_4' / 'actor'}",
    )
    fails(["convert", "--checkpoint_dir", str(tmp_path)], "no complete global_step_<N>")
    fails(["merge", "--backend", "megatron", "--local_dir", missing, "--target_dir", "o"], "megatron is not supported")
    fails(["merge", "--backend", "deepspeed", "--local_dir", missing, "--target_dir", "o"], "supported: fsdp")


def test_unwrapped_state_dict():
    t = torch.zeros(1)
    names = {
        "module._orig_mod.model.norm.weight": t,
        "_fsdp_wrapped_module.lm_head.weight": t,
        "model.layers.0._checkpoint_wrapped_module.mlp.up_proj.weight": t,
        "model.submodule.x": t,
    }
    assert list(unwrapped_state_dict(names)) == [
        "model.norm.weight",
        "lm_head.weight",
        "model.layers.0.mlp.up_proj.weight",
        "model.submodule.x",
    ]
    with pytest.raises(ValueError, match="model.norm.weight"):
        unwrapped_state_dict({"model.norm.weight": t, "module.model.norm.weight": t})
