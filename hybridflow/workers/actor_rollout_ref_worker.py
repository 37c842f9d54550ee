"""ActorRolloutRefWorker: the policy in one process per device, in any of its roles.

Roles: actor (trains), rollout (generates), ref (frozen reference log-probs), and their fusions
actor_rollout / actor_rollout_ref. In the hybrid engine the same process trains the policy and
generates with it: after an update the trainer's weights are pushed into the rollout engine (a named,
timed step, ``timing_s/update_weights``) before the next generation.

Its parts are members built with explicit arguments (engines, ``actor`` / ``ref_policy``, ``rollout_host``,
``profiler``); the registered methods (bound by the WorkerGroup from this class) delegate to them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time

import torch

from hybridflow.config.convert import as_section
from hybridflow.config.ppo_trainer import ActorRolloutRefConfig
from hybridflow.protocol import DataProto
from hybridflow.single_controller.base import Dispatch, Worker, register
from hybridflow.single_controller.base.dispatch_fns import make_nd_compute_dataproto_dispatch_fn
from hybridflow.single_controller.base.worker import default_device_backend
from hybridflow.utils.determinism import apply_full_determinism
from hybridflow.workers.actor import DataParallelPPOActor
from hybridflow.workers.checkpoint import load_engine_checkpoint, save_engine_checkpoint
from hybridflow.workers.engine import TrainEngine, engine_spec, weights_dtype
from hybridflow.workers.engine.lora import adapters_disabled, lora_spec, rollout_gets_adapter
from hybridflow.workers.model_loading import (
    config_dir,
    import_external_lib,
    load_model,
    load_tokenizer,
    local_model_path,
    tokenizer_dir,
)
from hybridflow.workers.profiler import WorkerProfiler, merge_profilers
from hybridflow.workers.rollout.weight_transfer import WeightTarget, push_weights
from hybridflow.workers.rollout_host import RolloutHost, bucket_bytes
from hybridflow.workers.utils.device import on_device
from hybridflow.workers.utils.heap import trim_heap
from hybridflow.workers.utils.ulysses import build_layout
from hybridflow.workers.utils.ulysses_attention import use_ulysses_attention
from hybridflow.workers.utils.weight_swap import parameters_at_rest, swapped_weights

# a role names the parts it combines; actor_ref: the trainer pool's worker when the rollout has a pool
# of its own (asynchronous modes)
ROLES = ("actor", "rollout", "ref", "actor_ref", "actor_rollout", "actor_rollout_ref")


def log_prob_micro_batch_size(section, dp_size: int) -> int | None:
    """Per-rank micro-batch of a log-prob pass (the rollout's or the ref's section)."""
    per_gpu = section.log_prob_micro_batch_size_per_gpu
    if per_gpu:
        return int(per_gpu)
    total = section.log_prob_micro_batch_size
    return max(1, int(total) // dp_size) if total else None


class ActorRolloutRefWorker(Worker):
    """``config`` is the typed ``actor_rollout_ref`` section (veRL's DictConfig or a dict is read into
    ``ActorRolloutRefConfig`` here, the door); ``role`` one of ROLES. The rollout engine (a server, its
    weight loading, its generation endpoints) is the ``rollout_host`` member's."""

    def __init__(self, config, role: str):
        super().__init__()
        if role not in ROLES:
            raise ValueError(f"role must be one of {ROLES}, got {role!r}")
        self.config = as_section(config, ActorRolloutRefConfig, "actor_rollout_ref")
        self.role = role
        parts = role.split("_")  # the roles it combines
        self._is_actor, self._is_rollout, self._is_ref = ("actor" in parts, "rollout" in parts, "ref" in parts)
        # before the process group and any CUDA handle: NCCL and cuBLAS read their switches at creation
        apply_full_determinism(
            [
                section.fsdp_config
                for section, on in ((self.config.actor, self._is_actor), (self.config.ref, self._is_ref))
                if on
            ]
            + ([self.config.rollout] if self._is_rollout else [])  # its seed when only the rollout asks
        )
        self.init_process_group(timeout_s=float(self.config.nccl_timeout))  # the first role's group is the process's
        self.device, _ = default_device_backend()
        trains = self._is_actor or self._is_ref  # a rollout-only worker (main_generation) gets model + rollout
        self.model_config = self.config.model
        self.lora = lora_spec(self.model_config) if trains else None
        self._build_typed_sections(trains)
        self._build_layouts()
        self.dp_size = self.actor_layout.dp_size  # the actor's data-parallel size (world / its SP size)
        if self._is_actor:  # veRL's normalisation: mini/micro-batch sizes in samples on one rank
            self.actor_config = self.actor_config.per_rank(self.dp_size, rollout_n=self.config.rollout.n)
        # LoRA: the reference policy is the actor's base model (adapters off), not a second copy
        self._ref_in_actor = self._is_ref and self._is_actor and self.lora is not None
        self.rollout_host: RolloutHost | None = None  # built by init_model (rollout roles)
        # the rollout engine lags the actor's weights: pushed at the next prepare_rollout (colocated)
        self._rollout_stale = False
        self._rollout_has_base = False  # LoRA adapter sync: the first one carries the base weights too
        self._pi_old: list[torch.Tensor] | None = None  # V1 separate_async: the weights of the cycle's π_old
        sections = [getattr(self.config, p).profiler for p in parts]
        self.profiler = WorkerProfiler(merge_profilers(sections), self.rank, role)

    def _require(self, part: str, method: str) -> None:
        """The one role guard: ``method`` runs only on a worker whose role includes ``part``."""
        if part not in self.role.split("_"):
            raise RuntimeError(f"{method} needs the {part} role; this worker's role is {self.role!r}")

    def _build_typed_sections(self, trains: bool) -> None:
        """The typed actor and ref sections, built once (the reference policy runs the actor's class on
        the actor's section). use_remove_padding is actor_rollout_ref.model's, as veRL copies it in."""
        self.actor_config = self.ref_config = None
        if trains:
            use_remove_padding = bool(self.config.model.use_remove_padding)
            self.actor_config = dataclasses.replace(self.config.actor, use_remove_padding=use_remove_padding)
        if self._is_ref:
            self.ref_config = self.config.ref

    def _build_layouts(self) -> None:
        """The dp x sp rank layout of the actor and of the reference policy (Ulysses sequence
        parallelism; one group when both use the same size), and the mesh-aware dispatch info: the
        ranks of an SP group get the same data and only the group's first rank answers."""
        sizes = {
            "actor": self.actor_config.sp_size if self._is_actor else 1,
            "ref": self.ref_config.sp_size if self._is_ref else 1,
        }
        if self._is_actor and self._is_ref and self.lora is not None and sizes["actor"] != sizes["ref"]:
            raise ValueError(
                f"actor_rollout_ref.ref.ulysses_sequence_parallel_size ({sizes['ref']}) must equal the "
                f"actor's ({sizes['actor']}) with LoRA: the reference policy runs on the actor's model"
            )
        layouts = {}
        for role, size in sizes.items():
            key = f"actor_rollout_ref.{role}.ulysses_sequence_parallel_size"
            if size not in layouts:
                layouts[size] = build_layout(size, key)
            setattr(self, f"{role}_layout", layouts[size])
            self._register_dispatch_collect_info(
                role, dp_rank=layouts[size].dp_rank, is_collect=layouts[size].is_collect
            )

    # ----------------------------------------------------------------------------------------------
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self):
        model_cfg = self.config.model
        import_external_lib(model_cfg.external_lib)
        path = local_model_path(model_cfg.path, "actor_rollout_ref.model.path")
        trust = bool(model_cfg.trust_remote_code)
        tokenizer_path = tokenizer_dir(model_cfg.tokenizer_path, path, "actor_rollout_ref.model.tokenizer_path")
        self.tokenizer = load_tokenizer(tokenizer_path, trust, chat_template=model_cfg.custom_chat_template)
        override = model_cfg.override_config
        config_path = config_dir(model_cfg.hf_config_path, "actor_rollout_ref.model.hf_config_path")
        torch.manual_seed(0)

        if self._is_actor:
            dtype = weights_dtype(self.actor_config.fsdp_config)  # fsdp_config.model_dtype
            module = load_model(
                path, "causal_lm", dtype, override_config=override, trust_remote_code=trust, config_path=config_path
            )
            self.hf_config = module.config
            self._use_sp_attention(module, "actor")
            spec = engine_spec(
                self.actor_config.fsdp_config,
                self.actor_config.strategy,
                self.device,
                bool(model_cfg.enable_gradient_checkpointing),
                lora=self.lora,
                activation_offload=bool(model_cfg.enable_activation_offload),
            )
            self.actor_engine = TrainEngine(module, spec)
            optim = self.actor_config.optim
            total = max(1, int(optim.total_training_steps))  # -1 until main_ppo fills it in
            self.actor_engine.setup_optimizer(optim, total)
            self.actor = DataParallelPPOActor(
                self.actor_config,
                self.actor_engine.module,
                self.actor_engine.optimizer,
                self.actor_engine.lr_scheduler,
                dp_group=self.actor_layout.dp_group,
                sp=self.actor_layout.sp,
                precision=self.actor_engine.precision,
            )
            self.actor.update_loop.after_mini_batch = self.profiler.mini_batch_done  # a profiler schedule's steps
        if self._ref_in_actor:
            self.ref_policy = DataParallelPPOActor(
                self.actor_config,
                self.actor_engine.module,  # run with adapters off
                dp_group=self.ref_layout.dp_group,
                sp=self.ref_layout.sp,
                precision=self.actor_engine.precision,
            )
        elif self._is_ref:
            dtype = weights_dtype(self.ref_config.fsdp_config)
            ref_module = load_model(
                path, "causal_lm", dtype, override_config=override, trust_remote_code=trust, config_path=config_path
            )
            self._use_sp_attention(ref_module, "ref")
            ref_spec = engine_spec(self.ref_config.fsdp_config, self.ref_config.strategy, self.device)
            self.ref_engine = TrainEngine(ref_module, ref_spec, trainable=False)
            self.ref_policy = DataParallelPPOActor(
                self.actor_config, self.ref_engine.module, dp_group=self.ref_layout.dp_group, sp=self.ref_layout.sp
            )
        if self._is_rollout:
            adapter = rollout_gets_adapter(self.model_config, self.config.rollout.name)
            self.rollout_host = RolloutHost(
                self.config.rollout,
                path,
                self.tokenizer,
                self.device,
                self.rank,
                trust,
                override_config=override,
                config_path=config_path,  # the hf engine's copy; vLLM reads model.path's config (as veRL's)
                adapter=lora_spec(self.model_config) if adapter else None,  # a saved adapter's own rank/alpha
            )
            # the first generation uses the trainer's weights, whatever the engine loaded (dummy formats,
            # a checkpoint restored into the actor): pushed in prepare_rollout like after every update
            self._rollout_stale = self._is_actor
            if self._is_actor:  # where the engine can read the actor's parameters in place, keep them there
                self.actor_engine.place_params(self.rollout_host.share_weights)

    def _use_sp_attention(self, module, role: str) -> None:
        layout = getattr(self, f"{role}_layout")
        if layout.sp is not None:
            use_ulysses_attention(module, layout.sp_size, f"actor_rollout_ref.{role}.ulysses_sequence_parallel_size")

    def _log_prob_meta(self, data: DataProto, section, dp_size: int | None = None) -> dict:
        """``dp_size``: the data-parallel size of the role that runs the pass (default: the actor's)."""
        return {
            "micro_batch_size": log_prob_micro_batch_size(section, dp_size or self.dp_size) or len(data),
            "use_dynamic_bsz": bool(section.log_prob_use_dynamic_bsz),
            "max_token_len": int(section.log_prob_max_token_len_per_gpu),
            "temperature": float(self.config.rollout.temperature),
        }

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn("actor"))
    def compute_log_prob(self, data: DataProto) -> DataProto:
        self._require("actor", "compute_log_prob")
        start = time.perf_counter()
        meta = self._log_prob_meta(data, self.config.rollout, self.actor_layout.dp_size)
        meta.update({k: v for k, v in data.meta_info.items() if k == "temperature"})
        data.meta_info.update(meta)
        # actor.calculate_sum_pi_squared: sum_v pi_v^2 per token, for the optimal-token-baseline estimators
        with_sum_pi_squared = self.actor_config.calculate_sum_pi_squared
        snapshot = data.meta_info.get("pi_old_snapshot")  # V1 separate_async: one π_old per sync cycle
        if snapshot == "save":
            self._pi_old = [p.detach().clone() for p in parameters_at_rest(self.actor_engine.module)]
        elif snapshot == "use" and self._pi_old is None:
            raise RuntimeError("pi_old_snapshot='use' before any 'save': the cycle's first mini-batch saves pi_old")
        with (
            self.profiler.stage("compute_log_prob"),
            swapped_weights(self.actor_engine.module, self._pi_old if snapshot == "use" else None),
        ):
            log_probs, entropys, *sum_pi_squared = self.actor.compute_log_prob(
                on_device(data, self.device), calculate_entropy=True, calculate_sum_pi_squared=with_sum_pi_squared
            )
        tensors = {"old_log_probs": log_probs.cpu(), "entropys": entropys.cpu()}
        if with_sum_pi_squared:
            tensors["sum_pi_squared"] = sum_pi_squared[0].float().cpu()
        return DataProto.from_dict(
            tensors=tensors, meta_info={"metrics": {"timing_s/worker_old_log_prob": [time.perf_counter() - start]}}
        )

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn("ref"))
    def compute_ref_log_prob(self, data: DataProto) -> DataProto:
        self._require("ref", "compute_ref_log_prob")
        start = time.perf_counter()
        data.meta_info.update(self._log_prob_meta(data, self.ref_config, self.ref_layout.dp_size))
        with (
            self.profiler.stage("compute_ref_log_prob"),
            adapters_disabled(self.actor_engine.module) if self._ref_in_actor else contextlib.nullcontext(),
        ):
            log_probs, _ = self.ref_policy.compute_log_prob(on_device(data, self.device), calculate_entropy=False)
        return DataProto.from_dict(
            tensors={"ref_log_prob": log_probs.cpu()},
            meta_info={"metrics": {"timing_s/worker_ref": [time.perf_counter() - start]}},
        )

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn("actor"))
    def update_actor(self, data: DataProto) -> DataProto:
        self._require("actor", "update_actor")
        start = time.perf_counter()
        data.meta_info.setdefault("temperature", float(self.config.rollout.temperature))
        with self.profiler.stage("update_actor"):
            metrics = self.actor.update_policy(on_device(data, self.device))
        lr = self.actor_engine.lr_scheduler.get_last_lr()[0]
        self.actor_engine.lr_scheduler.step()
        self._rollout_stale = True
        metrics["actor/lr"] = [lr]
        trim_heap()  # the update's freed activations and gradients: back to the OS, not kept by malloc
        metrics["timing_s/worker_update_actor"] = [time.perf_counter() - start]  # the trim is the worker's work too
        return DataProto(meta_info={"metrics": metrics})

    # ----------------------------------------------------------------------------------------------
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def save_checkpoint(self, local_path: str, global_step: int = 0, max_ckpt_to_keep=None, extra_state=None):
        save_engine_checkpoint(
            self.actor_engine, local_path, hf_config=self.hf_config, tokenizer=self.tokenizer, extra_state=extra_state
        )
        if self.lora is not None and self.rank == 0:  # the merger folds the adapters in with it
            self.actor_engine.save_adapter_config(os.path.join(local_path, "huggingface"))

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def load_checkpoint(self, local_path: str, del_local_after_load: bool = False):
        extra = load_engine_checkpoint(self.actor_engine, local_path)
        self._rollout_stale = True
        return extra

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def parameter_checksum(self) -> float:
        """Sum of |params| of the full actor weights (tests and sanity checks: did training move them?)."""
        sd = self.actor_engine.full_state_dict()
        return float(sum(v.double().abs().sum() for v in sd.values()))

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def start_profile(self, profile_step: int) -> bool:
        return self.profiler.start(profile_step)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def stop_profile(self) -> list[str]:
        return self.profiler.stop()

    # ---------------------------------------------------------------------- the rollout engine
    def _weights_for_rollout(self):
        """The actor's weights as the rollout engine takes them: merged, or (LoRA adapter mode) the base
        weights until one sync has succeeded, then the adapter alone."""
        if self.lora is not None and rollout_gets_adapter(self.model_config, self.config.rollout.name):
            return self.actor_engine.iter_adapter_params(with_base=not self._rollout_has_base)
        return self.actor_engine.iter_full_params()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def prepare_rollout(self, version: int | None = None) -> dict:
        """Training -> generation: wake the engine and, colocated, stream the actor's new weights into it
        bucket by bucket (veRL's wake_up + update). Every rank takes part: gathering a sharded parameter
        is a collective."""
        if self.rollout_host is None:
            return {}
        self.profiler.open_stage("generate")  # ends at release_rollout (or the profiled span's end)
        self.rollout_host.wake_up()
        if not (self._is_actor and self._rollout_stale):
            return {"timing_s/update_weights": 0.0}
        metrics = self.rollout_host.load_weights(self._weights_for_rollout(), version)
        self._rollout_stale = False
        self._rollout_has_base = True
        return metrics

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def release_rollout(self) -> None:
        """Generation -> training: let the engine free its memory (veRL's free_cache_engine)."""
        if self.rollout_host is not None:
            self.rollout_host.sleep()
        trim_heap()  # the generation's freed buffers, likewise
        self.profiler.close_stage()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def shutdown_rollout(self) -> None:
        if self.rollout_host is not None:
            self.rollout_host.shutdown()

    def release_engines(self) -> None:
        self.shutdown_rollout()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def abort_rollout(self) -> int:
        return self.rollout_host.abort() if self.rollout_host is not None else 0

    async def server_generate(self, prompt_ids, params, request_id: str, logprobs: bool = True):  # remote handles'
        return await self.rollout_host.generate(prompt_ids, params, request_id, logprobs)

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def generate_sequences(self, prompts: DataProto) -> DataProto:
        """A batch through the agent loop on this rank's own engine (veRL's worker-level API; the trainer
        goes through AgentLoopManager, which spreads trajectories over every rank's engine)."""
        self._require("rollout", "generate_sequences")
        prepared = self.prepare_rollout()
        start = time.perf_counter()
        try:
            output = self.rollout_host.generate_sequences(prompts)
        finally:
            self.release_rollout()
        output.meta_info["metrics"] = {
            **output.meta_info["metrics"],
            "timing_s/update_weights": [prepared["timing_s/update_weights"]],
            "timing_s/generate_sequences": [time.perf_counter() - start],
        }
        return output

    # ---------------------------------------------------------------------- weights from another process
    def receive_weights(self, bucket) -> int:
        return self.rollout_host.receive_weights(bucket)

    def finish_weight_sync(self, version: int) -> int:
        return self.rollout_host.finish_weight_sync(version)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def send_weights(self, targets: list[WeightTarget], version: int, timeout_s: float = 600.0) -> dict:
        """Trainer side: push the actor's full weights to the rollout workers ``targets`` as ``version``.
        Every rank walks the parameters (sharded ones are gathered); rank 0 sends."""
        self._require("actor", "send_weights")
        weights, size = self._weights_for_rollout(), bucket_bytes(self.config.rollout)
        metrics = push_weights(weights, targets, version, size, timeout_s=timeout_s, send=self.rank == 0)
        self._rollout_has_base = True
        return metrics
