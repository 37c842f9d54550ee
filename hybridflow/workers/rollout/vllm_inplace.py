"""A weight update of vLLM's CPU model without its layerwise reload: each new value goes where it lives.

The layerwise reload (``vllm_weights``) is the general path: it rebuilds each layer's parameters, copies
the incoming tensors into them, re-packs the linear weights for the CPU kernels and copies the result
back; py-spy put 34% of an update in those copies and 43% in the re-pack. An update needs less. A
linear layer on CPU keeps its weight only in the kernel's packed copy (vLLM drops the torch tensor), so
its new weight is packed straight from the received bytes: a fused q/k/v or gate/up weight is a view
over its pieces when they arrive side by side in that order (as a model's state dict lists them), else
one concatenation. Weights vLLM keeps as tensors (embeddings, norms, biases) are written in place by
vLLM's own loaders; an LM head is re-packed from its new weight. An embedding whose weight an LM head
shares (tied) is not packed again: its own kernel was never the one producing logits, and plain
``F.linear`` over the new weight keeps it right.

Used only where this is known to be right (``supported``): CPU, one rank, no quantization, no LoRA,
and fused layers of the two classes whose layout this reads (q/k/v, merged gate/up).
"""

from __future__ import annotations

import torch


def _linear_classes():
    from vllm.model_executor.layers import linear

    return linear


