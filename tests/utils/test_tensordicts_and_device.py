"""veRL's helper modules that user code imports: ``verl.utils.tensordict_utils`` (TensorDict batches in
the engine workers' layout, jagged nested tensors included) and ``verl.utils.device``. Expected values
are those veRL 0.9.1 gives for the same calls (hybridflow/devtools/verl_parity.py can rerun them)."""

from __future__ import annotations

import pytest
import torch
from tensordict import NonTensorData, TensorDict

from hybridflow.utils import device
from hybridflow.utils import tensordict_utils as tu


def rows(nested: torch.Tensor) -> list[list]:
    return [r.tolist() for r in nested.unbind()]


@pytest.fixture
def batch() -> TensorDict:
    ids = torch.nested.as_nested_tensor([torch.arange(n) for n in (3, 2, 4, 1)], layout=torch.jagged)
    td = TensorDict({"x": torch.arange(4.0), "ids": ids}, batch_size=[4])
    return tu.assign_non_tensor(td, temperature=0.7, uid=["a", "b", "c", "d"])


def test_non_tensor_entries(batch):
    assert isinstance(batch.get("temperature"), NonTensorData)
    assert tu.get_non_tensor_data(batch, "temperature", None) == 0.7
    assert tu.get_non_tensor_data(batch, "missing", 5) == 5
    assert tu.get(batch, "uid") == ["a", "b", "c", "d"] and tu.get(batch, "temperature") == 0.7
    assert tu.get(batch, "x").tolist() == [0.0, 1.0, 2.0, 3.0] and tu.get(batch, "missing", 3) == 3
    assert tu.unwrap_non_tensor_data(NonTensorData(3)) == 3 and tu.unwrap_non_tensor_data(4) == 4
    assert sorted(tu.get_keys(batch, ["x", "temperature"]).keys()) == ["temperature", "x"]
    with pytest.raises(KeyError, match="key nope not in tensordict"):
        tu.get_keys(batch, ["nope"])
    copy = batch.clone()
    assert tu.pop(copy, "temperature") == 0.7 and "temperature" not in copy.keys()
    assert tu.pop(copy, "temperature", "gone") == "gone"
    popped = tu.pop_keys(copy, ["uid", "x"])
    assert tu.get(popped, "uid") == ["a", "b", "c", "d"] and sorted(copy.keys()) == ["ids"]


def test_chunk_and_concat_keep_jagged_rows_and_batch_values(batch):
    parts = tu.chunk_tensordict(batch, 2)
    assert [len(p) for p in parts] == [2, 2]
    assert [rows(p["ids"]) for p in parts] == [[[0, 1, 2], [0, 1]], [[0, 1, 2, 3], [0]]]
    assert [tu.get(p, "temperature") for p in parts] == [0.7, 0.7]
    assert [tu.get(p, "uid") for p in parts] == [["a", "b"], ["c", "d"]]
    whole = tu.concat_tensordict(parts)
    assert rows(whole["ids"]) == [[0, 1, 2], [0, 1], [0, 1, 2, 3], [0]]
    assert tu.get(whole, "uid") == ["a", "b", "c", "d"] and tu.get(whole, "temperature") == 0.7
    tu.assert_tensordict_eq(tu.get_keys(whole, ["x", "uid"]), tu.get_keys(batch, ["x", "uid"]))
    with pytest.raises(AssertionError, match="expecting td with length divisible by chunks, but got 4 and 3"):
        tu.chunk_tensordict(batch, 3)  # veRL asserts; ours is also a ValueError
    only_meta = [tu.get_tensordict({}, {"step": 1}), tu.get_tensordict({}, {"step": 2})]
    assert tu.get(tu.concat_tensordict(only_meta), "step") == 1  # no batch dimension: the first stands


def test_three_dimensional_jagged_rows_split_and_join():
    per_row = [torch.arange(4 * n).reshape(4, n) for n in (3, 2, 5, 1)]  # mRoPE position ids: (4, seq)
    td = TensorDict({"position_ids": tu.nested_tensor_from_tensor_list(per_row, ragged_idx=2)}, batch_size=[4])
    parts = tu.chunk_tensordict(td, 2)
    back = tu.concat_tensordict(parts)["position_ids"]
    assert [tuple(r.shape) for r in back.unbind()] == [(4, 3), (4, 2), (4, 5), (4, 1)]
    assert all(torch.equal(a, b) for a, b in zip(back.unbind(), per_row, strict=True))


