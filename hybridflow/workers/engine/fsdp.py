"""The training engine: one model, wrapped for data-parallel training over torch.distributed.

Strategies: ``fsdp``/``fsdp2`` shard parameters with FSDP2 (``fully_shard``) per decoder layer and at
the root; ``ddp`` replicates with DistributedDataParallel; with one rank the module is used as is
(sharding over one rank is the identity and only costs time) unless CPU offload is asked for, which
then runs on a one-rank mesh. Mixed precision on one rank needs no mesh: ``precision.ComputeWeights``.
Works with gloo on CPU and nccl on CUDA.

Memory levers (veRL's keys):
- ``enable_gradient_checkpointing``: recompute each decoder layer's activations in backward;
  ``enable_activation_offload`` (CUDA) also keeps the checkpointed layer inputs in host memory.
- ``fsdp_config.param_offload`` / ``optimizer_offload`` / ``offload_policy`` (CUDA): FSDP2's
  ``CPUOffloadPolicy``: parameters, gradients and optimizer state live in host memory, layers are
  copied to the GPU for their forward/backward and the optimizer steps on the CPU. On CPU they are
  accepted and do nothing (everything is already in host memory; config checks say so).
- ``fsdp_config.fsdp_size`` (as veRL): hybrid sharding (HSDP). Each group of ``fsdp_size`` ranks shards
  the parameters among itself and the groups replicate one another (gradients are reduce-scattered in
  a group, then all-reduced across groups); -1 or the world size or more: one group, the whole world.
  Data parallelism is unchanged: every rank still trains on its own share of the batch.
- ``fsdp_config.mixed_precision`` (CUDA): FSDP2 ``MixedPrecisionPolicy``: sharded fp32 master
  weights, compute in ``param_dtype`` ("auto": bf16 where supported), gradients reduced in
  ``reduce_dtype`` (fp32). On one rank the same numbers come from ``ComputeWeights`` (the engine's
  ``precision``: callers compute inside ``precision.active()``), a frozen model stores ``param_dtype``.
  On CPU an explicit bf16/fp16 ``param_dtype`` runs the forward under ``torch.autocast`` (fp32 master
  weights and gradients; matmuls in bf16, which CPUs with AMX or AVX512-BF16 run several times faster
  than fp32); ``auto`` keeps fp32 there.
- LoRA (``model.lora_rank > 0``, see ``lora.py``): only adapters train; the rollout gets merged weights
  (``iter_full_params``) or base weights once + the adapter at every sync (``iter_adapter_params``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from hybridflow.config.engine import FSDPEngineConfig, MixedPrecisionConfig, fsdp_size_problem
from hybridflow.config.optimizer import FSDPOptimizerConfig
from hybridflow.workers.engine.lora import (
    LoraSpec,
    apply_lora,
    is_adapter_tensor,
    lora_scaling,
    merge_lora_stream,
    merge_lora_weights,
    peft_model_of,
    split_lora_stream,
)
from hybridflow.workers.engine.optim import build_lr_scheduler, build_optimizer
from hybridflow.workers.engine.precision import ComputeWeights, cast_parameters

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class EngineSpec:
    strategy: str = "fsdp"
    device: str = "cpu"
    param_dtype: torch.dtype | None = None  # mixed precision (CUDA): the compute dtype over float32 masters
    autocast_dtype: torch.dtype | None = None  # CPU mixed precision: the forward's autocast dtype
    reduce_dtype: torch.dtype | None = None
    reshard_after_forward: bool = True
    param_offload: bool = False  # FSDP2 CPUOffloadPolicy (params, grads and optimizer state on the host)
    gradient_checkpointing: bool = False
    activation_offload: bool = False  # checkpointed activations kept in pinned host memory (CUDA)
    lora: LoraSpec | None = None
    fsdp_size: int = -1  # ranks per sharding group (HSDP); -1: the whole world

    @property
    def needs_fsdp(self) -> bool:
        """A CUDA feature that only FSDP2 provides, so worth a one-rank mesh (CPU offload; mixed precision
        alone is ``ComputeWeights`` there)."""
        return self.param_offload


def wants_offload(engine: FSDPEngineConfig) -> bool:
    """veRL's three offload keys; FSDP2 offloads parameters, gradients and optimizer state together."""
    return bool(engine.param_offload or engine.optimizer_offload or engine.offload_policy)


