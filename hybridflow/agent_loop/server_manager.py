"""How agent loops reach the rollout servers: handles (in-process or Ray) and a load balancer.

A ``ServerHandle`` forwards one request to one engine and returns its ``TokenOutput``; the engine may
live in this process (``LocalServerHandle``, reached through its ``EngineLoop``) or in a Ray actor
(``RayServerHandle``: the worker process that hosts it; its ``async def server_generate`` runs as a
coroutine on the event loop of its "rollout" concurrency group, so many requests are in flight without a
thread each, while the driver's calls stay one at a time on the actor's default group).

``ServerManager.generate(request_id, prompt_ids, sampling_params)`` is what agent loops call. All turns
of one trajectory (same ``request_id``) go to the same server (its prefix cache holds the
conversation); a new trajectory goes to the server with the fewest requests in flight. Each call gets
its own engine request id, ``<request_id>/<turn>``, so sampling differs from turn to turn and is
reproducible from the ids alone. A request whose engine died (its process killed, or the engine's own
death signal) fails at once with ``RolloutEngineDiedError`` naming the engine and the rank hosting it.
"""

from __future__ import annotations

import asyncio
import itertools
from abc import ABC, abstractmethod
from collections import OrderedDict
from typing import Any

from hybridflow.rollout.sampling import SamplingParams
from hybridflow.rollout.server import ABORT, EngineDeadError, RolloutEngineDiedError, TokenOutput
from hybridflow.single_controller.base.direct import HandleKind
from hybridflow.single_controller.base.errors import is_process_gone

ROLLOUT_CONCURRENCY_GROUP = "rollout"


class ServerHandle(ABC):
    origin: tuple[str, str, int] = ("?", "?", -1)  # (engine, worker group, rank), named when the engine dies

    @abstractmethod
    async def generate(
        self, prompt_ids: list[int], params: SamplingParams, request_id: str, logprobs: bool = True
    ) -> TokenOutput: ...


class LocalServerHandle(ServerHandle):
    """A server in this process: ``host`` has ``.server`` and ``.engine_loop`` (a worker's ``rollout_host``,
    or a worker that holds its engine itself, as the judge worker)."""

    def __init__(self, host):
        self.host = host

    async def generate(self, prompt_ids, params, request_id, logprobs=True):
        version = getattr(self.host, "weight_version", None)  # as RolloutHost.generate stamps it
        out = await self.host.engine_loop.wrap(self.host.server.generate(prompt_ids, params, request_id, logprobs))
        if version is not None:
            out.extra["weight_version"] = version
        return out

    def __reduce__(self):
        raise TypeError("a LocalServerHandle reaches an engine in this process; it cannot be sent elsewhere")


class RayServerHandle(ServerHandle):
    """A server hosted by a Ray actor. ``role`` is set when the actor is a fused (colocated) worker."""

    def __init__(self, actor, role: str | None = None):
        self.actor = actor
        self.role = role

    async def generate(self, prompt_ids, params, request_id, logprobs=True):
        if self.role is None:
            method = self.actor.server_generate.options(concurrency_group=ROLLOUT_CONCURRENCY_GROUP)
            return await method.remote(prompt_ids, params, request_id, logprobs)
        method = self.actor.call_role_async.options(concurrency_group=ROLLOUT_CONCURRENCY_GROUP)
        return await method.remote(self.role, "server_generate", prompt_ids, params, request_id, logprobs)


# how a rollout worker group hands out its servers: ``rollout_wg.handles(SERVER_HANDLE, role)``
SERVER_HANDLE = HandleKind(
    in_process=lambda host, rank: LocalServerHandle(getattr(host, "rollout_host", None) or host),
    remote=lambda actor, role, rank: RayServerHandle(actor, role),
)


