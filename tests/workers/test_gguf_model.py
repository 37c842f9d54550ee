"""GGUF checkpoints wherever a model path is taken: one cached conversion through transformers' own GGUF
loader, the errors for files it cannot read, the model_merger command, and the real SmolLM2 GGUF."""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import pytest
import torch

pytest.importorskip("gguf")

from hybridflow.workers import gguf_model  # noqa: E402
from hybridflow.workers.model_loading import load_model, load_tokenizer, local_model_path  # noqa: E402
from tests.tiny_gguf import HIDDEN, write_tiny_gguf  # noqa: E402

KEY = "actor_rollout_ref.model.path"


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    """(path of the tiny GGUF, what each tensor holds after quantization, the original float arrays)."""
    from tests.tiny_gguf import tiny_weights, vocabulary

    path = str(tmp_path_factory.mktemp("gguf") / "tiny.gguf")
    stored = write_tiny_gguf(path)
    return path, stored, tiny_weights(len(vocabulary()[0]))


@pytest.fixture(scope="module")
def module_cache(tmp_path_factory):
    return str(tmp_path_factory.mktemp("gguf_cache"))


@pytest.fixture
def cache(monkeypatch, module_cache):
    """HYBRIDFLOW_CACHE for this test: shared by the module, so the tiny file converts once."""
    monkeypatch.setenv("HYBRIDFLOW_CACHE", module_cache)
    return module_cache


@pytest.fixture
def conversions(monkeypatch):
    """Counts conversions (the real one still runs)."""
    calls = []
    real = gguf_model.write_hf_folder_from_gguf

    def counting(*args, **kwargs):
        calls.append(args[0])
        return real(*args, **kwargs)

    monkeypatch.setattr(gguf_model, "write_hf_folder_from_gguf", counting)
    return calls


def test_converted_weights_match_transformers_gguf_load_and_the_quantized_values(tiny_gguf, cache):
    from transformers import AutoModelForCausalLM

    path, stored, original = tiny_gguf
    folder = local_model_path(path, KEY)
    assert folder.startswith(os.path.join(cache, "gguf")) and os.path.isfile(os.path.join(folder, "config.json"))
    assert "quantization_config" not in json.load(open(os.path.join(folder, "config.json")))
    converted = load_model(folder, "causal_lm").state_dict()
    # an independent path: transformers' own GGUF load (q/k come back un-permuted there too)
    direct = AutoModelForCausalLM.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path)).state_dict()
    assert set(converted) == set(direct)
    for name, tensor in direct.items():
        torch.testing.assert_close(converted[name], tensor, rtol=0, atol=0, msg=name)
    # tensors no permutation touches, against our own numbers: F32 exactly, Q8_0 as gguf dequantizes it
    for hf_name, gguf_name in [
        ("model.embed_tokens.weight", "token_embd.weight"),
        ("model.layers.0.mlp.up_proj.weight", "blk.0.ffn_up.weight"),
        ("model.layers.1.mlp.down_proj.weight", "blk.1.ffn_down.weight"),
        ("model.layers.1.post_attention_layernorm.weight", "blk.1.ffn_norm.weight"),
    ]:
        np.testing.assert_array_equal(converted[hf_name].numpy(), stored[gguf_name], err_msg=hf_name)
    # Q8_0: each 32-value block within half a step (max|w| / 127) of the original, plus the fp16 rounding of that step
    up, orig = converted["model.layers.0.mlp.up_proj.weight"].numpy(), original["blk.0.ffn_up.weight"]
    step = np.abs(orig.reshape(-1, 32)).max(axis=1, keepdims=True) / 127
    assert (np.abs(up - orig).reshape(-1, 32) <= step * (0.5 + 127 * 2.0**-11) + 1e-6).all()
    assert 0 < np.abs(up - orig).max()  # it was really quantized


