"""Moving a worker's input batch onto its device without touching the caller's object."""

from __future__ import annotations

from hybridflow.protocol import DataProto


def on_device(data: DataProto, device) -> DataProto:
    """A DataProto whose tensors live on ``device``; ``data`` itself is left where it is.

    ``DataProto.to`` moves in place (veRL's behaviour). With the in-process backend a worker receives
    the driver's own object, so moving it in place would leave the driver's batch on the GPU; the copy
    shares non-tensor arrays and meta_info, and costs nothing when the tensors are already there.
    """
    batch = data.batch.to(device) if data.batch is not None else None
    return DataProto(batch=batch, non_tensor_batch=data.non_tensor_batch, meta_info=data.meta_info)


_DTYPE_ALIASES = {"bf16": "bfloat16", "fp16": "float16", "half": "float16", "fp32": "float32", "float": "float32"}


def resolve_dtype(value: str, device: str) -> str:
    """A dtype name from the config -> a torch dtype name; ``auto`` is bfloat16 on cuda, float32 on cpu
    (bf16 matmuls are slow on most CPUs, and fp32 keeps rollout and trainer log-probs equal)."""
    name = str(value).lower()
    if name == "auto":
        return "bfloat16" if device == "cuda" else "float32"
    return _DTYPE_ALIASES.get(name, name)
