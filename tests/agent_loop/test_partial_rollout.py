"""Partial rollouts in the ServerManager: a request aborted by a weight sync comes back with the tokens it
has, waits while the gate is closed, and continues from them with the new weights; every token keeps
the weight version that produced it."""

from __future__ import annotations

import asyncio

from hybridflow.agent_loop.server_manager import ServerHandle, ServerManager
from hybridflow.rollout.sampling import SamplingParams
from hybridflow.rollout.server import ABORT, STOP, TokenOutput


class SyncingServer(ServerHandle):
    """Counts up from the last prompt token; the first call is cut after ``cut`` tokens (an abort)."""

    def __init__(self, cut: int):
        self.cut, self.version, self.requests = cut, 0, []

    async def generate(self, prompt_ids, params, request_id, logprobs=True):
        self.requests.append((request_id, list(prompt_ids), params.response_length))
        await asyncio.sleep(0)
        n = params.response_length
        stop = STOP
        if len(self.requests) == 1:
            n, stop = self.cut, ABORT
        toks = [prompt_ids[-1] + k + 1 for k in range(n)]
        return TokenOutput(toks, [-0.5] * n, stop, {"weight_version": self.version})


def test_an_aborted_request_resumes_from_its_tokens_with_the_new_weights():
    server = SyncingServer(cut=2)
    manager = ServerManager([server], resume_on_abort=True)
    params = SamplingParams(response_length=6)

    async def scenario():
        manager.pause()  # the sync closes the gate before it aborts ...
        manager.resume()
        task = asyncio.create_task(manager.generate("train1:0", [10, 11], params))
        while len(server.requests) < 1:
            await asyncio.sleep(0)
        manager.pause()  # ... the abort returns 2 tokens while the weights change
        for _ in range(20):
            await asyncio.sleep(0)
        assert len(server.requests) == 1  # held at the gate
        server.version = 1
        manager.resume()
        return await task

    out = asyncio.run(scenario())
    # tokens: 12, 13 from version 0, then 14..17 continuing from them with version 1 (6 in all)
    assert out.token_ids == [12, 13, 14, 15, 16, 17]
    assert out.extra["weight_versions"] == [0, 0, 1, 1, 1, 1]
    assert out.stop_reason == STOP and out.log_probs == [-0.5] * 6
    (first_id, first_prompt, first_len), (second_id, second_prompt, second_len) = server.requests
    assert (first_id, first_prompt, first_len) == ("train1:0/0", [10, 11], 6)
    assert (second_id, second_prompt, second_len) == ("train1:0/0.1", [10, 11, 12, 13], 4)  # same budget in all
    assert manager.release("train1:0") == (0, 1)


def test_without_partial_rollouts_an_abort_ends_the_request():
    server = SyncingServer(cut=3)
    manager = ServerManager([server], resume_on_abort=False)
    out = asyncio.run(manager.generate("r", [1], SamplingParams(response_length=5)))
    assert out.token_ids == [2, 3, 4] and out.stop_reason == ABORT and len(server.requests) == 1
