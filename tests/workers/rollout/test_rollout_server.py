"""The rollout server interface: sampling parameters, the engine registry, the engine loop, weight
buckets, and the hf server's request handling (batching, stop ids, aborts, sampling filters)."""

from __future__ import annotations

import asyncio
import os

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from hybridflow.config.convert import as_section
from hybridflow.config.rollout import RolloutConfig, SamplingConfig, rollout_as_in_yaml
from hybridflow.rollout.sampling import SamplingParams, as_id_list, request_seed, resolve_sampling, rollout_sampling
from hybridflow.rollout.server import ABORT, LENGTH, STOP, EngineLoop, ServerSpec
from hybridflow.workers.rollout import ROLLOUT_SERVERS, HFServer
from hybridflow.workers.rollout.hf_server import sample_rows
from hybridflow.workers.rollout.weights import StrictWeightLoader, buckets

EOS_ID, PAD_ID = 2, 0


# ------------------------------------------------------------------------------------ sampling params
def test_rollout_sampling_and_meta_overrides():
    config = RolloutConfig(
        temperature=0.7,
        top_k=20,
        top_p=0.9,
        do_sample=True,
        response_length=16,
        val_kwargs=SamplingConfig(temperature=0, top_k=-1, top_p=1.0, do_sample=False, n=1),
    )
    train, val = rollout_sampling(config)
    assert train == SamplingParams(do_sample=True, temperature=0.7, top_k=20, top_p=0.9, response_length=16)
    # validation keeps response_length from training, everything else from val_kwargs
    assert val == SamplingParams(do_sample=False, temperature=0.0, top_k=-1, top_p=1.0, response_length=16)
    assert not train.greedy and val.greedy
    assert resolve_sampling(train, val, {}) == train
    assert resolve_sampling(train, val, {"validate": True}) == val
    # meta_info overrides win over both; None means "not overridden"
    p = resolve_sampling(train, val, {"validate": True, "do_sample": True, "temperature": 1.0, "top_k": None})
    assert (p.do_sample, p.temperature, p.top_k) == (True, 1.0, -1)
    assert resolve_sampling(train, val, {"temperature": 0}).greedy
    assert resolve_sampling(train, val, {"response_length": 3}).response_length == 3
    # veRL's eos_token_id in meta_info sets the stop ids of the call
    assert resolve_sampling(train, val, {"eos_token_id": 7}).stop_token_ids == (7,)
    assert resolve_sampling(train, val, {"eos_token_id": [7, 8]}).stop_token_ids == (7, 8)
    assert train.stop_token_ids is None


def test_as_id_list():
    assert as_id_list(2) == [2]
    assert as_id_list([2, 3]) == [2, 3]
    assert as_id_list(None) == []


def test_shipped_rollout_config_section_parses():
    from omegaconf import OmegaConf

    root = OmegaConf.load(os.path.join(os.path.dirname(__file__), "..", "..", "..", "configs", "ppo_trainer.yaml"))
    train, val = rollout_sampling(
        as_section(root.actor_rollout_ref.rollout, RolloutConfig, "actor_rollout_ref.rollout")
    )
    assert train.response_length == root.data.max_response_length
    assert train.do_sample and not train.ignore_eos
    assert val.greedy and val.response_length == train.response_length


# ------------------------------------------------------------------------------------ registry / loop
def test_registry_lists_engines_and_refuses_duplicates():
    assert "hf" in ROLLOUT_SERVERS.names()
    assert ROLLOUT_SERVERS["hf"] is HFServer
    with pytest.raises(KeyError, match="hf"):  # an unknown name lists the known ones
        ROLLOUT_SERVERS["sglang"]
    ROLLOUT_SERVERS.register("hf")(HFServer)  # the same class again is fine (veRL's registries)

    class OtherServer(HFServer):
        pass

    with pytest.raises(ValueError):  # another class under a taken name is an error
        ROLLOUT_SERVERS.register("hf")(OtherServer)


