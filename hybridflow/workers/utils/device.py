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
