"""A rollout worker whose server's latencies are scripted (prompts ending in a token >= 100 are slow:
they finish only when aborted, or after ``slow_s``), for the over-sampling tests. Importable by Ray workers."""

from __future__ import annotations

import asyncio

from hybridflow.rollout.server import ABORT, STOP, EngineLoop, TokenOutput
from hybridflow.single_controller.base import Dispatch, Worker, register

PAD = 0


class PadOnlyTokenizer:
    """All the agent loop manager reads of a tokenizer when no loop decodes."""

    pad_token_id = PAD


class LatencyServer:
    """Fast prompts answer [p+1, p+2, p+3] at once; slow ones wait for an abort (then return the one
    token they have) or ``slow_s`` seconds (then the full answer)."""

    def __init__(self, slow_s: float):
        self.slow_s, self.aborts, self.waiting, self.request_ids = slow_s, 0, 0, []
        self._abort: asyncio.Event | None = None

    async def generate(self, prompt_ids, params, request_id, logprobs=True):
        self.request_ids.append(request_id)
        p = prompt_ids[-1]
        answer = [p + 1, p + 2, p + 3]
        if p >= 100:
            self._abort = self._abort or asyncio.Event()
            self.waiting += 1
            try:
                await asyncio.wait_for(self._abort.wait(), self.slow_s)
                return TokenOutput(answer[:1], [-0.5], ABORT)
            except asyncio.TimeoutError:
                pass
            finally:
                self.waiting -= 1
        return TokenOutput(answer, [-0.5] * 3, STOP)

    async def abort_all(self):
        self.aborts += 1
        if self._abort is not None:
            self._abort.set()
        return 0


class LatencyRolloutWorker(Worker):
    def __init__(self, slow_s: float):
        super().__init__()
        self.server, self.engine_loop = LatencyServer(slow_s), EngineLoop("latency-engine")

    async def server_generate(self, prompt_ids, params, request_id: str, logprobs: bool = True):  # the Ray handle's
        return await self.engine_loop.wrap(self.server.generate(prompt_ids, params, request_id, logprobs))

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def prepare_rollout(self, version=None):
        return {}

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def release_rollout(self):
        pass

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def abort_rollout(self):
        return self.engine_loop.run(self.server.abort_all())

    @register(dispatch_mode=Dispatch.RANK_ZERO)
    def aborts(self) -> int:
        return self.server.aborts

    @register(dispatch_mode=Dispatch.RANK_ZERO)
    def request_ids(self) -> list[str]:
        return self.server.request_ids

    @register(dispatch_mode=Dispatch.RANK_ZERO)
    def waiting(self) -> int:
        """Slow requests the server holds now."""
        return self.server.waiting

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def close_engine(self) -> None:
        self.engine_loop.close()
