"""VLLMRollout: lazy import and error message (CPU), its logic against a fake ``vllm`` module (CPU),
and the real engine on the tiny model (``gpu``)."""

from __future__ import annotations

import importlib
import sys
import types
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from rollout_test_utils import EOS_ID, PAD_ID, make_prompts, rollout_config, with_meta

from hybridflow.workers.rollout import VLLMRollout


def test_importing_the_rollout_package_does_not_import_vllm(monkeypatch):
    # re-import the package from scratch (fresh registry) while any `import vllm` fails
    import hybridflow.workers

    for name in [m for m in sys.modules if m.startswith("hybridflow.workers.rollout")]:
        monkeypatch.delitem(sys.modules, name)  # restored after the test
    monkeypatch.setattr(hybridflow.workers, "rollout", None, raising=False)
    monkeypatch.setitem(sys.modules, "vllm", None)
    fresh = importlib.import_module("hybridflow.workers.rollout")
    assert fresh.VLLMRollout is not VLLMRollout  # really executed again
    assert "vllm" in fresh.ROLLOUT_ENGINES.names()


def test_constructing_without_vllm_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)
    with pytest.raises(ImportError, match=r"pip install hybridflow\[vllm\]"):
        VLLMRollout("/nonexistent", rollout_config(), PAD_ID, EOS_ID)


# ------------------------------------------------------------------ fake vllm: the engine's logic


class FakeLLM:
    """Records what VLLMRollout asks for; 'generates' prompt[-1]+1, +2, ... and stops at stop ids."""

    def __init__(self, **kwargs):
        self.kwargs = kwargs
        self.model = SimpleNamespace(loaded=None, load_weights=lambda w: setattr(self.model, "loaded", list(w)))
        self.calls = []

    def generate(self, prompts, sampling_params, use_tqdm):
        self.calls.append((prompts, sampling_params))
        outs = []
        for p in prompts:
            tokens = []
            for step in range(sampling_params["max_tokens"]):
                tok = p["prompt_token_ids"][-1] + step + 1
                tokens.append(tok)
                if tok in sampling_params["stop_token_ids"] and not sampling_params["ignore_eos"]:
                    break
            logprobs = [{t: SimpleNamespace(logprob=-0.1 * t)} for t in tokens]
            outs.append(SimpleNamespace(outputs=[SimpleNamespace(token_ids=tokens, logprobs=logprobs)]))
        return outs

    def apply_model(self, func):
        return [func(self.model)]

    def reset_prefix_cache(self):
        self.kwargs["prefix_cache_reset"] = True

    def sleep(self, level):
        self.kwargs["slept"] = level

    def wake_up(self, tags=None):
        self.kwargs["woke"] = tags or "all"


@pytest.fixture
def fake_vllm(monkeypatch):
    module = types.ModuleType("vllm")
    module.LLM = FakeLLM
    module.SamplingParams = lambda **kw: kw
    monkeypatch.setitem(sys.modules, "vllm", module)
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # restored after the test
    return module


@pytest.fixture
def tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir, padding_side="left")


def test_engine_args_from_config(fake_vllm):
    config = rollout_config(
        tensor_model_parallel_size=1, gpu_memory_utilization=0.4, prompt_length=16, response_length=8,
        dtype="float16", load_format="dummy", engine_kwargs={"vllm": {"swap_space": None, "kv_cache_dtype": "fp8"}},
    )
    rollout = VLLMRollout("/models/x", config, PAD_ID, EOS_ID)
    kw = rollout.llm.kwargs
    assert kw["model"] == "/models/x" and kw["tensor_parallel_size"] == 1
    assert kw["max_model_len"] == 24  # prompt_length + response_length when max_model_len is unset
    assert kw["gpu_memory_utilization"] == 0.4 and kw["dtype"] == "float16" and kw["load_format"] == "dummy"
    assert kw["enable_sleep_mode"] is True and kw["skip_tokenizer_init"] is False
    assert kw["kv_cache_dtype"] == "fp8" and "swap_space" not in kw  # None engine kwargs are dropped
    # the shipped config's values: dtype auto -> bfloat16, veRL's dummy_dtensor -> vLLM's dummy
    kw = VLLMRollout("/m", rollout_config(dtype="auto", load_format="dummy_dtensor"), PAD_ID, EOS_ID).llm.kwargs
    assert kw["dtype"] == "bfloat16" and kw["load_format"] == "dummy"