def test_file_and_folder_resolve_to_one_cached_conversion_for_every_head(tiny_gguf, cache, conversions, tmp_path):
    path = tiny_gguf[0]
    first = local_model_path(path, KEY)  # converted already by the module, or now
    stamp = os.stat(os.path.join(first, "model.safetensors")).st_mtime_ns
    conversions.clear()
    folder = tmp_path / "holder"
    folder.mkdir()
    os.symlink(path, folder / "model.gguf")
    held = local_model_path(str(folder), KEY)  # a folder holding one .gguf (a link to the same file)
    assert held == first and local_model_path(path, KEY) == first
    assert conversions == [] and os.stat(os.path.join(first, "model.safetensors")).st_mtime_ns == stamp
    # the configured dtype applies at load time; the critic gets its value head like any causal LM
    actor = load_model(held, "causal_lm", dtype=torch.bfloat16)
    assert {p.dtype for p in actor.parameters()} == {torch.bfloat16}
    critic = load_model(held, "token_classification", num_labels=1)
    assert critic.score.weight.shape == (1, HIDDEN)
    tokenizer = load_tokenizer(path)  # a GGUF given as tokenizer path too
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.pad_token == "<|endoftext|>"
    assert not [n for n in os.listdir(os.path.dirname(first)) if n.startswith(".tmp-")]


def test_hf_rollout_from_pretrained_takes_a_gguf(tiny_gguf, cache):
    from hybridflow.workers.rollout import HFRollout

    rollout = HFRollout.from_pretrained(tiny_gguf[0], {"do_sample": False, "response_length": 4}, 99, 101)
    try:
        assert rollout.module.model.embed_tokens.weight.shape[1] == HIDDEN
    finally:
        rollout.close()


def test_a_changed_file_converts_again(tmp_path, monkeypatch, conversions):
    monkeypatch.setenv("HYBRIDFLOW_CACHE", str(tmp_path / "cache"))
    path = str(tmp_path / "m.gguf")
    write_tiny_gguf(path)
    first = local_model_path(path)
    os.utime(path, ns=(0, os.stat(path).st_mtime_ns + 10**9))
    assert local_model_path(path) != first and len(conversions) == 2


def test_folder_with_several_ggufs_names_them(tmp_path):
    for name in ("a.gguf", "b.gguf"):
        (tmp_path / name).write_bytes(b"GGUF")
    with pytest.raises(ValueError, match="2 GGUF files") as err:
        local_model_path(str(tmp_path), KEY)
    assert "a.gguf" in str(err.value) and "b.gguf" in str(err.value) and KEY in str(err.value)


def _assert_no_cache_entry(cache_root):
    root = os.path.join(cache_root, "gguf")
    assert not os.path.isdir(root) or not [n for n in os.listdir(root) if not n.endswith(".lock")]


def test_unsupported_architecture_names_file_and_architecture(tmp_path, monkeypatch):
    monkeypatch.setenv("HYBRIDFLOW_CACHE", str(tmp_path / "cache"))
    path = str(tmp_path / "rwkv.gguf")
    write_tiny_gguf(path, architecture="rwkv6")
    with pytest.raises(ValueError, match="architecture 'rwkv6'") as err:
        local_model_path(path, KEY)
    assert path in str(err.value) and KEY in str(err.value)
    _assert_no_cache_entry(str(tmp_path / "cache"))


def test_unsupported_tensor_type_names_file_tensor_and_type(tmp_path, monkeypatch):
    import gguf

    monkeypatch.setenv("HYBRIDFLOW_CACHE", str(tmp_path / "cache"))
    path = str(tmp_path / "q8k.gguf")
    q8_k = gguf.GGMLQuantizationType.Q8_K  # gguf can write it, no dequantizer reads it
    write_tiny_gguf(
        path, extra_tensors={"blk.0.extra.weight": (np.zeros((1, gguf.GGML_QUANT_SIZES[q8_k][1]), np.uint8), q8_k)}
    )
    with pytest.raises(ValueError, match="tensor type Q8_K") as err:
        local_model_path(path, KEY)
    assert path in str(err.value) and "blk.0.extra.weight" in str(err.value)
    _assert_no_cache_entry(str(tmp_path / "cache"))


def test_not_a_gguf_and_missing_gguf_package(tmp_path, monkeypatch):
    path = tmp_path / "weights.gguf"
    path.write_text("not a model")
    with pytest.raises(ValueError, match="is not a GGUF file") as err:
        local_model_path(str(path), KEY)
    assert str(path) in str(err.value)
    monkeypatch.setitem(sys.modules, "gguf", None)  # as if not installed
    with pytest.raises(ImportError, match=r"hybridflow\[gguf\]"):
        local_model_path(str(path), KEY)


