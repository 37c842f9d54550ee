"""A rollout worker with a scripted server (answers prompt[-1] + 1): what ``AgentLoopManager`` needs
from a rollout group (``server`` + ``engine_loop`` in process, ``server_generate`` on Ray, the hybrid
engine's switches, weight receiving), without a model. Importable by Ray workers."""

from __future__ import annotations

from hybridflow.rollout.server import STOP, EngineLoop, TokenOutput
from hybridflow.single_controller.base import Dispatch, Worker, register


class ScriptedServer:
    def __init__(self):
        self.request_ids: list[str] = []

    async def generate(self, prompt_ids, params, request_id, logprobs=True):
        self.request_ids.append(request_id)
        return TokenOutput([prompt_ids[-1] + 1], [-1.0], STOP)


class ScriptedRolloutWorker(Worker):
    def __init__(self):
        super().__init__()
        self.server, self.engine_loop = ScriptedServer(), EngineLoop("scripted-engine")
        self.weight_version = 0
        self.log: list = []  # the switches and weight messages the worker got, in order

    async def server_generate(self, prompt_ids, params, request_id: str, logprobs: bool = True):
        out = await self.engine_loop.wrap(self.server.generate(prompt_ids, params, request_id, logprobs))
        out.extra["weight_version"] = self.weight_version
        return out

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def prepare_rollout(self, version=None):
        self.log.append(("prepare", version))
        return {"timing_s/update_weights": 0.5}

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def release_rollout(self):
        self.log.append(("release",))

    def receive_weights(self, bucket) -> int:
        self.log.append(("bucket", [name for name, _ in bucket]))
        return len(bucket)

    def finish_weight_sync(self, version: int) -> int:
        self.weight_version = int(version)
        self.log.append(("finish", version))
        return self.weight_version

    @register(dispatch_mode=Dispatch.RANK_ZERO)
    def seen(self) -> tuple[list[str], list]:
        """The request ids the server answered and the worker's log."""
        return list(self.server.request_ids), list(self.log)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def close_engine(self) -> None:
        self.engine_loop.close()