def test_generate_layout_and_masks(fake_vllm, tokenizer):
    rollout = VLLMRollout("/m", rollout_config(response_length=6, calculate_log_probs=True), PAD_ID, EOS_ID)
    prompts = make_prompts(tokenizer, ["ab", "hello"], meta_info={"step": 1})
    P = prompts.batch["input_ids"].size(1)
    last = [int(prompts.batch["input_ids"][i, -1]) for i in range(2)]
    # make row 0 stop at its 3rd token: EOS override = last0 + 3
    out = rollout.generate_sequences(with_meta(prompts, eos_token_id=last[0] + 3, step=1))

    sent, sp = rollout.llm.calls[-1]
    # the prompts sent are the unpadded ids
    mask = prompts.batch["attention_mask"].bool()
    assert [p["prompt_token_ids"] for p in sent] == [prompts.batch["input_ids"][i][mask[i]].tolist() for i in range(2)]
    assert sp["n"] == 1 and sp["max_tokens"] == 6 and sp["stop_token_ids"] == [last[0] + 3] and sp["logprobs"] == 0

    resp = out.batch["responses"]
    assert resp[0].tolist() == [last[0] + 1, last[0] + 2, last[0] + 3, PAD_ID, PAD_ID, PAD_ID]
    assert resp[1].tolist() == [last[1] + k for k in range(1, 7)]
    assert out.batch["attention_mask"][:, P:].tolist() == [[1, 1, 1, 0, 0, 0], [1] * 6]
    assert torch.equal(out.batch["position_ids"][:, P:], prompts.batch["attention_mask"].sum(-1, keepdim=True) + torch.arange(6))
    # rollout log probs: the fake's -0.1 * token on valid positions, 0 on padding
    lp = out.batch["rollout_log_probs"]
    assert torch.allclose(lp[0, :3], -0.1 * resp[0, :3].float()) and (lp[0, 3:] == 0).all()
    assert out.meta_info["step"] == 1 and out.meta_info["generated_tokens"] == 9


def test_raw_prompt_ids_are_preferred(fake_vllm, tokenizer):
    rollout = VLLMRollout("/m", rollout_config(), PAD_ID, EOS_ID)
    prompts = make_prompts(tokenizer, ["ab", "cd"])
    raw = np.empty(2, dtype=object)  # the dataset's per-row token lists
    raw[0], raw[1] = [7, 8, 9], [5]
    prompts.non_tensor_batch["raw_prompt_ids"] = raw
    rollout.generate_sequences(prompts)
    assert [p["prompt_token_ids"] for p in rollout.llm.calls[-1][0]] == [[7, 8, 9], [5]]


def test_sampling_params_greedy_and_validate(fake_vllm):
    rollout = VLLMRollout("/m", rollout_config(temperature=0.8, top_k=0, top_p=0.95), PAD_ID, EOS_ID)
    sp = rollout.sampling_params(rollout.train_params, [EOS_ID])
    assert (sp["temperature"], sp["top_k"], sp["top_p"]) == (0.8, -1, 0.95)  # top_k 0 -> -1 (disabled)
    assert sp["logprobs"] is None
    sp = rollout.sampling_params(rollout.val_params, [EOS_ID])
    assert (sp["temperature"], sp["top_k"], sp["top_p"]) == (0.0, -1, 1.0)


def test_load_weights_goes_through_apply_model(fake_vllm):
    rollout = VLLMRollout("/m", rollout_config(), PAD_ID, EOS_ID)
    state = {"model.embed_tokens.weight": torch.ones(2, 2), "lm_head.weight": torch.zeros(2, 2)}
    assert rollout.load_weights(state) == 2
    assert [name for name, _ in rollout.llm.model.loaded] == list(state)
    assert rollout.llm.kwargs["prefix_cache_reset"]


def test_sleep_and_wake_up(fake_vllm):
    rollout = VLLMRollout("/m", rollout_config(), PAD_ID, EOS_ID)
    rollout.sleep()
    rollout.wake_up(tags=["weights"])
    assert rollout.llm.kwargs["slept"] == 1 and rollout.llm.kwargs["woke"] == ["weights"]
    no_sleep = VLLMRollout("/m", rollout_config(free_cache_engine=False), PAD_ID, EOS_ID)
    no_sleep.sleep()
    assert "slept" not in no_sleep.llm.kwargs and no_sleep.llm.kwargs["enable_sleep_mode"] is False


# ------------------------------------------------------------------------------ real vLLM (GPU)


@pytest.mark.gpu
def test_vllm_matches_hf_greedy_and_takes_pushed_weights(tiny_model_dir, tokenizer):
    pytest.importorskip("vllm")
    from transformers import AutoModelForCausalLM

    from hybridflow.utils.tiny_model import build_tiny_model
    from hybridflow.workers.rollout import HFRollout

    config = rollout_config(response_length=8, dtype="float32", gpu_memory_utilization=0.2, prompt_length=32)
    prompts = make_prompts(tokenizer, meta_info={"do_sample": False})
    hf_model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).cuda().eval()
    hf = HFRollout(hf_model, config, PAD_ID, EOS_ID)
    rollout = VLLMRollout(tiny_model_dir, config, PAD_ID, EOS_ID)

    out = rollout.generate_sequences(prompts)
    assert out.batch["responses"].shape == (prompts.batch["input_ids"].size(0), 8)
    assert torch.equal(out.batch["responses"][:, :4], hf.generate_sequences(prompts).batch["responses"][:, :4].cpu())

    # weights pushed in memory: the engine now answers like the seed-1 model; sleep/wake keeps them
    other = build_tiny_model(hf_model.config, seed=1).cuda().eval()
    expected = HFRollout(other, config, PAD_ID, EOS_ID).generate_sequences(prompts).batch["responses"].cpu()
    rollout.sleep()
    rollout.wake_up()
    assert rollout.load_weights(other.state_dict()) == len(other.state_dict())
    assert torch.equal(rollout.generate_sequences(prompts).batch["responses"][:, :4], expected[:, :4])