def _packed_linears(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The linear layers whose weight lives only in the CPU kernel's packed copy (torch tensor dropped)."""
    linear = _linear_classes()
    return [
        m
        for m in model.modules()
        if isinstance(getattr(m, "quant_method", None), linear.UnquantizedLinearMethod)
        and getattr(m, "weight", None) is not None
        and m.weight.numel() == 0
    ]


def supported(model: torch.nn.Module, vllm_config) -> bool:
    from vllm.platforms import current_platform

    linear = _linear_classes()
    plain = (linear.QKVParallelLinear, linear.MergedColumnParallelLinear, linear.RowParallelLinear)
    plain += (linear.ColumnParallelLinear, linear.ReplicatedLinear)
    return (
        current_platform.is_cpu()
        and vllm_config.lora_config is None
        and vllm_config.model_config.quantization is None
        and vllm_config.parallel_config.world_size == 1
        and all(type(m) in plain for m in _packed_linears(model))
    )


def _rows_before(layer: torch.nn.Module, shard_id) -> int:
    """Where a fused layer's shard starts in its weight (rows; one rank)."""
    linear = _linear_classes()
    if shard_id is None:
        return 0
    if type(layer) is linear.QKVParallelLinear:
        return layer._get_shard_offset_mapping(shard_id)
    if type(layer) is linear.MergedColumnParallelLinear:
        return sum(layer.output_sizes[:shard_id])
    raise ValueError(
        f"{getattr(layer, 'prefix', type(layer).__name__)}: shard {shard_id!r} of a layer that is not fused"
    )


def _covered(layer: torch.nn.Module, shards: dict) -> bool:
    """Whether the shards (shard id -> tensor) make the layer's whole (out, in) weight, each in its place."""
    rows = 0
    for shard_id, piece in sorted(shards.items(), key=lambda kv: _rows_before(layer, kv[0])):
        if (
            _rows_before(layer, shard_id) != rows
            or piece.dim() != 2
            or piece.shape[1] != layer.input_size_per_partition
        ):
            return False
        rows += piece.shape[0]
    return rows == layer.output_size_per_partition


def fused_weight(layer: torch.nn.Module, shards: dict) -> torch.Tensor:
    """A layer's full (out, in) weight from its shards (shard id -> tensor): a view where the pieces lie
    side by side in memory, else their concatenation. Raises unless they cover the weight exactly."""
    if not _covered(layer, shards):
        given = {k: tuple(v.shape) for k, v in shards.items()}
        shape = (layer.output_size_per_partition, layer.input_size_per_partition)
        raise ValueError(
            f"weight update for {getattr(layer, 'prefix', type(layer).__name__)}: shards {given} do not make its "
            f"{shape} weight (an update of a fused layer must carry all its pieces)"
        )
    pieces = [p for _, p in sorted(shards.items(), key=lambda kv: _rows_before(layer, kv[0]))]
    side_by_side = all(p.is_contiguous() for p in pieces) and all(
        a.data_ptr() + a.nbytes == b.data_ptr() and a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
        for a, b in zip(pieces, pieces[1:])
    )
    if not side_by_side:
        return torch.cat(pieces)
    return pieces[0].as_strided(
        (layer.output_size_per_partition, layer.input_size_per_partition), (pieces[0].shape[1], 1)
    )


class InPlaceUpdate:
    """One update: ``__init__`` puts recording loaders on the model, ``model.load_weights`` runs through
    them, ``next_bucket`` packs the layers a bucket completed, ``finish`` the rest and the LM head, and puts
    vLLM's loaders back."""

    def __init__(self, model: torch.nn.Module):
        from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead, UnquantizedEmbeddingMethod

        linear = _linear_classes()
        self.shards: dict[torch.nn.Module, dict] = {}  # packed linear layer -> shard id -> received tensor
        self.written: dict[int, tuple] = {}  # id(kept weight) -> what was last copied into it (bucket, bytes)
        self.bucket = 0
        self.restore: list[tuple[torch.Tensor, object]] = []  # (tensor, its loader; None: it had none)
        for layer in _packed_linears(model):
            self._set_loader(layer.weight, self._recorder(layer))
        # layers that keep their weight as a tensor and pack a kernel from it: the owners of each weight
        self.owners: dict[int, list[torch.nn.Module]] = {}
        kept = (linear.UnquantizedLinearMethod, UnquantizedEmbeddingMethod)
        for layer in model.modules():
            weight = getattr(layer, "weight", None)
            if isinstance(getattr(layer, "quant_method", None), kept) and weight is not None and weight.numel():
                self.owners.setdefault(id(weight), []).append(layer)
        for layers in self.owners.values():
            self._set_loader(layers[0].weight, self._writer(layers[0].weight))
        self.lm_head_class = ParallelLMHead

    def _set_loader(self, tensor: torch.Tensor, loader) -> None:
        self.restore.append((tensor, getattr(tensor, "weight_loader", None)))
        tensor.weight_loader = loader

    def _recorder(self, layer):
        def record(param, loaded_weight, loaded_shard_id=None):
            self.shards.setdefault(layer, {})[loaded_shard_id] = loaded_weight

        return record

    def _writer(self, weight: torch.Tensor):
        from vllm.model_executor.model_loader.weight_utils import default_weight_loader

        original = getattr(weight, "weight_loader", default_weight_loader)

        def write(param, loaded_weight, *args):
            seen = (self.bucket, loaded_weight.data_ptr(), tuple(loaded_weight.shape), args)
            if self.written.get(id(param)) != seen:  # tied names: the same bytes once
                original(param, loaded_weight, *args)
                self.written[id(param)] = seen

        return write

    def next_bucket(self) -> None:
        """After each bucket: pack the layers it completed, so a bucket's bytes are not held to the end (a
        layer split across buckets waits for its last piece)."""
        self.bucket += 1
        for layer in [m for m, shards in self.shards.items() if _covered(m, shards)]:
            self._pack(layer, self.shards.pop(layer))

    def _pack(self, layer: torch.nn.Module, shards: dict) -> None:
        weight = fused_weight(layer, shards).to(layer.weight.dtype)  # vLLM's loaders convert too
        layer.weight = torch.nn.Parameter(weight, requires_grad=False)
        layer.quant_method.process_weights_after_loading(layer)  # packs, drops the tensor
        if layer.weight.numel():  # the kernel kept the tensor: it must not be the sender's buffer
            layer.weight = torch.nn.Parameter(layer.weight.detach().clone(), requires_grad=False)

    def finish(self) -> None:
        """Pack every layer that received a new weight; vLLM's loaders are back either way."""
        try:
            for layer, shards in self.shards.items():
                self._pack(layer, shards)
            for weight_id in self.written:
                layers = self.owners[weight_id]
                heads = [m for m in layers if isinstance(m, self.lm_head_class)] if len(layers) > 1 else layers
                for layer in layers:
                    if layer in heads:
                        layer.quant_method.process_weights_after_loading(layer)
                    else:
                        layer.cpu_linear = torch.nn.functional.linear
        finally:
            for tensor, loader in self.restore:
                if loader is None:
                    del tensor.weight_loader
                else:
                    tensor.weight_loader = loader
