"""The rollout engine as an asynchronous server: one trajectory's token ids in, token ids out.

Every engine (``hf``, ``vllm``, a user's) implements ``AsyncRolloutServer``. A request is the full
token context of one trajectory so far plus its sampling parameters; the answer is the new tokens,
their log-probs (log softmax(logits / temperature) of the sampled token, the quantity the trainer
recomputes) and why generation stopped. Many requests are in flight at once: the engine batches them
(vLLM's continuous batching; the hf engine gathers what is pending into one ``generate`` call).

The server lives on one asyncio event loop (``EngineLoop``, a thread of the worker process that hosts
the engine); everything else (the agent loop, the worker's synchronous methods) reaches it through
that loop. Weights arrive in buckets (``load_weights`` once per bucket, then ``finish_weight_update``)
so that the trainer never has to hold its full state dict twice.
"""

from __future__ import annotations

import asyncio
import atexit
import threading
from abc import ABC, abstractmethod
from collections.abc import Coroutine, Iterable
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar

import torch

from hybridflow.config.rollout import REGISTERED_ENGINES, RolloutConfig
from hybridflow.rollout.sampling import SamplingParams
from hybridflow.single_controller.base.errors import WorkerDiedError, WorkerError
from hybridflow.utils.registry import Registry

T = TypeVar("T")

# why a request ended: an EOS / stop token, the max_tokens limit, or an abort (weight update, shutdown)
STOP, LENGTH, ABORT = "stop", "length", "abort"


class EngineDeadError(RuntimeError):
    """A server's engine is gone (its process killed, crashed or out of memory): what it held will never be
    answered. A server raises it for its engine's own death signal (vLLM's ``EngineDeadError``)."""


class RolloutEngineDiedError(WorkerDiedError):
    """A rollout engine died while the driver waited on it: names the engine, the worker group and rank
    that host it, the step and what the engine was doing (``during``: generation, a weight update).
    Raised where requests are sent (``ServerManager``; the step is filled in by the agent loop worker
    that ran the batch) and where the driver calls the engines between generations (``from_worker``).
    Pickles by its fields (it crosses process boundaries)."""

    def __init__(self, engine: str, group: str, rank: int, detail: str, step=None, method="generate"):
        RuntimeError.__init__(self, detail)
        self.engine, self.group, self.rank, self.detail, self.step = engine, group, rank, detail, step
        self.method, self.during = method, "generation"

    @classmethod
    def of(cls, error: BaseException, engine: str, group: str, rank: int, request_id: str):
        """The error for a request whose engine died (``error``: how the engine's death surfaced)."""
        cause = getattr(error, "cause", None) or error  # a transport's wrapper (Ray's RayTaskError) holds the original
        return cls(engine, group, rank, f"request {request_id!r}: {_summary(cause)}")

    @classmethod
    def from_worker(cls, error: WorkerError, engine: str, during: str, step=None):
        """``error`` (a rollout worker's method failed) as this error when its cause is the engine's death
        (``EngineDeadError``), else None. ``during`` says what the engine was asked to do."""
        cause = error.cause
        for _ in range(8):  # through nested wrappers (a trainer rank that pushed to a rollout worker):
            if cause is None or isinstance(cause, EngineDeadError):
                break
            if isinstance(cause, WorkerError):
                error = cause  # the failed worker nearest the engine names it
            cause = getattr(cause, "cause", None) or cause.__cause__
        if not isinstance(cause, EngineDeadError):
            return None
        died = cls(engine, error.group, error.rank, _summary(cause), step, error.method)
        died.during = during
        return died

    def __str__(self):
        at = "" if self.step is None else f" at global step {self.step}"
        return (
            f"rollout engine {self.engine!r} of worker group {self.group!r}, rank {self.rank} died during "
            f"{self.during}{at} (process killed, crashed or out of memory): {self.detail}"
        )

    def __reduce__(self):  # the step and the notes travel in __dict__
        return type(self), (self.engine, self.group, self.rank, self.detail), self.__dict__


@contextmanager
def engine_death_named(engine: str, during: str, step=None):
    """Around a call of rollout workers outside any request (wake, weight push, sleep): a failure caused
    by an engine's death is raised as ``RolloutEngineDiedError`` (``RolloutEngineDiedError.from_worker``)."""
    try:
        yield
    except WorkerError as e:
        died = RolloutEngineDiedError.from_worker(e, engine, during, step)
        if died is None:
            raise
        raise died from e


def _summary(error: BaseException) -> str:
    lines = str(error).strip().splitlines() or [""]
    return f"{type(error).__name__}: {lines[0][:300]}"


@dataclass
class TokenOutput:
    """The answer to one request. ``log_probs`` is None when the caller did not ask for them."""

    token_ids: list[int]
    log_probs: list[float] | None = None
    stop_reason: str = STOP
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ServerSpec:
    """What every engine is built from, whatever its kind (the worker fills it in once).

    ``module`` is a ready inference copy of the model for engines that run in the worker's own torch
    (hf); engines with their own loader (vllm) read ``model_path``. ``lora_rank > 0`` asks an engine
    that can serve LoRA adapters (vllm) to be built for adapters of up to that rank, scaled by
    ``lora_alpha / rank`` as peft does; 0 means merged weights only.
    """

    model_path: str
    config: RolloutConfig  # the typed rollout section (the actor's or the judge's)
    pad_token_id: int
    eos_token_ids: tuple[int, ...]
    device: str = "cpu"
    dtype: str = "float32"
    trust_remote_code: bool = False
    module: Any = None
    lora_rank: int = 0
    lora_alpha: float = 16.0