def engine_spec(
    engine: FSDPEngineConfig,
    strategy: str,
    device: str,
    gradient_checkpointing: bool = False,
    lora: LoraSpec | None = None,
    activation_offload: bool = False,
) -> EngineSpec:
    """The spec of a role's engine section (``fsdp_config``; the critic's ``fsdp``) on ``device``:
    offload acts only on CUDA (config checks explain this on cpu); mixed precision is FSDP2's policy on
    CUDA and autocast on cpu, where only an explicit bf16/fp16 asks for it."""
    mp = engine.mixed_precision or MixedPrecisionConfig()  # unset: the default mixed precision (veRL's workers)
    param_dtype = _dtype(mp.param_dtype) if device == "cuda" and mp is not None else None
    cpu_dtype = _dtype(mp.param_dtype) if device == "cpu" and mp.param_dtype != "auto" else None
    reduce_dtype = _dtype(mp.reduce_dtype) if device == "cuda" and mp is not None else None
    if param_dtype is None and reduce_dtype == torch.float32:
        reduce_dtype = None  # nothing to mix: plain fp32 training
    return EngineSpec(
        strategy=strategy,
        device=device,
        param_dtype=param_dtype,
        autocast_dtype=cpu_dtype if cpu_dtype in (torch.bfloat16, torch.float16) else None,
        reduce_dtype=reduce_dtype,
        reshard_after_forward=bool(engine.reshard_after_forward),
        param_offload=wants_offload(engine) and device == "cuda",
        gradient_checkpointing=gradient_checkpointing,
        activation_offload=activation_offload and device == "cuda",
        lora=lora,
        fsdp_size=engine.fsdp_size,
    )


def fsdp_mesh_shape(world_size: int, fsdp_size: int) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """(mesh shape, dimension names) for ``fsdp_size``, veRL's rule: one sharding dimension over the
    world when ``fsdp_size`` is negative or not below the world size, else (replicas, shards)."""
    if problem := fsdp_size_problem(fsdp_size, world_size, "fsdp_config.fsdp_size"):
        raise ValueError(problem)
    if fsdp_size < 0 or fsdp_size >= world_size:
        return (world_size,), ("fsdp",)
    return (world_size // fsdp_size, fsdp_size), ("ddp", "fsdp")


def weights_dtype(engine: FSDPEngineConfig) -> torch.dtype:
    """The dtype a role's weights are loaded and kept in (``model_dtype``; fp32: float32 masters)."""
    return _dtype(engine.model_dtype) or torch.float32


def _dtype(name):
    if name in (None, "", "none"):
        return None
    if name == "auto":  # only asked on CUDA
        return torch.bfloat16 if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else None
    return {
        "bf16": torch.bfloat16,
        "bfloat16": torch.bfloat16,
        "fp16": torch.float16,
        "float16": torch.float16,
        "fp32": torch.float32,
        "float32": torch.float32,
    }[str(name)]


def _enable_activation_checkpointing(module: nn.Module, offload: bool = False) -> None:
    """Recompute each decoder layer in backward (non-reentrant: works with frozen inputs, e.g. LoRA).
    ``offload``: the layer inputs kept for the recompute go to pinned host memory."""
    kwargs = {"use_reentrant": False}
    if hasattr(module, "activation_checkpointing_enable"):  # transformers >= 5.20 name, offload built in
        module.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs, offload=offload)
    elif hasattr(module, "gradient_checkpointing_enable"):
        module.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
        if offload:
            _save_activations_on_host(module)
    else:
        logger.warning("enable_gradient_checkpointing=True but %s cannot checkpoint; ignored", type(module).__name__)


def _save_activations_on_host(module: nn.Module) -> None:
    """Tensors saved for backward during ``module``'s forward go to pinned host memory (older
    transformers have no offload switch of their own)."""
    contexts: list = []

    def enter(*_):
        ctx = torch.autograd.graph.save_on_cpu(pin_memory=True)
        ctx.__enter__()
        contexts.append(ctx)

    def leave(*_):
        contexts.pop().__exit__(None, None, None)

    module.register_forward_pre_hook(enter)
    module.register_forward_hook(leave)


def is_activation_checkpointing(module: nn.Module) -> bool:
    """Whether ``module`` recomputes its layers in backward (either transformers spelling)."""
    for name in ("is_activation_checkpointing", "is_gradient_checkpointing"):
        if hasattr(module, name):
            return bool(getattr(module, name))
    return False


def _layer_classes(module: nn.Module) -> set[type]:
    names = set(getattr(module, "_no_split_modules", None) or [])
    return {type(m) for m in module.modules() if type(m).__name__ in names}