def test_engine_loop_runs_coroutines_from_threads_and_refuses_reentry():
    loop = EngineLoop("test-loop")
    try:
        assert loop.run(asyncio.sleep(0, result=5)) == 5

        async def reenter():
            return loop.run(asyncio.sleep(0))

        with pytest.raises(RuntimeError, match="deadlock"):
            loop.run(reenter())

        async def other_loop():  # another event loop awaits work scheduled on the engine loop
            return await loop.wrap(asyncio.sleep(0, result="ok"))

        assert asyncio.run(other_loop()) == "ok"
    finally:
        loop.close()
    assert not loop.loop.is_running()


# ------------------------------------------------------------------------------------ weight buckets
def test_buckets_group_by_bytes_lazily():
    consumed = []

    def stream():
        for i, n in enumerate([10, 10, 30, 5, 100, 1]):  # float32: 4 bytes each
            consumed.append(i)
            yield f"t{i}", torch.zeros(n)

    it = buckets(stream(), bucket_bytes=80)
    first = next(it)
    # 40 + 40 = 80 fits; the third (120 bytes) opens a new bucket; the stream is read one tensor ahead only
    assert [n for n, _ in first] == ["t0", "t1"] and consumed == [0, 1, 2]
    rest = [[n for n, _ in b] for b in it]
    assert rest == [["t2"], ["t3"], ["t4"], ["t5"]]  # t4 (400 bytes) goes alone; t5 cannot join it
    with pytest.raises(ValueError, match="positive"):
        next(buckets(stream(), 0))


def test_strict_loader_checks_names_shapes_and_completeness():
    module = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.Linear(3, 1))
    loader = StrictWeightLoader(module)
    sd = {k: torch.full_like(v, 0.5) for k, v in module.state_dict().items()}
    items = list(sd.items())
    assert loader.load(items[:2]) == 2
    with pytest.raises(KeyError, match="no tensor for 2 entries"):
        loader.finish()  # layer 1 never arrived
    # wrapper prefixes and peft's are stripped
    assert loader.load([("_orig_mod.module.base_model.model." + k, v) for k, v in items[:2]]) == 2
    assert loader.load(items[2:]) == 2 and loader.finish() == 4
    assert all((p == 0.5).all() for p in module.parameters())
    with pytest.raises(ValueError, match="shape"):
        loader.load([(items[0][0], torch.zeros(5))])


# ------------------------------------------------------------------------------------ sampling math
def test_sample_rows_greedy_topk_topp_and_log_probs():
    logits = torch.tensor([[3.0, 2.0, 1.0, 0.0], [0.0, 0.0, 0.0, 5.0]])
    gens = [torch.Generator().manual_seed(i) for i in range(2)]
    tokens, logp = sample_rows(logits, [SamplingParams(do_sample=False)] * 2, gens)
    assert tokens.tolist() == [0, 3]
    torch.testing.assert_close(logp, torch.log_softmax(logits, -1)[[0, 1], [0, 3]])
    # top_k=2 at a high temperature: only ids 0 and 1 can come out of row 0
    hot = SamplingParams(temperature=50.0, top_k=2)
    seen = {int(sample_rows(logits[:1], [hot], [torch.Generator().manual_seed(s)])[0]) for s in range(200)}
    assert seen == {0, 1}
    # top_p=0.5 keeps the smallest set whose mass reaches 0.5: with probs (0.64, 0.24, 0.09, 0.03) just id 0
    p = SamplingParams(top_p=0.5)
    assert {int(sample_rows(logits[:1], [p], [torch.Generator().manual_seed(s)])[0]) for s in range(50)} == {0}
    # the log-prob is of the full tempered distribution (filters restrict the draw, not the density)
    tokens, logp = sample_rows(logits[:1], [SamplingParams(temperature=2.0, top_k=1)], [torch.Generator()])
    torch.testing.assert_close(logp, torch.log_softmax(logits[:1] / 2.0, -1)[:, 0])


def test_gumbel_max_draws_follow_the_softmax():
    # frequencies of 4000 draws match softmax(logits / T) within a few standard errors
    logits = torch.tensor([[1.0, 0.0, -1.0]])
    params = [SamplingParams(temperature=0.8)]
    counts = torch.zeros(3)
    for s in range(4000):
        counts[int(sample_rows(logits, params, [torch.Generator().manual_seed(s)])[0])] += 1
    expected = torch.softmax(logits[0] / 0.8, -1)
    assert torch.allclose(counts / 4000, expected, atol=0.03)


