"""AgentLoopWorker and ServerManager against a scripted server: per-sample agents, request ids,
routing, errors, and a user-registered loop."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import torch

from hybridflow.agent_loop import AGENT_LOOPS, AgentLoopBase, AgentLoopOutput, agent_loop_settings, register
from hybridflow.agent_loop.manager import AgentLoopManager
from hybridflow.agent_loop.server_manager import ROLLOUT_CONCURRENCY_GROUP, ServerHandle, ServerManager
from hybridflow.agent_loop.worker import AgentLoopWorker, split_indices
from hybridflow.protocol import DataProto
from hybridflow.rollout.server import STOP, TokenOutput
from hybridflow.single_controller.base import ClassWithInitArgs
from hybridflow.single_controller.factory import build_worker_group
from hybridflow.workers.rollout.weight_transfer import WEIGHT_RECEIVER, push_weights
from tests.agent_loop.scripted_rollout import ScriptedRolloutWorker


class ScriptedServer(ServerHandle):
    """Answers prompt[-1]+1, +2, ... (``length`` tokens); records every request."""

    def __init__(self, name, length=3):
        self.name, self.length, self.requests = name, length, []

    async def generate(self, prompt_ids, params, request_id, logprobs=True):
        self.requests.append((request_id, list(prompt_ids), params))
        await asyncio.sleep(0)
        n = min(self.length, params.response_length)
        toks = [prompt_ids[-1] + k + 1 for k in range(n)]
        return TokenOutput(toks, [-0.1 * t for t in toks] if logprobs else None, STOP)


def settings(**kw):
    rollout = {
        "prompt_length": 4,
        "response_length": 6,
        "temperature": 1.0,
        "calculate_log_probs": True,
        "val_kwargs": {"do_sample": False, "temperature": 0},
        **kw,
    }
    return agent_loop_settings(rollout)


def prompt_batch(rows, meta=None, **non_tensors):
    """Left-padded prompts (width 4) with optional non-tensor columns."""
    ids = torch.zeros((len(rows), 4), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, r in enumerate(rows):
        ids[i, 4 - len(r) :] = torch.tensor(r)
        mask[i, 4 - len(r) :] = 1
    cols = {k: np.array(v, dtype=object) for k, v in non_tensors.items()}
    return DataProto.from_dict(
        tensors={"input_ids": ids, "attention_mask": mask, "position_ids": mask.cumsum(-1)},
        non_tensors=cols,
        meta_info=meta or {},
    )


def test_single_turn_batch_request_ids_and_layout():
    srv = ScriptedServer("s0")
    worker = AgentLoopWorker(settings(), [srv], tokenizer=None, pad_token_id=0)
    out = asyncio.run(worker.generate_sequences(prompt_batch([[5, 6], [9]], {"global_steps": 7, "sample_offset": 10})))
    assert out.batch["responses"].tolist() == [[7, 8, 9, 0, 0, 0], [10, 11, 12, 0, 0, 0]]
    assert out.batch["response_mask"].tolist() == [[1, 1, 1, 0, 0, 0]] * 2
    assert out.batch["prompts"].tolist() == [[0, 0, 5, 6], [0, 0, 0, 9]]
    # ids: <train|val><step>:<index in the step>/<turn>: deterministic, so sampling is reproducible
    assert sorted(r[0] for r in srv.requests) == ["train7:10/0", "train7:11/0"]
    assert out.non_tensor_batch["num_turns"].tolist() == [2, 2]
    assert out.meta_info["metrics"]["agent/num_turns/mean"] == [2.0]


def test_raw_prompt_ids_win_and_validation_uses_val_kwargs():
    srv = ScriptedServer("s0")
    worker = AgentLoopWorker(settings(), [srv], tokenizer=None, pad_token_id=0)
    batch = prompt_batch([[5, 6]], {"validate": True}, raw_prompt_ids=[None])
    batch.non_tensor_batch["raw_prompt_ids"][0] = [1, 2, 3]
    asyncio.run(worker.generate_sequences(batch))
    rid, prompt, params = srv.requests[0]
    assert prompt == [1, 2, 3] and rid.startswith("val") and params.greedy


def test_response_length_override_per_call():
    srv = ScriptedServer("s0", length=10)
    worker = AgentLoopWorker(settings(), [srv], tokenizer=None, pad_token_id=0)
    out = asyncio.run(worker.generate_sequences(prompt_batch([[5]], {"response_length": 2})))
    assert out.batch["responses"].shape == (1, 2) and srv.requests[0][2].response_length == 2


@register("echo_twice_test")
class EchoTwice(AgentLoopBase):
    """A user loop: asks twice, appends a fake tool token in between (mask 0)."""

    async def run(self, sampling_params, **sample):
        first = await self.server_manager.generate(sample["request_id"], sample["prompt_ids"], sampling_params)
        ids = sample["prompt_ids"] + first.token_ids + [99]
        second = await self.server_manager.generate(sample["request_id"], ids, sampling_params)
        resp = first.token_ids + [99] + second.token_ids
        mask = [1] * len(first.token_ids) + [0] + [1] * len(second.token_ids)
        return AgentLoopOutput(
            sample["prompt_ids"],
            resp[:6],
            mask[:6],
            None,
            num_turns=4,
            extra_fields={"tag": sample["extra_info"]["tag"]},
        )


def test_agent_name_per_sample_sticky_routing_and_extra_fields():
    servers = [ScriptedServer("a", length=2), ScriptedServer("b", length=2)]
    worker = AgentLoopWorker(settings(), servers, tokenizer=None, pad_token_id=0)
    batch = prompt_batch([[5], [7]], agent_name=["echo_twice_test", None], extra_info=[{"tag": "x"}, {"tag": "y"}])
    out = asyncio.run(worker.generate_sequences(batch))
    # sample 0 (echo_twice_test): 6,7 | tool 99 | 100,101 ; sample 1 (default single turn): 8, 9
    assert out.batch["responses"][0].tolist() == [6, 7, 99, 100, 101, 0]
    assert out.batch["response_mask"][0].tolist() == [1, 1, 0, 1, 1, 0]
    assert out.batch["responses"][1].tolist() == [8, 9, 0, 0, 0, 0]
    assert list(out.non_tensor_batch["tag"]) == ["x", None]
    # both turns of sample 0 went to the same server, with per-turn engine ids
    turns = [(s.name, r[0]) for s in servers for r in s.requests if r[0].startswith("train0:0/")]
    assert sorted(t[1] for t in turns) == ["train0:0/0", "train0:0/1"] and len({t[0] for t in turns}) == 1


def test_unknown_agent_and_failing_loop_name_the_sample():
    worker = AgentLoopWorker(settings(), [ScriptedServer("a")], tokenizer=None, pad_token_id=0)
    with pytest.raises(KeyError, match="sample 1: agent_name 'nope'.*single_turn_agent"):
        asyncio.run(worker.generate_sequences(prompt_batch([[5], [6]], agent_name=[None, "nope"])))

    @register("raises_test")
    class Raises(AgentLoopBase):
        async def run(self, sampling_params, **sample):
            raise RuntimeError("tool exploded")

    try:
        with pytest.raises(RuntimeError, match="tool exploded") as e:
            asyncio.run(
                worker.generate_sequences(prompt_batch([[5]], {"sample_offset": 3}, agent_name=["raises_test"]))
            )
        assert any("sample 3" in n for n in e.value.__notes__)
    finally:
        AGENT_LOOPS._entries.pop("raises_test", None)


def test_server_manager_balances_new_trajectories():
    servers = [ScriptedServer("a"), ScriptedServer("b"), ScriptedServer("c")]
    manager = ServerManager(servers)

    async def go():
        await asyncio.gather(*[manager.generate(f"t{i}", [1], {"temperature": 1.0}) for i in range(9)])

    asyncio.run(go())
    assert [len(s.requests) for s in servers] == [3, 3, 3]
    assert isinstance(servers[0].requests[0][2].temperature, float)  # a dict of veRL sampling keys works


def test_split_indices():
    assert split_indices(10, 3) == [(0, 3), (3, 7), (7, 10)]
    assert split_indices(2, 8) == [(0, 1), (1, 2)]
    assert split_indices(0, 2) == [(0, 0)]


def test_manager_on_each_backend(backend):
    """The same AgentLoopManager code over a rollout group of either backend: slices spread over the agent
    loop workers and come back in order with the hybrid switches around them; weights pushed through the
    group's receivers stamp the next samples; streaming submit, pause/resume and in_flight work."""
    group = build_worker_group(
        backend,
        ClassWithInitArgs(ScriptedRolloutWorker),
        [1],
        name="scripted",
        concurrency_groups={ROLLOUT_CONCURRENCY_GROUP: 8},
    )
    manager = None

    class Tok:
        pad_token_id = 0

    try:
        manager = AgentLoopManager(settings(agent={"num_workers": 2}), group, Tok(), role=None)
        out = manager.generate_sequences(
            prompt_batch([[1], [2], [3], [4], [5]], {"global_steps": 2, "weight_version": 7})
        )
        assert out.batch["responses"][:, 0].tolist() == [2, 3, 4, 5, 6]  # order kept across the slices
        assert out.meta_info["metrics"]["timing_s/update_weights"] == [0.5]
        assert out.non_tensor_batch["min_weight_version"].tolist() == [0] * 5

        # a separate rollout pool's update: buckets, then the version the next samples carry
        push_weights([("w", torch.ones(2))], group.handles(WEIGHT_RECEIVER), version=3, bucket_bytes=1 << 20)
        late = manager.submit(prompt_batch([[9]], {"global_steps": 3})).result(timeout=60)
        assert late.batch["responses"][0, 0].item() == 10 and late.non_tensor_batch["min_weight_version"].tolist() == [
            3
        ]
        manager.pause()
        assert manager.in_flight() == 0 and manager.completed_trajectories() == 6
        manager.resume()

        request_ids, log = group.seen()
        assert sorted(request_ids) == [f"train2:{i}/0" for i in range(5)] + ["train3:0/0"]
        # the trainer's version reached prepare_rollout; the engines were released after generating
        assert [tuple(e) for e in log] == [("prepare", 7), ("release",), ("bucket", ["w"]), ("finish", 3)]
    finally:
        if manager is not None:
            manager.shutdown()
        group.close_engine()
        group.shutdown()


def test_an_engine_death_in_process_reaches_the_driver_as_rollout_engine_died_error():
    """In process the worker's RolloutEngineDiedError has no transport wrapper (its ``cause`` is None): the
    manager raises it as it is (it once raised None, and a TypeError hid the engine's death)."""
    from hybridflow.rollout.server import EngineDeadError, RolloutEngineDiedError

    group = build_worker_group("inprocess", ClassWithInitArgs(ScriptedRolloutWorker), [1], name="scripted")
    manager = None

    class Tok:
        pad_token_id = 0

    async def dead(prompt_ids, params, request_id, logprobs=True):
        raise EngineDeadError("vLLM's engine core process is gone")

    try:
        group.workers[0].server.generate = dead
        manager = AgentLoopManager(settings(agent={"num_workers": 1}), group, Tok(), role=None)
        with pytest.raises(RolloutEngineDiedError, match="gone"):
            manager.generate_sequences(prompt_batch([[1], [2]], {"global_steps": 1}))
    finally:
        if manager is not None:
            manager.shutdown()
        group.close_engine()
        group.shutdown()
