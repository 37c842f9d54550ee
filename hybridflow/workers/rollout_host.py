"""RolloutHost: one rollout engine as an asynchronous server in a worker process, held by the worker.

``ActorRolloutRefWorker`` builds one (``rollout_host``) when its role includes the rollout, with explicit
arguments, and its registered methods delegate to it. The host runs the engine on an ``EngineLoop``
thread and offers:
- per-request generation for agent loop workers (``generate``; in-process handles reach ``server`` and
  ``engine_loop`` directly), and a whole batch through the agent loop on this engine
  (``generate_sequences``);
- the hybrid engine's phase switches (``wake_up`` / ``sleep``) and weight loading: a stream of named
  tensors in buckets (``load_weights``: the colocated actor's push) or bucket by bucket from another
  process (``receive_weights``, ``finish_weight_sync(version)``);
- ``abort`` (partial rollouts: in-flight requests stop and return what they have) and ``shutdown``.

Every answer carries ``weight_version``: how many weight updates the engine had received when the
request started, so each sample knows which policy produced it.
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import time
from collections.abc import Iterable

import torch

from hybridflow.agent_loop.base import agent_loop_settings
from hybridflow.agent_loop.server_manager import LocalServerHandle
from hybridflow.agent_loop.worker import AgentLoopWorker
from hybridflow.config.rollout import RolloutConfig
from hybridflow.protocol import DataProto
from hybridflow.rollout.sampling import model_eos_token_ids
from hybridflow.rollout.server import EngineLoop, ServerSpec, rollout_server_class
from hybridflow.utils.torch_dtypes import resolve_dtype
from hybridflow.workers.engine.lora import LoraSpec
from hybridflow.workers.model_loading import load_model
from hybridflow.workers.rollout.weights import buckets

logger = logging.getLogger(__name__)

EXIT_PROBE_S = 5.0  # how long the engine loop may take to answer at exit before it counts as stuck


def bucket_bytes(rollout_config: RolloutConfig) -> int:
    """The size of one bucket of a weight update (``rollout.checkpoint_engine.update_weights_bucket_megabytes``)."""
    return int(float(rollout_config.checkpoint_engine.update_weights_bucket_megabytes) * (1 << 20))


class RolloutHost:
    """``config``: the typed ``actor_rollout_ref.rollout`` section; ``model_path``: the local model;
    ``adapter``: the LoRA adapter the engine serves on top of its base weights (None: merged weights)."""

    def __init__(
        self,
        config: RolloutConfig,
        model_path: str,
        tokenizer,
        device,
        rank: int,
        trust_remote_code: bool,
        override_config: dict | None = None,
        adapter: LoraSpec | None = None,
        config_path: str | None = None,
    ):
        self.config, self.tokenizer, self.rank = config, tokenizer, rank
        name = config.name
        dtype = resolve_dtype(config.dtype, str(device))
        server_cls = rollout_server_class(name)
        module = None
        if server_cls.needs_module:
            # a separate inference copy: generation never all-gathers sharded weights token by token
            module = (
                load_model(
                    model_path,
                    "causal_lm",
                    override_config=override_config or {},
                    trust_remote_code=trust_remote_code,
                    config_path=config_path,
                )
                .to(device=device, dtype=getattr(torch, dtype))
                .eval()
            )
        spec = ServerSpec(
            model_path=model_path,
            config=config,
            pad_token_id=int(tokenizer.pad_token_id),
            eos_token_ids=tuple(model_eos_token_ids(model_path, tokenizer)),
            device=str(device),
            dtype=dtype,
            trust_remote_code=trust_remote_code,
            module=module,
            lora_rank=adapter.rank if adapter else 0,
            lora_alpha=adapter.alpha if adapter else 16.0,
        )
        self.engine_loop = EngineLoop(f"rollout-engine-rank{rank}")

        async def build():
            return server_cls(spec)

        self.server = self.engine_loop.run(build())
        self.agent_settings = agent_loop_settings(config)
        self.weight_version = 0  # updates the engine has received (stamped on what it generates)
        # at exit, before the engine loop stops (atexit runs last-registered first): engines with processes
        # of their own (vllm) shut them down instead of leaving it to garbage collection
        atexit.register(self._shutdown_at_exit)

    def shutdown(self) -> None:
        """Release the engine (its processes, its memory); idempotent."""
        server, self.server = self.server, None
        if server is not None and self.engine_loop.loop.is_running():
            try:
                self.engine_loop.run(server.shutdown(), timeout=60)
            finally:
                self.engine_loop.close()
            atexit.unregister(self._shutdown_at_exit)

    def _shutdown_at_exit(self) -> None:
        """At exit nothing may raise or wait long: an engine loop that gives no answer within seconds is
        stuck (in process, a hang the watchdog already reported), and its server is left to the process's end."""
        try:
            self.engine_loop.run(asyncio.sleep(0), timeout=EXIT_PROBE_S)
            self.shutdown()
        except Exception as e:  # noqa: BLE001 - the run's own error, printed before, is the one that counts
            logger.warning("rollout engine of rank %s not shut down at exit: %s", self.rank, type(e).__name__)

    # ---------------------------------------------------------------------- phases and weights
    def wake_up(self) -> None:
        self.engine_loop.run(self.server.wake_up())

    def sleep(self) -> None:
        self.engine_loop.run(self.server.sleep())

    def load_weights(self, named_tensors: Iterable, version: int | None = None) -> dict:
        """Stream weights of this process into the engine, bucket by bucket; the version the engine is at
        afterwards: ``version``, else one more than before."""
        start = time.perf_counter()
        n_tensors = n_bytes = 0
        for bucket in buckets(named_tensors, bucket_bytes(self.config)):
            n_tensors += self.engine_loop.run(self.server.load_weights(bucket))
            n_bytes += sum(t.numel() * t.element_size() for _, t in bucket)
            del bucket
        self.engine_loop.run(self.server.finish_weight_update())
        self.weight_version = self.weight_version + 1 if version is None else int(version)
        return {
            "timing_s/update_weights": time.perf_counter() - start,
            "rollout/weight_sync_mb": n_bytes / (1 << 20),
            "rollout/weight_sync_tensors": n_tensors,
        }

    def share_weights(self, named_tensors: Iterable) -> dict[str, torch.Tensor] | None:
        """Memory the engine reads these tensors from without a copy (``AsyncRolloutServer.share_weights``)."""
        return self.engine_loop.run(self.server.share_weights(named_tensors))

    def receive_weights(self, bucket) -> int:
        """One bucket of a weight update sent by the trainer's group (``send_weights``)."""
        return self.engine_loop.run(self.server.load_weights(bucket))

    def finish_weight_sync(self, version: int) -> int:
        self.engine_loop.run(self.server.finish_weight_update())
        self.weight_version = int(version)
        return self.weight_version

    # ---------------------------------------------------------------------- requests
    async def generate(self, prompt_ids, params, request_id: str, logprobs: bool = True):
        """One request to the engine (called per trajectory turn by agent loop workers), awaited on the
        caller's event loop: many requests in flight cost no thread each."""
        version = self.weight_version
        out = await self.engine_loop.wrap(self.server.generate(prompt_ids, params, request_id, logprobs))
        out.extra["weight_version"] = version
        return out

    def abort(self) -> int:
        """Stop every request in flight; each returns the tokens it has (partial rollouts)."""
        return self.engine_loop.run(self.server.abort_all())

    def generate_sequences(self, prompts: DataProto) -> DataProto:
        """A batch through the agent loop on this engine. Loops that template chats use
        ``meta_info["apply_chat_template_kwargs"]``. Every rank gets the caller's meta_info; this slice's
        samples start rank x rows after the caller's offset (the seeds of its requests). The offset names
        the request, not the result: outputs keep the caller's meta_info without it, so the ranks'
        outputs concatenate."""
        worker = AgentLoopWorker(
            self.agent_settings, [LocalServerHandle(self)], self.tokenizer, self.tokenizer.pad_token_id
        )
        caller_meta = {k: v for k, v in prompts.meta_info.items() if k != "sample_offset"}
        offset = int(prompts.meta_info.get("sample_offset", 0)) + self.rank * len(prompts)
        request = DataProto(
            batch=prompts.batch,
            non_tensor_batch=prompts.non_tensor_batch,
            meta_info={**caller_meta, "sample_offset": offset},
        )
        output = self.engine_loop.run(worker.generate_sequences(request))
        output.meta_info = {**caller_meta, "metrics": output.meta_info.pop("metrics", {})}
        return output
