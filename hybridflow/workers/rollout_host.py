"""RolloutHost: the rollout side of a worker process, mixed into ActorRolloutRefWorker.

It hosts one rollout engine as an asynchronous server on an ``EngineLoop`` thread and exposes:
- per-request generation for agent loop workers (``server_generate``, called directly on the actor,
  in the "rollout" concurrency group, so many requests are in flight);
- the hybrid engine's phase switches (``prepare_rollout``: wake + push the colocated actor's new
  weights; ``release_rollout``: sleep);
- weight updates from a trainer in another process (``receive_weights`` per bucket,
  ``finish_weight_sync(version)``), and the trainer side of them (``send_weights``);
- ``abort_rollout`` (partial rollouts: in-flight requests stop and return what they have).

With a LoRA policy the weights go either merged or as base weights (first sync only) + the adapter
(``model.lora.merge``, see ``engine/lora.py``); both travel the same way in every mode.

Every answer carries ``weight_version``: how many weight updates the engine had received when the
request started, so each sample knows which policy produced it.
"""

from __future__ import annotations

import atexit
import time

import torch

from hybridflow.agent_loop.base import agent_loop_settings
from hybridflow.agent_loop.server_manager import LocalServerHandle
from hybridflow.agent_loop.worker import AgentLoopWorker
from hybridflow.protocol import DataProto
from hybridflow.rollout.sampling import model_eos_token_ids
from hybridflow.rollout.server import ROLLOUT_SERVERS, EngineLoop, ServerSpec
from hybridflow.single_controller.base import Dispatch, register
from hybridflow.utils.torch_dtypes import resolve_dtype
from hybridflow.workers.engine.lora import lora_spec, rollout_gets_adapter
from hybridflow.workers.model_loading import load_model
from hybridflow.workers.rollout.weight_transfer import WeightTarget, push_weights
from hybridflow.workers.rollout.weights import buckets