class AsyncRolloutServer(ABC):
    """Token-in-token-out generation with many requests in flight (see the module docstring).

    ``needs_module``: the worker builds a transformers copy of the model for the engine (``ServerSpec.module``),
    as for the hf engine; an engine that loads the model itself (vllm) leaves it False."""

    needs_module: bool = False

    @abstractmethod
    async def generate(
        self, prompt_ids: list[int], params: SamplingParams, request_id: str, logprobs: bool = True
    ) -> TokenOutput:
        """Continue ``prompt_ids`` by at most ``params.response_length`` tokens; stop at an EOS id
        unless ``params.ignore_eos``. The EOS that ends a response is part of ``token_ids``."""

    async def score(self, sequences: list[list[int]], topk: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """What a distillation teacher computes: per sequence of L tokens, (ids (L-1, K), log-probs
        (L-1, K)) of the next-token distribution at temperature 1 before each token but the first:
        its ``topk`` most likely tokens (descending) when ``topk > 0``, else the token itself (K = 1)."""
        raise NotImplementedError(f"the {type(self).__name__} engine cannot score tokens")

    @abstractmethod
    async def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> int:
        """Copy one bucket of full (unsharded) tensors, named as in the Hugging Face model, into the
        engine; returns how many were loaded. Called once per bucket during a weight update."""

    async def finish_weight_update(self) -> None:
        """All buckets are in: drop whatever was computed with the old weights (prefix caches)."""

    async def share_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> dict[str, torch.Tensor] | None:
        """Memory the engine reads weights from where they lie: ``named_tensors`` copied into it, by name, for
        the trainer to keep its own tensors in, so that a later push of them sends their places, not their
        bytes; None where the engine has no such memory."""
        return None

    async def abort_all(self) -> int:
        """Stop every request in flight (they return with ``stop_reason == "abort"``); returns how many."""
        return 0

    async def sleep(self, level: int = 1) -> None:
        """Free the engine's memory while the trainer runs (no-op where there is nothing to free)."""

    async def wake_up(self, tags: list[str] | None = None) -> None:
        """Reacquire what ``sleep`` freed (``tags``: e.g. ["weights"] then ["kv_cache"] where supported)."""

    async def shutdown(self) -> None:
        """Release the engine (processes, memory)."""


ROLLOUT_SERVERS: Registry[type[AsyncRolloutServer]] = Registry("rollout engine")


def register_rollout_server(name: str):
    """Class decorator: make an engine selectable as ``actor_rollout_ref.rollout.name=<name>`` in this
    process (Ray workers are other processes: there, name the class itself, below).

    The class is built as ``cls(spec: ServerSpec)`` inside the worker process, on the engine loop.
    """
    REGISTERED_ENGINES.add(name)  # what the config's rollout.name accepts besides hf and vllm
    return ROLLOUT_SERVERS.register(name)


def rollout_server_class(name: str, key: str = "actor_rollout_ref.rollout.name") -> type[AsyncRolloutServer]:
    """The engine ``rollout.name`` selects: a registered name (hf, vllm, yours), or your class itself as
    ``package.module.ClassName`` or ``path/to/file.py:ClassName`` (imported where the engine runs, so it
    works in every worker process). Errors name ``key``."""
    from hybridflow.utils.import_utils import load_class

    name = str(name)
    if name in ROLLOUT_SERVERS or not ("." in name or ":" in name):
        return ROLLOUT_SERVERS[name]  # an unknown name: the error lists the known ones
    cls = load_class(name, what=key)
    if not (isinstance(cls, type) and issubclass(cls, AsyncRolloutServer)):
        raise TypeError(f"{key}={name}: {cls!r} is not an AsyncRolloutServer subclass (hybridflow.rollout)")
    return cls


class EngineLoop:
    """An asyncio event loop on a daemon thread: the home of one rollout server.

    ``run(coro)`` blocks the calling thread until the coroutine finished on the loop; ``submit`` returns
    a concurrent Future; ``wrap(coro)`` returns an awaitable for another event loop (the agent loop's).
    """

    def __init__(self, name: str = "hybridflow-engine-loop"):
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._thread.start()
        atexit.register(self.close)  # cancel the server's tasks quietly when the process ends

    def _serve(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def submit(self, coro: Coroutine[Any, Any, T]) -> Future:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        if threading.current_thread() is self._thread:
            coro.close()
            raise RuntimeError("EngineLoop.run called from the engine loop itself (would deadlock); await instead")
        return self.submit(coro).result(timeout)

    def wrap(self, coro: Coroutine[Any, Any, T]) -> asyncio.Future[T]:
        return asyncio.wrap_future(self.submit(coro))

    def close(self) -> None:
        """Cancel whatever still runs on the loop, then stop it (idempotent)."""
        if not self.loop.is_running():
            return

        async def cancel_all():
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        try:
            self.submit(cancel_all()).result(timeout=10)
        except Exception:  # a task that refuses to die must not block shutdown
            pass
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)
        atexit.unregister(self.close)