def test_model_merger_gguf_writes_a_plain_hf_folder(tiny_gguf, tmp_path, capsys):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from hybridflow.model_merger import main

    target = tmp_path / "hf"
    main(["gguf", "--gguf_file", tiny_gguf[0], "--target_dir", str(target), "--dtype", "bfloat16"])
    assert "wrote Hugging Face model" in capsys.readouterr().out
    names = set(os.listdir(target))
    assert {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json"} <= names
    config = json.load(open(target / "config.json"))
    assert "quantization_config" not in config and config["dtype"] == "bfloat16"
    model = AutoModelForCausalLM.from_pretrained(target)
    assert model.dtype == torch.bfloat16
    tokenizer = AutoTokenizer.from_pretrained(target)
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    with pytest.raises(SystemExit):  # not empty now: refused, nothing overwritten
        main(["gguf", "--gguf_file", tiny_gguf[0], "--target_dir", str(target)])


def test_main_generation_takes_a_gguf_model_path(tiny_gguf, cache, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from hybridflow.main_generation import main as gen_main

    prompts = [[{"role": "user", "content": "what is 1+2?"}], [{"role": "user", "content": "hello"}]]
    data = str(tmp_path / "in.parquet")
    pq.write_table(pa.Table.from_pylist([{"prompt": p, "data_source": "x"} for p in prompts]), data)
    out = gen_main(
        [
            f"model.path={tiny_gguf[0]}",
            f"data.path={data}",
            f"data.output_path={tmp_path / 'out.parquet'}",
            "data.batch_size=2",
            "data.n_samples=1",
            "rollout.prompt_length=64",
            "rollout.response_length=5",
            "rollout.do_sample=False",
            "trainer.backend=inprocess",
            "trainer.device=cpu",
        ]
    )
    rows = pq.read_table(out).to_pylist()
    folder = local_model_path(tiny_gguf[0])
    tok, model = AutoTokenizer.from_pretrained(folder), AutoModelForCausalLM.from_pretrained(folder).eval()
    for prompt, row in zip(prompts, rows, strict=True):
        ids = torch.tensor(
            [tok.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"]]
        )
        with torch.no_grad():
            gen = model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=5,
                do_sample=False,
                pad_token_id=tok.pad_token_id,
                eos_token_id=tok.eos_token_id,
            )
        assert row["responses"] == [tok.decode(gen[0, ids.shape[1] :], skip_special_tokens=True)]


@pytest.mark.slow  # ~50 s on 2 cores: 35 s converting (mostly the tokenizer), 15 s loading the GGUF again + generating
def test_real_smollm2_gguf_converts_with_chat_template_and_same_greedy(smollm2_gguf, smollm2_dir):
    """The real model: the converted folder (conftest's smollm2_dir, through write_hf_folder_from_gguf)
    generates what transformers' direct GGUF load generates."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(smollm2_dir)
    assert "<|im_start|>" in (tok.chat_template or "") and tok.eos_token == "<|im_end|>"
    assert os.path.isfile(os.path.join(smollm2_dir, "generation_config.json"))
    ids = torch.tensor(
        [
            tok.apply_chat_template(
                [{"role": "user", "content": "What is the capital of France?"}],
                add_generation_prompt=True,
                tokenize=True,
                return_dict=True,
            )["input_ids"]
        ]
    )
    folder, name = os.path.split(smollm2_gguf)
    outputs = []
    for model in (
        AutoModelForCausalLM.from_pretrained(smollm2_dir),
        AutoModelForCausalLM.from_pretrained(folder, gguf_file=name),
    ):
        with torch.no_grad():
            outputs.append(
                model.eval()
                .generate(
                    ids,
                    attention_mask=torch.ones_like(ids),
                    max_new_tokens=8,
                    do_sample=False,
                    pad_token_id=tok.pad_token_id,
                )[0]
                .tolist()
            )
        del model
    assert outputs[0] == outputs[1]