def test_request_seed_is_stable_and_distinct():
    assert request_seed(42, "train1:0/0") == request_seed(42, "train1:0/0")
    assert len({request_seed(42, f"train1:{i}/0") for i in range(1000)}) == 1000
    assert request_seed(42, "a") != request_seed(43, "a")


# ------------------------------------------------------------------------------------ the hf server
@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    return tok, model


@pytest.fixture
def server(tiny):
    _, model = tiny
    loop = EngineLoop("hf-server-test")
    spec = ServerSpec(
        model_path="",
        config=rollout_as_in_yaml(max_num_seqs=64, seed=0),
        pad_token_id=PAD_ID,
        eos_token_ids=(EOS_ID,),
        module=model,
    )
    srv = loop.run(_async(HFServer, spec))
    yield loop, srv
    loop.run(srv.shutdown())
    loop.close()


async def _async(fn, *args):
    return fn(*args)


def _gather(loop, srv, requests):
    async def go():
        return await asyncio.gather(*[srv.generate(p, params, rid) for p, params, rid in requests])

    return loop.run(go())


def test_greedy_requests_match_transformers_generate(server, tiny):
    tok, model = tiny
    loop, srv = server
    prompts = [tok.encode(t) for t in ["hello there", "12+34=", "a", "what is 5*7?"]]
    greedy = SamplingParams(do_sample=False, response_length=12)
    outs = _gather(loop, srv, [(p, greedy, f"g{i}") for i, p in enumerate(prompts)])
    assert len(outs) == len(prompts) == 4
    for p, out in zip(prompts, outs, strict=True):
        ref = model.generate(
            torch.tensor([p]),
            max_new_tokens=12,
            do_sample=False,
            eos_token_id=EOS_ID,
            pad_token_id=PAD_ID,
            top_k=None,
            top_p=None,
        )[0, len(p) :].tolist()
        assert out.token_ids == ref
        assert out.stop_reason == (STOP if ref[-1] == EOS_ID else LENGTH)


def test_per_request_limits_and_stop_ids_in_one_batch(server, tiny):
    tok, _ = tiny
    loop, srv = server
    p = tok.encode("hello")
    free = _gather(loop, srv, [(p, SamplingParams(do_sample=False, response_length=6, ignore_eos=True), "f")])[0]
    stop_at = free.token_ids[2]
    outs = _gather(
        loop,
        srv,
        [
            (p, SamplingParams(do_sample=False, response_length=6, ignore_eos=True), "a"),
            (p, SamplingParams(do_sample=False, response_length=2, ignore_eos=True), "b"),
            (p, SamplingParams(do_sample=False, response_length=6, stop_token_ids=(stop_at,)), "c"),
        ],
    )
    first = free.token_ids.index(stop_at)
    assert outs[0].token_ids == free.token_ids and outs[0].stop_reason == LENGTH
    assert outs[1].token_ids == free.token_ids[:2] and outs[1].stop_reason == LENGTH
    assert outs[2].token_ids == free.token_ids[: first + 1] and outs[2].stop_reason == STOP  # the stop token is kept
    assert len(outs[0].log_probs) == 6


def test_abort_returns_partial_tokens_and_the_server_keeps_working(server, tiny):
    tok, _ = tiny
    loop, srv = server
    long = SamplingParams(do_sample=True, response_length=4000, ignore_eos=True)

    async def go():
        task = asyncio.ensure_future(srv.generate(tok.encode("abc"), long, "long"))
        await asyncio.sleep(0.3)  # a few decode steps
        await srv.abort_all()
        return await task

    out = loop.run(go())
    assert out.stop_reason == ABORT and 0 < len(out.token_ids) < 4000
    again = _gather(loop, srv, [(tok.encode("abc"), SamplingParams(do_sample=False, response_length=3), "x")])[0]
    assert len(again.token_ids) == 3