class ServerManager:
    """Sticky, least-loaded routing of requests over several servers (see the module docstring).

    Asynchronous training adds two things: a gate (``pause``/``resume``) that holds new requests while
    the weights change, and, with ``resume_on_abort`` (partial rollouts), requests that come back
    aborted are sent again once the gate opens, continuing from the tokens they already have; each
    token keeps the weight version that produced it.
    """

    def __init__(
        self,
        servers: list[ServerHandle],
        logprobs: bool = True,
        resume_on_abort: bool = False,
        max_sticky: int = 100_000,
    ):
        if not servers:
            raise ValueError("ServerManager needs at least one rollout server")
        self.servers = list(servers)
        self.logprobs = logprobs  # ask the engines for the sampled tokens' log-probs
        self.resume_on_abort = resume_on_abort
        self.in_flight = [0] * len(servers)
        self._sticky: OrderedDict[str, tuple[int, itertools.count]] = OrderedDict()
        self._max_sticky = max_sticky
        self._open: asyncio.Event | None = None  # created on the loop that uses it
        self.versions: dict[str, tuple[int, int]] = {}  # request id -> (min, max) weight version of its tokens

    def _gate(self) -> asyncio.Event:
        if self._open is None:
            self._open = asyncio.Event()
            self._open.set()
        return self._open

    def pause(self) -> None:
        """New requests (and re-sent aborted ones) wait until ``resume``."""
        self._gate().clear()

    def resume(self) -> None:
        self._gate().set()

    def _route(self, request_id: str) -> tuple[int, int]:
        if request_id in self._sticky:
            self._sticky.move_to_end(request_id)
            server, turns = self._sticky[request_id]
        else:
            server = min(range(len(self.servers)), key=lambda i: self.in_flight[i])
            turns = itertools.count()
            self._sticky[request_id] = (server, turns)
            if len(self._sticky) > self._max_sticky:
                self._sticky.popitem(last=False)
        return server, next(turns)

    async def generate(
        self, request_id: str, prompt_ids: list[int], sampling_params: SamplingParams | dict[str, Any]
    ) -> TokenOutput:
        if isinstance(sampling_params, dict):
            sampling_params = SamplingParams().with_overrides(sampling_params)
        await self._gate().wait()
        server, turn = self._route(request_id)
        tokens: list[int] = []
        log_probs: list[float] | None = [] if self.logprobs else None
        versions: list[int] = []
        part = 0
        while True:
            params = sampling_params
            if tokens:  # a resumed request continues from what it has, within the same budget
                params = sampling_params.with_overrides(
                    {"response_length": max(sampling_params.response_length - len(tokens), 0)}
                )
            engine_id = f"{request_id}/{turn}" + (f".{part}" if part else "")
            self.in_flight[server] += 1
            try:
                out = await self.servers[server].generate(list(prompt_ids) + tokens, params, engine_id, self.logprobs)
            except Exception as e:
                if isinstance(e, EngineDeadError) or is_process_gone(e):
                    raise RolloutEngineDiedError.of(e, *self.servers[server].origin, engine_id) from e
                raise
            finally:
                self.in_flight[server] -= 1
            tokens += out.token_ids
            if log_probs is not None:
                log_probs += out.log_probs or [0.0] * len(out.token_ids)
            version = out.extra.get("weight_version")
            if version is not None:
                versions += [version] * len(out.token_ids)
                low, high = self.versions.get(request_id, (version, version))
                self.versions[request_id] = (min(low, version), max(high, version))
            resumable = (
                out.stop_reason == ABORT and self.resume_on_abort and params.response_length > len(out.token_ids)
            )
            if not resumable:
                extra = dict(out.extra)
                if versions:
                    extra["weight_versions"] = versions
                return TokenOutput(tokens, log_probs, out.stop_reason, extra)
            part += 1
            await self._gate().wait()  # the weights are changing: continue once they are in

    def total_in_flight(self) -> int:
        return sum(self.in_flight)

    def release(self, request_id: str) -> tuple[int, int] | None:
        """Forget a finished trajectory's routing; returns the (min, max) weight version of its tokens."""
        self._sticky.pop(request_id, None)
        return self.versions.pop(request_id, None)
