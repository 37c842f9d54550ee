"""DataProto behaviour that code written against veRL 0.9.1 relies on (issue 14): the TensorDict form,
unfold_column_chunks, fold/unfold_batch_dim and misuse errors that are also AssertionErrors."""

import numpy as np
import pytest
import torch
from tensordict import NonTensorData, NonTensorStack, TensorDict

from hybridflow.protocol import DataProto, DataProtoError, fold_batch_dim, unfold_batch_dim


def _proto(n=4):
    return DataProto.from_dict(
        tensors={"ids": torch.arange(n * 4).view(n, 4), "score": torch.arange(n, dtype=torch.float32)},
        non_tensors={"uid": [f"u{i}" for i in range(n)], "rm": [{"gt": i, "tags": [i] * i} for i in range(n)]},
        meta_info={"temperature": 0.7, "step": 3},
    )


# ----------------------------------------------------------------------------- TensorDict form


def test_to_tensordict_layout_and_round_trip():
    dp = _proto()
    td = dp.to_tensordict()
    assert isinstance(td, TensorDict) and list(td.batch_size) == [4]
    assert torch.equal(td["ids"], dp.batch["ids"])
    assert isinstance(td.get("rm"), NonTensorStack) and [x.data for x in td.get("rm")][2] == {"gt": 2, "tags": [2, 2]}
    assert isinstance(td.get("temperature"), NonTensorData) and td.get("temperature").data == 0.7

    back = DataProto.from_tensordict(td)
    assert torch.equal(back.batch["ids"], dp.batch["ids"]) and torch.equal(back.batch["score"], dp.batch["score"])
    assert list(back.non_tensor_batch["uid"]) == ["u0", "u1", "u2", "u3"]
    assert back.non_tensor_batch["rm"].dtype == object and back.non_tensor_batch["rm"][3] == {
        "gt": 3,
        "tags": [3, 3, 3],
    }
    assert back.meta_info == {"temperature": 0.7, "step": 3}
    # rows still line up after indexing the TensorDict form
    picked = DataProto.from_tensordict(td[torch.tensor([3, 0])])
    assert picked.batch["score"].tolist() == [3.0, 0.0] and list(picked.non_tensor_batch["uid"]) == ["u3", "u0"]


def test_from_tensordict_built_by_hand_and_meta_info_argument():
    td = TensorDict(
        {
            "x": torch.ones(2, 3),
            "names": NonTensorStack.from_list([NonTensorData("a"), NonTensorData("b")]),
            "mode": NonTensorData("train"),
        },
        batch_size=[2],
    )
    dp = DataProto.from_tensordict(td, meta_info={"step": 1})
    assert dp.meta_info == {"step": 1, "mode": "train"}
    assert list(dp.non_tensor_batch["names"]) == ["a", "b"] and len(dp) == 2
    with pytest.raises(AssertionError, match="num_batch_dims"):
        DataProto.from_tensordict(td, num_batch_dims=2)


def test_to_tensordict_refuses_name_clashes():
    dp = _proto()
    dp.meta_info["uid"] = "clash"
    with pytest.raises(DataProtoError, match=r"meta_info keys \['uid'\]"):
        dp.to_tensordict()


# ----------------------------------------------------------------------------- unfold_column_chunks


def test_unfold_column_chunks():
    # 2 rows with 4 columns of 'ids', split in 2: row 0 -> rows [0, 1] and [2, 3]; row 1 -> [4, 5], [6, 7].
    # Columns not split are repeated per piece (interleaved): score [0, 0, 1, 1], uid [u0, u0, u1, u1].
    dp = _proto(2)
    out = dp.unfold_column_chunks(2, split_keys=["ids"])
    assert out.batch["ids"].tolist() == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert out.batch["score"].tolist() == [0.0, 0.0, 1.0, 1.0]
    assert list(out.non_tensor_batch["uid"]) == ["u0", "u0", "u1", "u1"] and len(out) == 4
    # a non-tensor column with a second dim splits too
    dp.non_tensor_batch["pairs"] = np.array([["a", "b"], ["c", "d"]], dtype=object)
    out = dp.unfold_column_chunks(2, split_keys=["ids", "pairs"])
    assert out.non_tensor_batch["pairs"].tolist() == [["a"], ["b"], ["c"], ["d"]]
    # no split keys: every column is repeated
    assert dp.unfold_column_chunks(3).batch["ids"].shape == (6, 4)
    with pytest.raises(AssertionError, match="'ids'.*divisible by 3"):
        dp.unfold_column_chunks(3, split_keys=["ids"])
    with pytest.raises(ValueError, match=r"\['nope'\]"):
        dp.unfold_column_chunks(2, split_keys=["nope"])


# ----------------------------------------------------------------------------- fold / unfold


def test_fold_and_unfold_batch_dim():
    # 6 rows folded into 2 groups of 3: group g holds rows 3g .. 3g+2
    dp = DataProto.from_dict(
        tensors={"x": torch.arange(12).view(6, 2)}, non_tensors={"s": list("abcdef")}, meta_info={"k": 1}
    )
    folded = fold_batch_dim(dp, 2)
    assert len(folded) == 2 and folded.batch["x"].shape == (2, 3, 2)
    assert folded.batch["x"][1].tolist() == [[6, 7], [8, 9], [10, 11]]
    assert folded.non_tensor_batch["s"].tolist() == [["a", "b", "c"], ["d", "e", "f"]]
    assert folded.meta_info == {"k": 1}
    assert dp.batch["x"].shape == (6, 2) and dp.non_tensor_batch["s"].shape == (6,)  # input untouched
    back = unfold_batch_dim(folded, batch_dims=2)
    assert len(back) == 6 and torch.equal(back.batch["x"], dp.batch["x"])
    assert list(back.non_tensor_batch["s"]) == list("abcdef")
    with pytest.raises(AssertionError, match="not divisible"):
        fold_batch_dim(dp, 4)


# ----------------------------------------------------------------------------- misuse -> AssertionError too


def test_misuse_errors_are_clear_value_errors_and_assertion_errors():
    dp = _proto()
    cases = {
        "union batch conflict": lambda: _proto().union(DataProto.from_dict(tensors={"score": torch.zeros(4)})),
        "union non-tensor conflict": lambda: _proto().union(DataProto.from_dict(non_tensors={"uid": list("abcd")})),
        "union meta conflict": lambda: _proto().union(
            DataProto.from_dict(tensors={"z": torch.zeros(4)}, meta_info={"step": 4})
        ),
        "union length": lambda: _proto().union(_proto(3)),
        "uneven chunk": lambda: dp.chunk(3),
        "concat keys": lambda: DataProto.concat([dp, dp.select(batch_keys=["ids"])]),
        "make_iterator": lambda: dp.make_iterator(mini_batch_size=3, epochs=1),
        "length mismatch": lambda: DataProto.from_dict(tensors={"a": torch.zeros(2)}, non_tensors={"b": [1, 2, 3]}),
    }
    for name, call in cases.items():
        with pytest.raises(AssertionError) as err:  # veRL asserts here
            call()
        assert isinstance(err.value, ValueError) and isinstance(err.value, DataProtoError), name
        assert str(err.value), name
    with pytest.raises(AssertionError, match="'score'"):
        _proto().union(DataProto.from_dict(tensors={"score": torch.zeros(4)}))