def test_an_engine_error_reaches_every_waiting_request(server):
    loop, srv = server
    with pytest.raises(ValueError, match="empty prompt"):
        _gather(loop, srv, [([], SamplingParams(), "empty")])
    bad = SamplingParams(do_sample=False, response_length=2)
    with pytest.raises(IndexError):  # a token id outside the vocabulary fails inside the model
        _gather(loop, srv, [([5, 100000], bad, "oob"), ([5, 6], bad, "ok")])


# ------------------------------------------------------------------------------------ continuous batching
def test_requests_that_arrive_mid_batch_join_it_and_decode_exactly(server, tiny):
    """Newcomers with shorter and longer prompts than the running cache join the running batch (the
    cache is left-padded on whichever side is shorter) and still decode exactly what generate does."""
    tok, model = tiny
    loop, srv = server
    first = tok.encode("a")
    later = [tok.encode(t) for t in ["what is 5*7? tell me the answer please, in full words", "b", "12+34="]]
    n = 96
    params = SamplingParams(do_sample=False, response_length=n, ignore_eos=True)

    async def go():
        running = asyncio.ensure_future(srv.generate(first, params, "first"))
        outs = []
        for i, p in enumerate(later):
            await asyncio.sleep(0.02)  # the first request is decoding by now
            outs.append(asyncio.ensure_future(srv.generate(p, params, f"later{i}")))
        return await asyncio.gather(running, *outs)

    outs = loop.run(go())
    assert len(outs) == 1 + len(later)
    for prompt, out in zip([first, *later], outs, strict=True):
        ref = model.generate(
            torch.tensor([prompt]),
            max_new_tokens=n,
            min_new_tokens=n,
            do_sample=False,
            eos_token_id=EOS_ID,
            pad_token_id=PAD_ID,
            top_k=None,
            top_p=None,
        )[0, len(prompt) :]
        assert out.token_ids == ref.tolist()
        # the log-probs too (tokens alone can hide a wrong cache: a random tiny model repeats itself)
        with torch.no_grad():
            logits = model(torch.tensor([prompt + out.token_ids])).logits[0, len(prompt) - 1 : -1].float()
        expected = torch.log_softmax(logits, -1).gather(-1, torch.tensor(out.token_ids)[:, None]).squeeze(-1)
        torch.testing.assert_close(torch.tensor(out.log_probs), expected, atol=1e-4, rtol=1e-4)


def test_a_short_request_returns_while_a_long_one_is_still_decoding(server, tiny):
    tok, _ = tiny
    loop, srv = server
    long = SamplingParams(do_sample=True, response_length=4000, ignore_eos=True)
    short = SamplingParams(do_sample=True, response_length=4, ignore_eos=True)

    async def go():
        running = asyncio.ensure_future(srv.generate(tok.encode("abc"), long, "long"))
        await asyncio.sleep(0.2)
        quick = await asyncio.wait_for(srv.generate(tok.encode("xyz"), short, "short"), timeout=30)
        still_running = not running.done()
        await srv.abort_all()
        return quick, still_running, await running

    quick, still_running, aborted = loop.run(go())
    assert len(quick.token_ids) == 4 and quick.stop_reason == LENGTH
    assert still_running  # it joined the running batch instead of waiting for it to end
    assert aborted.stop_reason == ABORT and 0 < len(aborted.token_ids) < 4000


def test_requests_wait_for_a_weight_update_to_finish(server, tiny):
    tok, model = tiny
    loop, srv = server
    params = SamplingParams(do_sample=False, response_length=3)

    async def go():
        await srv.load_weights(list(model.state_dict().items()))
        waiting = asyncio.ensure_future(srv.generate(tok.encode("abc"), params, "held"))
        await asyncio.sleep(0.2)
        held = not waiting.done()
        await srv.finish_weight_update()
        return held, await asyncio.wait_for(waiting, timeout=30)

    held, out = loop.run(go())
    assert held and len(out.token_ids) == 3


