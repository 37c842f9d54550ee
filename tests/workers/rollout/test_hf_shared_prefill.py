"""hf_server: requests that arrive together with the same prompt (a GRPO group) share one prefill row.
Each request must still get what it gets when sent alone: greedy tokens and log-probs, and with
sampling the same draw (the noise is seeded per request id, hf_server's docstring), plus log-probs
that a plain full forward of the model gives."""

from __future__ import annotations

import asyncio

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from hybridflow.workers.rollout import HFServer
from hybridflow.workers.rollout.sampling import SamplingParams
from hybridflow.workers.rollout.server import EngineLoop, ServerSpec
from tests.workers.rollout.rollout_test_utils import EOS_ID, PAD_ID


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    return tok, model


@pytest.fixture
def server(tiny):
    _, model = tiny
    loop = EngineLoop("hf-shared-prefill-test")
    spec = ServerSpec(model_path="", config={"max_num_seqs": 64}, pad_token_id=PAD_ID, eos_token_ids=(EOS_ID,),
                      module=model)
    srv = loop.run(_async(HFServer, spec))
    prefill_rows = []

    def hook(module, args, kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        if ids is not None and ids.size(1) > 1:  # a prefill (decode steps feed one token)
            prefill_rows.append(ids.size(0))

    handle = model.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        yield loop, srv, prefill_rows
    finally:
        handle.remove()
        loop.run(srv.shutdown())
        loop.close()


async def _async(fn, *args):
    return fn(*args)


def _gather(loop, srv, requests):
    async def go():
        return await asyncio.gather(*[srv.generate(p, params, rid) for p, params, rid in requests])

    return loop.run(go())


def _full_forward_log_probs(model, prompt, tokens, temperature):
    with torch.no_grad():
        logits = model(torch.tensor([prompt + tokens])).logits[0, len(prompt) - 1:-1].float() / temperature
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(tokens)[:, None]).squeeze(-1)


N = 4


def test_greedy_group_matches_the_prompt_sent_alone(server, tiny):
    tok, model = tiny
    loop, srv, prefill_rows = server
    prompt, other = tok.encode("what is 5*7?"), tok.encode("a")
    greedy = SamplingParams(do_sample=False, response_length=10, ignore_eos=True)
    alone = _gather(loop, srv, [(prompt, greedy, "alone")])[0]
    prefill_rows.clear()
    # a GRPO-like arrival: the group of N plus another prompt (a shorter one: the group's row is not padded)
    outs = _gather(loop, srv, [(prompt, greedy, f"g{i}") for i in range(N)] + [(other, greedy, "other")])
    assert prefill_rows and prefill_rows[0] < N + 1, prefill_rows  # the group did share a prefill row
    assert sum(prefill_rows) < N + 1, prefill_rows
    for out in outs[:N]:
        assert out.token_ids == alone.token_ids
        torch.testing.assert_close(torch.tensor(out.log_probs), torch.tensor(alone.log_probs), atol=1e-5, rtol=1e-5)
    other_alone = _gather(loop, srv, [(other, greedy, "other-alone")])[0]
    assert outs[N].token_ids == other_alone.token_ids
    torch.testing.assert_close(torch.tensor(outs[N].log_probs), torch.tensor(other_alone.log_probs), atol=1e-5,
                               rtol=1e-5)
    ref = _full_forward_log_probs(model, prompt, alone.token_ids, 1.0)
    torch.testing.assert_close(torch.tensor(alone.log_probs), ref, atol=1e-4, rtol=1e-4)


def test_sampled_group_matches_requests_sent_one_at_a_time(server, tiny):
    tok, model = tiny
    loop, srv, prefill_rows = server
    prompts = [tok.encode("hello there"), tok.encode("12+34=")]
    params = SamplingParams(do_sample=True, temperature=1.3, response_length=12, ignore_eos=True)
    requests = [(p, params, f"p{j}-s{i}") for j, p in enumerate(prompts) for i in range(N)]  # interleaved groups
    one_by_one = [_gather(loop, srv, [r])[0] for r in requests]
    prefill_rows.clear()
    together = _gather(loop, srv, requests)
    assert prefill_rows and sum(prefill_rows) < len(requests), prefill_rows
    for (prompt, _, rid), a, b in zip(requests, one_by_one, together, strict=True):
        assert b.token_ids == a.token_ids, rid
        torch.testing.assert_close(torch.tensor(b.log_probs), torch.tensor(a.log_probs), atol=1e-5, rtol=1e-5)
        ref = _full_forward_log_probs(model, prompt, b.token_ids, params.temperature)
        torch.testing.assert_close(torch.tensor(b.log_probs), ref, atol=1e-4, rtol=1e-4)
    # the samples of a group differ (each request its own noise), so the copies did diverge
    for j in range(len(prompts)):
        assert len({tuple(o.token_ids) for o in together[j * N:(j + 1) * N]}) > 1