def fully_shard_layers(module: nn.Module, **kwargs) -> nn.Module:
    """FSDP2 units per decoder layer (the model's ``_no_split_modules``) and at the root, each
    ``fully_shard(unit, **kwargs)``; returns ``module`` (sharded in place)."""
    from torch.distributed.fsdp import fully_shard

    layer_types = _layer_classes(module)
    for sub in module.modules():
        if type(sub) in layer_types:
            fully_shard(sub, **kwargs)
    return fully_shard(module, **kwargs)


def _has_float32_masters(module: nn.Module) -> bool:
    return any(p.dtype == torch.float32 for p in module.parameters())


class TrainEngine:
    """A model prepared for training on this rank, plus its optimizer and LR schedule."""

    def __init__(self, module: nn.Module, spec: EngineSpec, trainable: bool = True):
        self.spec = spec
        self.world_size = dist.get_world_size() if dist.is_initialized() else 1
        if (spec.gradient_checkpointing or spec.activation_offload) and trainable:
            _enable_activation_checkpointing(module, offload=spec.activation_offload)
        self.lora = spec.lora if trainable else None
        if self.lora is not None:
            module = apply_lora(module, self.lora)  # base weights frozen; adapters trainable
        self.sharded = spec.strategy in ("fsdp", "fsdp2") and (
            self.world_size > 1 or (spec.needs_fsdp and dist.is_initialized())
        )
        if spec.needs_fsdp and not self.sharded:
            logger.warning("CPU offload needs FSDP2 over torch.distributed (strategy=fsdp); training without it")
        if not (self.sharded and spec.param_offload):  # with CPUOffloadPolicy FSDP2 keeps params on the host
            module.to(spec.device)
        if spec.autocast_dtype is not None:  # an instance attribute: state_dict and names stay the model's
            module.forward = torch.autocast("cpu", dtype=spec.autocast_dtype)(module.forward)
        self.module = self._wrap(module)
        self.optimizer = None
        self.lr_scheduler = None
        if not trainable:
            for p in self.module.parameters():
                p.requires_grad_(False)
        # mixed precision where FSDP2 does not run it: the module unwrapped on one rank, over float32 masters
        # (weights loaded in half precision, model_dtype=bf16, are trained as they are, as veRL trains them)
        one_rank_dtype = spec.param_dtype if not self.sharded and self.world_size == 1 else None
        if trainable and one_rank_dtype is not None and not _has_float32_masters(self.module):
            one_rank_dtype = None
        if one_rank_dtype is not None and not trainable:
            cast_parameters(self.module, one_rank_dtype)  # nothing to update: no float32 masters to keep
        self.precision = ComputeWeights(self.module, one_rank_dtype if trainable else None)

    # ------------------------------------------------------------------------------------------
    def _wrap(self, module: nn.Module) -> nn.Module:
        strategy = self.spec.strategy
        if strategy in ("none", "single") or (self.world_size == 1 and not self.sharded):
            return module
        if strategy in ("fsdp", "fsdp2"):
            from torch.distributed.device_mesh import init_device_mesh
            from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy

            shape, names = fsdp_mesh_shape(self.world_size, self.spec.fsdp_size)
            # a 2-D mesh makes fully_shard replicate over the first dimension and shard over the second
            mesh = init_device_mesh(self.spec.device, shape, mesh_dim_names=names)
            kwargs = {
                "mesh": mesh,
                "reshard_after_forward": self.spec.reshard_after_forward,
                "mp_policy": MixedPrecisionPolicy(
                    param_dtype=self.spec.param_dtype, reduce_dtype=self.spec.reduce_dtype
                ),
                "offload_policy": CPUOffloadPolicy() if self.spec.param_offload else OffloadPolicy(),
            }
            return fully_shard_layers(module, **kwargs)
        if strategy == "ddp":
            from torch.nn.parallel import DistributedDataParallel as DDP

            return DDP(module)
        raise ValueError(f"unknown training strategy {strategy!r}; use fsdp, fsdp2, ddp or none")

    @property
    def unwrapped(self) -> nn.Module:
        return getattr(self.module, "module", self.module) if self.spec.strategy == "ddp" else self.module

    def place_params(self, place: Callable[[list[tuple[str, torch.Tensor]]], dict[str, torch.Tensor] | None]) -> bool:
        """Keep the parameters in memory that ``place`` gives (their values copied there, by name; None: none
        given), e.g. memory a rollout engine reads them from without a copy. Only a plain module on the CPU
        (no sharding, DDP or LoRA), whose parameters are whole tensors; returns whether they moved. The
        optimizer updates them in place, so they stay there."""
        params = list(self.module.named_parameters())
        if self.sharded or self.lora is not None or self.module is not self.unwrapped:
            return False
        if any(p.device.type != "cpu" for _, p in params):
            return False
        views = place([(name, p.detach()) for name, p in params])
        if views is None:
            return False
        for name, p in params:
            p.data = views[name]
        return True

    def setup_optimizer(self, optim_cfg: FSDPOptimizerConfig, total_steps: int):
        self.optimizer = build_optimizer(
            self.module.parameters(),
            lr=float(optim_cfg.lr),
            betas=optim_cfg.betas,
            weight_decay=float(optim_cfg.weight_decay),
            overrides=optim_cfg.override_optimizer_config,
        )
        self.lr_scheduler = build_lr_scheduler(self.optimizer, optim_cfg, total_steps)
        return self.optimizer, self.lr_scheduler

    # --- weights out of the training layout -----------------------------------------------------
    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """Full (unsharded) weights on every rank, under plain Hugging Face names: what the rollout
        engine loads. With LoRA the adapters are folded in (the training model is not touched)."""
        if self.sharded:
            from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

            sd = get_model_state_dict(self.module, options=StateDictOptions(full_state_dict=True, cpu_offload=False))
        else:
            sd = {k: v.detach() for k, v in self.unwrapped.state_dict().items()}
        if self.lora is not None:
            sd = merge_lora_weights(sd, lora_scaling(self.lora.alpha, self.lora.rank), self.lora.adapter_name)
        return sd

    def _full_tensors(self, keep: Callable[[str], bool] | None = None) -> Iterator[tuple[str, torch.Tensor]]:
        """This module's tensors under its own names, gathered when sharded; tied ones once. ``keep``
        filters by name before the gather (every rank filters alike, so the gathers stay in step)."""
        seen: set[int] = set()
        # keep_vars: tied names map to the same Parameter object on every rank, so all ranks skip
        # the same aliases and their gathers stay in step
        for name, tensor in self.unwrapped.state_dict(keep_vars=True).items():
            if id(tensor) in seen:
                continue  # a tied alias (lm_head = embed_tokens)
            seen.add(id(tensor))
            if keep is not None and not keep(name):
                continue
            full = tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor
            yield name, full.detach()

    def iter_full_params(self) -> Iterator[tuple[str, torch.Tensor]]:
        """The full weights one tensor at a time, under plain Hugging Face names (LoRA folded in).

        Sharded parameters are gathered one by one (a collective: every rank must consume the whole
        stream in the same order), so no rank ever holds the full state dict: this is what a weight
        sync streams into the rollout engine bucket by bucket. Tied tensors are given once.
        """
        if self.lora is None:
            yield from self._full_tensors()
        else:
            yield from merge_lora_stream(
                self._full_tensors(), lora_scaling(self.lora.alpha, self.lora.rank), self.lora.adapter_name
            )

    def iter_adapter_params(self, with_base: bool) -> Iterator[tuple[str, torch.Tensor]]:
        """LoRA, unmerged: the frozen base weights under plain Hugging Face names (``with_base``), then
        or among them the adapter's A/B matrices under peft's saved names. Without the base only the
        adapter is gathered: a sync then moves rank x (in + out) numbers per layer, not the model."""
        if self.lora is None:
            raise ValueError("iter_adapter_params needs a LoRA model (model.lora_rank > 0)")
        keep = None if with_base else is_adapter_tensor
        yield from split_lora_stream(self._full_tensors(keep), self.lora.adapter_name, with_base=with_base)

    @property
    def hf_model(self) -> nn.Module:
        """The Hugging Face model under the wrappers (DDP, peft): its config and ``save_pretrained`` write a
        plain model folder from a full state dict."""
        peft_model = peft_model_of(self.module)
        return peft_model.get_base_model() if peft_model is not None else self.unwrapped

    def adapter_state_dict(self) -> dict[str, torch.Tensor]:
        """The LoRA adapter's A/B matrices under peft's saved names, whole, on the host (a collective when
        sharded: every rank calls)."""
        return {name: t.detach().to("cpu", copy=True) for name, t in self.iter_adapter_params(with_base=False)}

    def save_adapter_config(self, directory: str) -> None:
        """Write peft's ``adapter_config.json`` (LoRA rank, alpha, targets) into ``directory``."""
        peft_model = peft_model_of(self.module)
        if peft_model is not None:
            peft_model.peft_config[self.lora.adapter_name].save_pretrained(directory)
