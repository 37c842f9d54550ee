import numpy as np
import torch

from hybridflow.protocol import DataProto
from hybridflow.workers.utils.device import on_device


def test_on_device_moves_a_copy_and_leaves_the_callers_batch_alone():
    # the in-process backend hands a worker the driver's own object: moving it in place would leave
    # the driver holding GPU tensors. "meta" stands in for a GPU here (no data, a different device).
    data = DataProto.from_dict(
        tensors={"input_ids": torch.arange(6).view(2, 3)},
        non_tensors={"uid": np.array(["a", "b"], dtype=object)},
        meta_info={"temperature": 0.7},
    )
    moved = on_device(data, "meta")
    assert moved.batch["input_ids"].device.type == "meta"
    assert data.batch["input_ids"].device.type == "cpu"
    assert torch.equal(data.batch["input_ids"], torch.arange(6).view(2, 3))
    assert moved.non_tensor_batch["uid"] is data.non_tensor_batch["uid"] and moved.meta_info is data.meta_info
    same = on_device(data, "cpu")
    assert same.batch["input_ids"].data_ptr() == data.batch["input_ids"].data_ptr()  # no copy when already there