def test_building_selecting_padding(batch):
    ids = torch.nested.as_nested_tensor([torch.arange(2), torch.arange(3), torch.arange(1)], layout=torch.jagged)
    td = tu.get_tensordict({"x": torch.arange(3.0), "ids": ids, "uid": ["p", "q", "r"]}, {"temperature": 1.0})
    assert len(td) == 3 and td["ids"].is_nested and tu.get(td, "uid") == ["p", "q", "r"]
    assert tu.get(td, "temperature") == 1.0
    with pytest.raises(AssertionError, match="convert to numpy first"):
        tu.get_tensordict({"t": [torch.arange(2)]})
    with pytest.raises(ValueError, match="not consistent"):
        tu.get_tensordict({"a": torch.arange(2), "b": torch.arange(3)})
    picked = tu.index_select_tensor_dict(batch, torch.tensor([3, 0]))
    assert picked["x"].tolist() == [3.0, 0.0] and rows(picked["ids"]) == [[0], [0, 1, 2]]
    assert tu.get(picked, "uid") == ["d", "a"] and tu.get(picked, "temperature") == 0.7
    merged = tu.union_tensor_dict(
        TensorDict({"x": torch.arange(4.0)}, batch_size=[4]), TensorDict({"y": torch.ones(4)}, batch_size=[4])
    )
    assert sorted(merged.keys()) == ["x", "y"]
    with pytest.raises(AssertionError, match="x in tensor_dict1 and tensor_dict2 are not the same object"):
        tu.union_tensor_dict(
            TensorDict({"x": torch.arange(4.0)}, batch_size=[4]), TensorDict({"x": torch.ones(4)}, batch_size=[4])
        )
    padded, pad = tu.pad_to_divisor(TensorDict({"x": torch.arange(5.0)}, batch_size=[5]), 4)
    assert (len(padded), pad, padded["x"].tolist()) == (8, 3, [0.0, 1.0, 2.0, 3.0, 4.0, 0.0, 1.0, 2.0])
    assert tu.unpad(padded, pad)["x"].tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]
    padded, pad = tu.pad_to_divisor(TensorDict({"x": torch.arange(2.0)}, batch_size=[2]), 7)  # repeats twice
    assert (pad, padded["x"].tolist()) == (5, [0.0, 1.0, 0.0, 1.0, 0.0, 1.0, 0.0])
    made = tu.list_of_dict_to_tensordict([{"a": 1, "t": torch.ones(2)}, {"a": 2, "t": torch.zeros(2)}])
    assert tu.get(made, "a") == [1, 2] and made["t"].shape == (2, 2)
    batches = tu.make_iterator(TensorDict({"x": torch.arange(8.0)}, batch_size=[8]), 4, 2, seed=0)
    assert [b["x"].tolist() for b in batches] == [[0.0, 1.0, 2.0, 3.0], [4.0, 5.0, 6.0, 7.0]] * 2
    contiguous = tu.contiguous(batch)
    assert tu.get(contiguous, "temperature") == 0.7 and isinstance(contiguous.get("temperature"), NonTensorData)


def test_device_helpers_name_this_machines_accelerator(monkeypatch):
    monkeypatch.setenv("HYBRIDFLOW_DEVICE", "cpu")
    assert (device.get_device_name(), device.get_nccl_backend(), device.get_resource_name()) == ("cpu", "gloo", "CPU")
    assert device.get_torch_device() is torch.cpu and device.get_device_id() == 0
    assert device.get_visible_devices_keyword() == "CUDA_VISIBLE_DEVICES"
    assert device.is_torch_npu_available() is False and device.is_npu_available is False
    assert device.get_device_capability() == (None, None) and device.is_device_available() is False
    device.manual_seed(3)
    first = torch.rand(1)
    device.manual_seed_all(3)
    assert torch.equal(first, torch.rand(1))
    from hybridflow.utils.device import get_device_name  # veRL's path: verl.utils.device

    assert get_device_name() == "cpu"


def test_a_batch_built_by_the_helpers_reads_into_a_dataproto():
    from hybridflow.protocol import DataProto

    ids = torch.nested.as_nested_tensor([torch.arange(2), torch.arange(3)], layout=torch.jagged)
    td = tu.get_tensordict({"x": torch.arange(2.0), "ids": ids, "uid": ["p", "q"]}, {"temperature": 0.5})
    data = DataProto.from_tensordict(td, meta_info={"step": 1})
    assert sorted(data.batch.keys()) == ["ids", "x"] and list(data.non_tensor_batch["uid"]) == ["p", "q"]
    assert data.meta_info == {"step": 1, "temperature": 0.5} and len(data) == 2
