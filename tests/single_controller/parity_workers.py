"""Worker classes for the veRL-parity single-controller tests (Ray ships them by value)."""

import asyncio
import os

import torch
from tensordict import NonTensorData, NonTensorStack, TensorDict

from hybridflow.protocol import DataProto
from hybridflow.single_controller.base import Dispatch, Execute, Worker, register
from hybridflow.single_controller.base.decorator import register_dispatch_mode


def _twice(worker_group, x):
    return ([x * 2] * worker_group.world_size,), {}


def _total(worker_group, outputs):
    return sum(outputs)


# A mode registered on the driver only (this module is shipped by value, never imported by Ray
# workers): the member must still reach the workers, by name.
if "PARITY_TWICE" not in Dispatch:
    register_dispatch_mode("parity_twice", _twice, _total)


class AsyncWorker(Worker):
    def __init__(self):
        super().__init__()
        self.calls = 0

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    async def bump(self, by):
        await asyncio.sleep(0.01)  # a real await: the method must run on an event loop
        self.calls += by
        return self.calls

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    async def loop_is_running(self):
        return asyncio.get_running_loop().is_running()

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    async def double(self, data: DataProto) -> DataProto:
        await asyncio.sleep(0)
        return DataProto.from_dict(tensors={"y": data.batch["x"] * 2})

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def plain(self):
        return "sync"


class ParityWorker(AsyncWorker):
    """Sync and (inherited) async methods in one class: on Ray an async actor runs both."""

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def rank_and(self, v):
        return self.rank, v

    @register(dispatch_mode=Dispatch.PARITY_TWICE)
    def twice(self, x):
        return x

    @register(dispatch_mode=Dispatch.ALL_TO_ALL)
    def add(self, a, b):
        return a + b

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, blocking=False)
    def rank_and_later(self, v):
        return self.rank, v

    @register(dispatch_mode=Dispatch.ALL_TO_ALL, blocking=False)
    def add_later(self, a, b):
        return a + b

    @register(dispatch_mode=Dispatch.ALL_TO_ALL, execute_mode=Execute.RANK_ZERO, blocking=False)
    def on_rank_zero_later(self, scalar):
        return self.rank, scalar

    @register(dispatch_mode=Dispatch.ALL_TO_ALL, execute_mode=Execute.RANK_ZERO)
    def on_rank_zero(self, scalar, mapping):
        return self.rank, scalar, mapping

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def td_double(self, td: TensorDict) -> TensorDict:
        # a TensorDict in, a TensorDict out; the per-row objects ride along
        names = [item.data for item in td.get("name")]
        out = TensorDict({"y": td["x"] * 2, "rank": torch.full((len(td),), self.rank)}, batch_size=[len(td)])
        out["name"] = NonTensorStack.from_list([NonTensorData(n.upper()) for n in names])
        return out

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def env(self, name):
        return os.environ.get(name)