def test_a_bad_request_joining_a_running_batch_fails_alone(server, tiny):
    tok, _ = tiny
    loop, srv = server
    long = SamplingParams(do_sample=True, response_length=4000, ignore_eos=True)

    async def go():
        running = asyncio.ensure_future(srv.generate(tok.encode("abc"), long, "long"))
        await asyncio.sleep(0.2)
        with pytest.raises(IndexError):  # a token id outside the vocabulary fails in its prefill
            await srv.generate([5, 100000], SamplingParams(do_sample=False, response_length=2), "oob")
        await asyncio.sleep(0.1)
        alive = not running.done()
        await srv.abort_all()
        return alive, await running

    alive, out = loop.run(go())
    assert alive and out.stop_reason == ABORT and len(out.token_ids) > 0


# ------------------------------------------------------------- shared prefill of a GRPO group
# Requests that arrive together with the same prompt share one prefill row; each must still get what
# it gets when sent alone (greedy tokens and log-probs; with sampling the same draw, the noise being
# seeded per request id), and the log-probs a plain full forward of the model gives.


@pytest.fixture
def prefill_rows(tiny):
    """Rows of every prefill forward of the tiny model (decode steps feed one token and are left out)."""
    rows = []

    def hook(module, args, kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        if ids is not None and ids.size(1) > 1:
            rows.append(ids.size(0))

    handle = tiny[1].register_forward_pre_hook(hook, with_kwargs=True)
    yield rows
    handle.remove()


def _full_forward_log_probs(model, prompt, tokens, temperature):
    with torch.no_grad():
        logits = model(torch.tensor([prompt + tokens])).logits[0, len(prompt) - 1 : -1].float() / temperature
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(tokens)[:, None]).squeeze(-1)


N = 4


def test_greedy_group_shares_a_prefill_and_matches_the_prompt_sent_alone(server, tiny, prefill_rows):
    tok, model = tiny
    loop, srv = server
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
    torch.testing.assert_close(
        torch.tensor(outs[N].log_probs), torch.tensor(other_alone.log_probs), atol=1e-5, rtol=1e-5
    )
    ref = _full_forward_log_probs(model, prompt, alone.token_ids, 1.0)
    torch.testing.assert_close(torch.tensor(alone.log_probs), ref, atol=1e-4, rtol=1e-4)


def test_sampled_group_shares_a_prefill_and_matches_requests_sent_one_at_a_time(server, tiny, prefill_rows):
    tok, model = tiny
    loop, srv = server
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
        assert len({tuple(o.token_ids) for o in together[j * N : (j + 1) * N]}) > 1


def test_full_determinism_decodes_one_sequence_at_a_time_bit_for_bit(tiny, prefill_rows):
    """rollout.full_determinism=True (veRL's key): a request's tokens and log-probs are the same bits whether
    it runs alone or beside others; the hf engine gets there by never batching rows (decode steps included)."""
    tok, model = tiny
    loop = EngineLoop("hf-determinism-test")
    spec = ServerSpec(
        model_path="",
        config=rollout_as_in_yaml(max_num_seqs=64, seed=0, full_determinism=True),
        pad_token_id=PAD_ID,
        eos_token_ids=(EOS_ID,),
        module=model,
    )
    srv = loop.run(_async(HFServer, spec))
    rows_per_step = []
    handle = model.register_forward_pre_hook(
        lambda m, args, kwargs: rows_per_step.append(kwargs.get("input_ids", args[0] if args else None).size(0)),
        with_kwargs=True,
    )
    try:
        params = SamplingParams(do_sample=True, temperature=1.1, response_length=10, ignore_eos=True)
        prompts = [tok.encode(t) for t in ("hello there", "12+34=", "a")]
        requests = [(p, params, f"r{i}") for i, p in enumerate(prompts)]
        alone = [_gather(loop, srv, [r])[0] for r in requests]
        rows_per_step.clear()
        together = _gather(loop, srv, requests)
        assert rows_per_step and set(rows_per_step) == {1}  # every forward, prefill or decode, holds one row
        for a, b in zip(alone, together, strict=True):
            assert a.token_ids == b.token_ids and torch.equal(torch.tensor(a.log_probs), torch.tensor(b.log_probs))
    finally:
        handle.remove()
        loop.run(srv.shutdown())
        loop.close()