class RolloutHost:
    """Needs from the host class: ``config`` (the typed actor_rollout_ref section), ``model_config`` (its typed model
    section), ``tokenizer``, ``device``,
    ``rank``, ``_is_actor`` / ``_is_rollout``, ``actor_engine`` and ``lora`` (actors), ``_rollout_stale``,
    ``_rollout_has_base`` (the engine has received the base weights once), ``weight_version``."""

    def _build_rollout(self, path: str, trust: bool) -> None:
        """The rollout engine as an asynchronous server, living on this process's engine loop."""
        rollout_cfg = self.config.rollout
        name = rollout_cfg.name
        dtype = resolve_dtype(rollout_cfg.dtype, str(self.device))
        module = None
        if name == "hf":
            # a separate inference copy: generation never all-gathers sharded weights token by token
            module = (
                load_model(
                    path, "causal_lm", override_config=self.config.model.override_config or {}, trust_remote_code=trust
                )
                .to(device=self.device, dtype=getattr(torch, dtype))
                .eval()
            )
        adapter = rollout_gets_adapter(self.model_config, name)
        lora = lora_spec(self.model_config) if adapter else None  # a saved adapter's own rank/alpha
        spec = ServerSpec(
            model_path=path,
            config=rollout_cfg,
            pad_token_id=int(self.tokenizer.pad_token_id),
            eos_token_ids=tuple(model_eos_token_ids(path, self.tokenizer)),
            device=str(self.device),
            dtype=dtype,
            trust_remote_code=trust,
            module=module,
            lora_rank=lora.rank if lora else 0,
            lora_alpha=lora.alpha if lora else 16.0,
        )
        self.engine_loop = EngineLoop(f"rollout-engine-rank{self.rank}")
        server_cls = ROLLOUT_SERVERS[name]

        async def build():
            return server_cls(spec)

        self.server = self.engine_loop.run(build())
        self.agent_settings = agent_loop_settings(rollout_cfg)
        # at exit, before the engine loop stops (atexit runs last-registered first): engines with processes
        # of their own (vllm) shut them down instead of leaving it to garbage collection
        atexit.register(self.shutdown_rollout)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def shutdown_rollout(self) -> None:
        """Release the engine (its processes, its memory); idempotent."""
        server, self.server = getattr(self, "server", None), None
        if server is not None and self.engine_loop.loop.is_running():
            try:
                self.engine_loop.run(server.shutdown(), timeout=60)
            finally:
                self.engine_loop.close()
            atexit.unregister(self.shutdown_rollout)

    @property
    def _bucket_bytes(self) -> int:
        megabytes = self.config.rollout.checkpoint_engine.update_weights_bucket_megabytes
        return int(float(megabytes) * (1 << 20))

    def _weights_for_rollout(self):
        """The actor's weights as the rollout engine takes them: merged, or (LoRA adapter mode) the base
        weights until one sync has succeeded, then the adapter alone."""
        if self.lora is not None and rollout_gets_adapter(self.model_config, self.config.rollout.name):
            return self.actor_engine.iter_adapter_params(with_base=not self._rollout_has_base)
        return self.actor_engine.iter_full_params()

    # ---------------------------------------------------------------------- hybrid engine (colocated)
    def _sync_rollout_weights(self, version: int | None = None) -> dict:
        """Stream the colocated actor's weights into this process's engine, bucket by bucket. Every
        rank takes part: gathering a sharded parameter is a collective."""
        if not (self._is_actor and self._is_rollout and self._rollout_stale):
            return {"timing_s/update_weights": 0.0}
        start = time.perf_counter()
        n_tensors = n_bytes = 0
        for bucket in buckets(self._weights_for_rollout(), self._bucket_bytes):
            n_tensors += self.engine_loop.run(self.server.load_weights(bucket))
            n_bytes += sum(t.numel() * t.element_size() for _, t in bucket)
            del bucket
        self.engine_loop.run(self.server.finish_weight_update())
        self._rollout_stale = False
        self._rollout_has_base = True
        self.weight_version = self.weight_version + 1 if version is None else int(version)
        return {
            "timing_s/update_weights": time.perf_counter() - start,
            "rollout/weight_sync_mb": n_bytes / (1 << 20),
            "rollout/weight_sync_tensors": n_tensors,
        }

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def prepare_rollout(self, version: int | None = None) -> dict:
        """Training -> generation: wake the engine and push the new weights (veRL's wake_up + update)."""
        if not self._is_rollout:
            return {}
        self.engine_loop.run(self.server.wake_up())
        return self._sync_rollout_weights(version)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def release_rollout(self) -> None:
        """Generation -> training: let the engine free its memory (veRL's free_cache_engine)."""
        if self._is_rollout:
            self.engine_loop.run(self.server.sleep())

    # ---------------------------------------------------------------------- requests
    def server_generate(self, prompt_ids, params, request_id: str, logprobs: bool = True):
        """One request to this process's engine (called per trajectory turn by agent loop workers)."""
        version = self.weight_version
        out = self.engine_loop.run(self.server.generate(prompt_ids, params, request_id, logprobs))
        out.extra["weight_version"] = version
        return out

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def abort_rollout(self) -> int:
        """Stop every request in flight on this engine; each returns the tokens it has (partial rollouts)."""
        return self.engine_loop.run(self.server.abort_all()) if self._is_rollout else 0

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def generate_sequences(self, prompts: DataProto) -> DataProto:
        """A batch through the agent loop on this rank's own engine (veRL's worker-level API; the trainer
        goes through AgentLoopManager, which spreads trajectories over every rank's engine). Loops that
        template chats use ``meta_info["apply_chat_template_kwargs"]`` (the caller's
        ``data.apply_chat_template_kwargs``; main_generation passes them)."""
        if not self._is_rollout:
            raise RuntimeError(f"generate_sequences needs the rollout; this worker's role is {self.role!r}")
        prepared = self.prepare_rollout()
        start = time.perf_counter()
        worker = AgentLoopWorker(
            self.agent_settings, [LocalServerHandle(self)], self.tokenizer, self.tokenizer.pad_token_id
        )
        # every rank gets the caller's meta_info; this slice's samples start rank x rows after the
        # caller's offset (the seeds of its requests). The offset names the request, not the result:
        # outputs keep the caller's meta_info without it, so the ranks' outputs concatenate.
        caller_meta = {k: v for k, v in prompts.meta_info.items() if k != "sample_offset"}
        offset = int(prompts.meta_info.get("sample_offset", 0)) + self.rank * len(prompts)
        request = DataProto(
            batch=prompts.batch,
            non_tensor_batch=prompts.non_tensor_batch,
            meta_info={**caller_meta, "sample_offset": offset},
        )
        try:
            output = self.engine_loop.run(worker.generate_sequences(request))
        finally:
            self.release_rollout()
        metrics = output.meta_info.pop("metrics", {})
        output.meta_info = caller_meta
        output.meta_info["metrics"] = {
            **metrics,
            "timing_s/update_weights": [prepared["timing_s/update_weights"]],
            "timing_s/generate_sequences": [time.perf_counter() - start],
        }
        return output

    # ---------------------------------------------------------------------- weights from another process
    def receive_weights(self, bucket) -> int:
        """One bucket of a weight update sent by the trainer's group (``send_weights``)."""
        return self.engine_loop.run(self.server.load_weights(bucket))

    def finish_weight_sync(self, version: int) -> int:
        self.engine_loop.run(self.server.finish_weight_update())
        self.weight_version = int(version)
        return self.weight_version

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def send_weights(self, targets: list[WeightTarget], version: int, timeout_s: float = 600.0) -> dict:
        """Trainer side: push the actor's full weights to the rollout workers ``targets`` as ``version``.
        Every rank walks the parameters (sharded ones are gathered); rank 0 sends."""
        if not self._is_actor:
            raise RuntimeError(f"send_weights needs the actor; this worker's role is {self.role!r}")
        metrics = push_weights(
            self._weights_for_rollout(), targets, version, self._bucket_bytes, timeout_s=timeout_s, send=self.rank == 0
        )
        self._rollout_has_base = True
        return metrics
