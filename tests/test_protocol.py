"""DataProto / DataProtoFuture: every method, its error messages, pickling and Ray transport."""

from __future__ import annotations

import concurrent.futures
import copy
import logging
import os
import pickle
import sys
import time

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from hybridflow.protocol import (
    DataProto,
    DataProtoConfig,
    DataProtoFuture,
    DataProtoItem,
    all_gather_data_proto,
    collate_fn,
    pad_dataproto_to_divisor,
    union_numpy_dict,
    union_tensor_dict,
    unpad_dataproto,
)


def assert_dp_equal(a: DataProto, b: DataProto, meta=True):
    """Same keys, same dtypes, same values, rows in the same order."""
    assert len(a) == len(b)
    assert (a.batch is None) == (b.batch is None)
    if a.batch is not None:
        a_keys = set(a.batch.keys(include_nested=True, leaves_only=True))
        assert a_keys == set(b.batch.keys(include_nested=True, leaves_only=True))
        assert a.batch.batch_size == b.batch.batch_size
        for k in a_keys:
            assert a.batch[k].dtype == b.batch[k].dtype, k
            assert torch.equal(a.batch[k], b.batch[k]), k
    assert a.non_tensor_batch.keys() == b.non_tensor_batch.keys()
    for k, v in a.non_tensor_batch.items():
        assert v.dtype == object and b.non_tensor_batch[k].dtype == object
        assert v.shape == b.non_tensor_batch[k].shape, k
        assert all(x == y for x, y in zip(v.tolist(), b.non_tensor_batch[k].tolist(), strict=True)), k
    if meta:
        assert a.meta_info == b.meta_info


def make(n=6, meta=None) -> DataProto:
    """Rows i = 0..n-1: row id tensor, 2-wide features 10*i + j, a uid string and a dict per row."""
    return DataProto.from_dict(
        tensors={
            "rid": torch.arange(n),
            "x": torch.arange(2 * n, dtype=torch.float32).reshape(n, 2) + 8 * torch.arange(n)[:, None],
            "mask": torch.arange(n) % 2 == 0,
        },
        non_tensors={"uid": [f"u{i}" for i in range(n)], "rm": [{"gt": i} for i in range(n)]},
        meta_info={"temperature": 1.0} if meta is None else meta,
    )


def rows(dp: DataProto) -> list[int]:
    """Row ids from the tensor side, checked against the non-tensor side (alignment)."""
    rid = dp.batch["rid"].tolist()
    assert [int(u[1:]) for u in dp.non_tensor_batch["uid"]] == rid
    assert [r["gt"] for r in dp.non_tensor_batch["rm"]] == rid
    return rid


# ----------------------------------------------------------------------------- construction / checks


def test_from_dict_builds_aligned_columns():
    dp = make(4)
    assert len(dp) == 4 and rows(dp) == [0, 1, 2, 3]
    assert dp.non_tensor_batch["uid"].dtype == object
    assert dp.meta_info == {"temperature": 1.0}


def test_lists_become_one_row_per_element_even_when_rectangular():
    # np.array([[1, 2], [3, 4]], dtype=object) would be 2-D; a row must stay the list that was given
    dp = DataProto.from_dict(non_tensors={"ids": [[1, 2], [3, 4]], "ragged": [[1], [2, 3]]})
    assert dp.non_tensor_batch["ids"].shape == (2,) and dp.non_tensor_batch["ids"][1] == [3, 4]
    assert dp.non_tensor_batch["ragged"][1] == [2, 3]


def test_non_object_arrays_are_stored_as_object_arrays():
    dp = DataProto.from_dict(tensors={"a": torch.zeros(3)}, non_tensors={"score": np.array([0.5, 1.0, 2.0])})
    assert dp.non_tensor_batch["score"].dtype == object
    assert dp.non_tensor_batch["score"].tolist() == [0.5, 1.0, 2.0]


def test_from_dict_rejects_tensors_with_different_batch_sizes():
    with pytest.raises(ValueError, match=r"'a' has \(3,\), 'b' has \(4,\)"):
        DataProto.from_dict(tensors={"a": torch.zeros(3, 2), "b": torch.zeros(4, 2)})


def test_from_dict_refuses_more_than_one_batch_dim():
    # veRL 0.9.1 asserts one batch dim (check_consistency); ours says so and is also an AssertionError
    for dims in (2, 0):
        with pytest.raises(AssertionError, match="num_batch_dims"):
            DataProto.from_dict(tensors={"a": torch.zeros(2, 3, 4)}, num_batch_dims=dims)
    with pytest.raises(ValueError, match="exactly one batch dimension"):
        DataProto(batch=TensorDict({"a": torch.zeros(2, 3)}, batch_size=[2, 3]))


def test_from_single_dict_splits_tensors_from_the_rest():
    dp = DataProto.from_single_dict({"a": torch.ones(2), "s": np.array(["p", "q"], dtype=object), "l": [1, 2]})
    assert list(dp.batch.keys()) == ["a"]
    assert set(dp.non_tensor_batch) == {"s", "l"}


def test_check_consistency_names_the_offending_key():
    with pytest.raises(ValueError, match=r"non_tensor_batch\['uid'\] has length 2 but the batch has length 3"):
        DataProto.from_dict(tensors={"a": torch.zeros(3)}, non_tensors={"uid": ["x", "y"]})
    with pytest.raises(ValueError, match=r"non_tensor_batch\['b'\] has length 1 but 'a' has length 2"):
        DataProto.from_dict(non_tensors={"a": [1, 2], "b": [1]})
    dp = make(3)
    dp.non_tensor_batch["bad"] = np.array([1, 2, 3])  # assigned directly: not an object array
    with pytest.raises(TypeError, match=r"non_tensor_batch\['bad'\].*dtype=object, got ndarray of int64"):
        dp.check_consistency()
    dp.non_tensor_batch["bad"] = "abc"
    with pytest.raises(TypeError, match=r"non_tensor_batch\['bad'\].*got str"):
        dp.check_consistency()
    with pytest.raises(TypeError, match=r"non_tensor_batch\['s'\] .* got int"):
        DataProto.from_single_dict({"s": 3})
    with pytest.raises(ValueError, match=r"non_tensor_batch\['s'\] is 0-d"):
        DataProto(non_tensor_batch={"s": np.array(3, dtype=object)})


def test_empty_and_non_tensor_only_dataprotos():
    assert len(DataProto()) == 0
    dp = DataProto.from_dict(non_tensors={"uid": ["a", "b", "c", "d"]}, meta_info={"k": 1})
    assert dp.batch is None and len(dp) == 4
    assert dp[1:3].non_tensor_batch["uid"].tolist() == ["b", "c"]
    assert [c.non_tensor_batch["uid"].tolist() for c in dp.chunk(2)] == [["a", "b"], ["c", "d"]]
    assert DataProto.concat(dp.chunk(2)).non_tensor_batch["uid"].tolist() == ["a", "b", "c", "d"]
    assert dp.repeat(2).non_tensor_batch["uid"].tolist() == ["a", "a", "b", "b", "c", "c", "d", "d"]
    padded, pad = pad_dataproto_to_divisor(dp, 3)
    assert pad == 2 and padded.non_tensor_batch["uid"].tolist() == ["a", "b", "c", "d", "a", "b"]
    assert_dp_equal(pickle.loads(pickle.dumps(dp)), dp)


# ----------------------------------------------------------------------------- indexing


def test_int_index_returns_a_row_item():
    dp = make(4)
    item = dp[2]
    assert isinstance(item, DataProtoItem)
    assert item.batch["rid"].item() == 2 and item.non_tensor_batch["uid"] == "u2"
    assert item.meta_info is dp.meta_info
    assert dp[-1].non_tensor_batch["uid"] == "u3" and dp[np.int64(1)].batch["rid"].item() == 1


@pytest.mark.parametrize(
    "index, expected",
    [
        (slice(1, 4), [1, 2, 3]),
        (slice(None, None, 2), [0, 2, 4]),
        (slice(None, None, -2), [5, 3, 1]),  # torch has no negative steps; numpy semantics apply
        ([4, 0, 0], [4, 0, 0]),
        (np.array([5, 1]), [5, 1]),
        (torch.tensor([3, 2]), [3, 2]),
        ([True, False, True, False, False, True], [0, 2, 5]),
        (np.array([False] * 5 + [True]), [5]),
        (torch.tensor([True, True, False, False, False, False]), [0, 1]),
        ([], []),
    ],
)
def test_index_forms_keep_rows_aligned(index, expected):
    out = make(6)[index]
    assert isinstance(out, DataProto) and rows(out) == expected


def test_bad_indices_raise():
    dp = make(3)
    with pytest.raises(IndexError, match="boolean mask has length 2 but the DataProto has length 3"):
        dp[[True, False]]
    with pytest.raises(TypeError, match="integers or booleans"):
        dp[np.array([0.5])]
    with pytest.raises(TypeError, match="not supported"):
        dp["rid"]


def test_iteration_yields_rows():
    assert [item.non_tensor_batch["uid"] for item in make(3)] == ["u0", "u1", "u2"]


# ----------------------------------------------------------------------------- keys


def test_select_keeps_named_keys_and_shares_tensors():
    dp = make(3, meta={"a": 1, "b": 2})
    sub = dp.select(batch_keys=["x"], non_tensor_batch_keys=["uid"], meta_info_keys=["a", "zz"])
    assert list(sub.batch.keys()) == ["x"] and list(sub.non_tensor_batch) == ["uid"] and sub.meta_info == {"a": 1}
    sub.batch["x"][0, 0] = -1.0  # tensors are shared, as in veRL
    assert dp.batch["x"][0, 0] == -1.0
    whole = dp.select()
    whole.batch["new"] = torch.zeros(3)
    whole.non_tensor_batch["new"] = np.array([1, 2, 3], dtype=object)
    assert "new" not in dp.batch.keys() and "new" not in dp.non_tensor_batch  # containers are not


def test_select_deepcopy_copies_non_tensors_and_meta():
    dp = make(2, meta={"m": {"k": 1}})
    sub = dp.select(deepcopy=True)
    sub.non_tensor_batch["rm"][0]["gt"] = 99
    sub.meta_info["m"]["k"] = 2
    assert dp.non_tensor_batch["rm"][0]["gt"] == 0 and dp.meta_info["m"]["k"] == 1


def test_select_missing_keys_are_named():
    with pytest.raises(KeyError, match=r"batch keys \['nope'\] not found"):
        make(2).select(batch_keys=["x", "nope"])
    with pytest.raises(KeyError, match=r"non_tensor_batch keys \['nada'\] not found"):
        make(2).select(non_tensor_batch_keys=["nada"])


def test_pop_moves_keys_out():
    dp = make(3, meta={"t": 1, "u": 2})
    popped = dp.pop(batch_keys=["x"], non_tensor_batch_keys=["uid"], meta_info_keys=["t"])
    assert list(popped.batch.keys()) == ["x"] and list(popped.non_tensor_batch) == ["uid"]
    assert popped.meta_info == {"t": 1} and dp.meta_info == {"u": 2}
    assert "x" not in dp.batch.keys() and "uid" not in dp.non_tensor_batch
    assert torch.equal(popped.batch["x"], make(3).batch["x"])
    with pytest.raises(KeyError, match=r"batch keys \['x'\] not found"):
        dp.pop(batch_keys=["x"])
    with pytest.raises(KeyError, match=r"meta_info keys \['t'\] not found"):
        dp.pop(meta_info_keys=["t"])


def test_rename_batch_and_non_tensor_keys():
    dp = make(2)
    assert dp.rename("x", "feat") is dp
    dp.rename(["uid", "rid"], ["id", "row"])
    assert set(dp.batch.keys()) == {"feat", "row", "mask"} and set(dp.non_tensor_batch) == {"id", "rm"}
    with pytest.raises(KeyError, match="'ghost'"):
        dp.rename("ghost", "g")
    with pytest.raises(ValueError, match="differ in length: 1 and 2"):
        dp.rename(["feat"], ["a", "b"])


# ----------------------------------------------------------------------------- union


def test_union_merges_disjoint_and_equal_keys_in_place():
    a = make(3).select(batch_keys=["rid"], non_tensor_batch_keys=["uid"])
    b = make(3, meta={"temperature": 1.0, "n": 2}).select(batch_keys=["rid", "x"], non_tensor_batch_keys=["rm"])
    out = a.union(b)
    assert out is a and set(a.batch.keys()) == {"rid", "x"} and set(a.non_tensor_batch) == {"uid", "rm"}
    assert a.meta_info == {"temperature": 1.0, "n": 2}


def test_union_conflicts_name_the_key():
    base = make(3)
    other = make(3)
    other.batch["x"][1, 1] += 1
    with pytest.raises(ValueError, match="batch key 'x'"):
        make(3).union(other)
    other = make(3)
    other.non_tensor_batch["rm"][2] = {"gt": -1}
    with pytest.raises(ValueError, match="non_tensor_batch key 'rm'"):
        base.union(other)
    with pytest.raises(ValueError, match="meta_info key 'temperature'"):
        make(3).union(make(3, meta={"temperature": 0.7}))
    with pytest.raises(ValueError, match="equal lengths, got 3 and 4"):
        make(3).union(make(4))


def test_union_with_no_tensor_side_and_nan_values():
    a = DataProto.from_dict(non_tensors={"uid": ["a", "b"]})
    b = DataProto.from_dict(tensors={"v": torch.tensor([float("nan"), 1.0])})
    a.union(b)
    assert torch.equal(a.batch["v"][1:], torch.tensor([1.0]))
    a.union(DataProto.from_dict(tensors={"v": torch.tensor([float("nan"), 1.0])}))  # NaN == NaN here


def test_module_level_union_helpers():
    td = TensorDict({"a": torch.ones(2)}, batch_size=[2])
    union_tensor_dict(td, TensorDict({"b": torch.zeros(2)}, batch_size=[2]))
    assert set(td.keys()) == {"a", "b"}
    with pytest.raises(ValueError, match="identical batch sizes"):
        union_tensor_dict(td, TensorDict({"c": torch.zeros(3)}, batch_size=[3]))
    d = {"k": np.array([1, None], dtype=object)}
    union_numpy_dict(d, {"k": np.array([1, None], dtype=object), "j": np.array([2, 3], dtype=object)})
    assert set(d) == {"k", "j"}
    with pytest.raises(ValueError, match="'k'"):
        union_numpy_dict(d, {"k": np.array([1, 2], dtype=object)})


# ----------------------------------------------------------------------------- concat / chunk / split


def test_concat_orders_rows_and_merges_meta_info():
    parts = [
        make(2, meta={"t": 1.0, "metrics": {"loss": 0.5, "acc": [1, 2]}}),
        make(3, meta={"t": 1.0, "metrics": {"loss": 0.25, "acc": [3]}}),
    ]
    out = DataProto.concat(parts)
    assert rows(out) == [0, 1, 0, 1, 2]
    # veRL 0.9.1: a dict of lists with one entry per part (dp rank), whatever each entry holds
    assert out.meta_info == {"t": 1.0, "metrics": {"loss": [0.5, 0.25], "acc": [[1, 2], [3]]}}
    # a single part still becomes a dict of one-entry lists
    assert DataProto.concat(parts[:1]).meta_info["metrics"] == {"loss": [0.5], "acc": [[1, 2]]}


def test_concat_metrics_lists_of_dicts_are_flattened_one_entry_per_dict():
    a, b = make(1, meta={"metrics": [{"l": 1}]}), make(1, meta={"metrics": [{"l": 2}, {"l": 3}]})
    assert DataProto.concat([a, b]).meta_info["metrics"] == {"l": [1, 2, 3]}
    # as in veRL, every part counts, also chunks that share their parent's metrics object
    whole = make(4, meta={"metrics": {"loss": 1.0}})
    assert DataProto.concat(whole.chunk(4)).meta_info == {"metrics": {"loss": [1.0] * 4}}
    # keys missing from some parts give shorter lists; a non-dict entry is refused
    c, d = make(1, meta={"metrics": {"x": 1}}), make(1, meta={"metrics": {"x": 2, "y": 3}})
    assert DataProto.concat([c, d]).meta_info["metrics"] == {"x": [1, 2], "y": [3]}
    with pytest.raises(TypeError, match="part 1 holds float"):
        DataProto.concat([c, make(1, meta={"metrics": 0.5})])


def test_concat_refuses_a_disagreeing_meta_key():
    # veRL asserts equal values for shared non-metric keys; code catching AssertionError still works
    with pytest.raises(AssertionError, match=r"meta_info\['t'\] differs between parts \(1 vs 2\)"):
        DataProto.concat([make(1, meta={"t": 1, "only_b": None}), make(1, meta={"t": 2, "extra": 3})])
    out = DataProto.concat([make(1, meta={"t": 1, "only_b": None}), make(1, meta={"t": 1, "extra": 3})])
    assert out.meta_info == {"t": 1, "only_b": None, "extra": 3}


def test_concat_errors():
    with pytest.raises(ValueError, match="at least one"):
        DataProto.concat([])
    with pytest.raises(ValueError, match=r"batch keys differ between parts: \['x'\]"):
        DataProto.concat([make(2), make(2).select(batch_keys=["rid", "mask"])])
    with pytest.raises(ValueError, match=r"non_tensor_batch keys differ between parts: \['rm'\]"):
        DataProto.concat([make(2), make(2).select(non_tensor_batch_keys=["uid"])])
    with pytest.raises(ValueError, match="some parts have a tensor batch"):
        DataProto.concat([make(2), DataProto.from_dict(non_tensors={"uid": ["a"], "rm": [{}]})])


def test_chunk_split_and_their_errors():
    dp = make(6)
    assert [rows(c) for c in dp.chunk(3)] == [[0, 1], [2, 3], [4, 5]]
    assert all(c.meta_info is dp.meta_info for c in dp.chunk(2))
    with pytest.raises(ValueError, match="got length 6 and 4 chunks"):
        dp.chunk(4)
    with pytest.raises(ValueError, match="chunks >= 1"):
        dp.chunk(0)
    assert [rows(s) for s in make(7).split(3)] == [[0, 1, 2], [3, 4, 5], [6]]
    with pytest.raises(ValueError, match="split_size >= 1"):
        dp.split(0)


def test_chunk_uneven_with_auto_padding(monkeypatch):
    monkeypatch.setattr(DataProtoConfig, "auto_padding", True)
    assert [len(c) for c in make(7).chunk(3)] == [3, 2, 2]
    monkeypatch.setattr(DataProtoConfig, "auto_padding", False)
    assert [len(c) for c in DataProto.from_dict({"a": torch.zeros(5)}, auto_padding=True).chunk(2)] == [3, 2]


# ----------------------------------------------------------------------------- repeat / reorder / padding


def test_repeat_interleaved_and_tiled():
    dp = make(3)
    assert rows(dp.repeat(2, interleave=True)) == [0, 0, 1, 1, 2, 2]
    assert rows(dp.repeat(2, interleave=False)) == [0, 1, 2, 0, 1, 2]
    assert dp.repeat(3).batch["x"].shape == (9, 2)
    with pytest.raises(ValueError, match="repeat_times"):
        dp.repeat(-1)


def test_sample_level_repeat():
    dp = make(3)
    assert rows(dp.sample_level_repeat([2, 0, 1])) == [0, 0, 2]
    assert rows(dp.sample_level_repeat(torch.tensor([1, 1, 3]))) == [0, 1, 2, 2, 2]
    with pytest.raises(ValueError, match="one count per row"):
        dp.sample_level_repeat([1, 2])


def test_reorder_is_in_place():
    dp = make(4)
    assert dp.reorder(torch.tensor([3, 1, 0, 2])) is None
    assert rows(dp) == [3, 1, 0, 2]
    dp.reorder(np.array([1, 0, 2, 3]))
    assert rows(dp) == [1, 3, 0, 2]


def test_padding_in_place():
    dp = make(3)
    dp.padding(2, padding_candidate="first")
    assert rows(dp) == [0, 1, 2, 0, 0]
    dp = make(3)
    dp.padding(1)
    assert rows(dp) == [0, 1, 2, 2]


def test_pad_to_divisor_repeats_rows_from_the_start():
    dp = make(5, meta={"metrics": {"l": 1.0}})
    padded, pad = pad_dataproto_to_divisor(dp, 4)
    assert pad == 3 and rows(padded) == [0, 1, 2, 3, 4, 0, 1, 2]  # 5 -> 8
    assert padded.meta_info == {"metrics": {"l": 1.0}}
    assert_dp_equal(unpad_dataproto(padded, pad), dp)
    padded, pad = pad_dataproto_to_divisor(make(2), 7)
    assert pad == 5 and rows(padded) == [0, 1, 0, 1, 0, 1, 0]  # more padding than rows: cycle
    same, pad = pad_dataproto_to_divisor(dp, 5)
    assert pad == 0 and same is dp and unpad_dataproto(dp, 0) is dp
    with pytest.raises(ValueError, match="size_divisor"):
        pad_dataproto_to_divisor(dp, 0)


# ----------------------------------------------------------------------------- misc


def test_to_device_returns_self():
    dp = make(2)
    assert dp.to("cpu") is dp and dp.batch.device == torch.device("cpu")


def test_repr_and_info_name_keys_and_shapes(caplog):
    text = repr(make(3, meta={"temperature": 0.7, "metrics": [1.0]}))
    for piece in ("len=3", "x: (3, 2) (torch.float32)", "uid: ndarray(3,) (object)", "temperature: float = 0.7"):
        assert piece in text
    assert "batch None" in DataProto.from_dict(non_tensors={"a": [1]}).get_data_info()
    caplog.set_level(logging.INFO, logger="hybridflow")
    message = make(2).print_size(prefix="p")
    assert message.startswith("p, Size of tensordict") and caplog.messages == [message]


def test_collate_fn_and_make_iterator():
    dp = make(4)
    assert rows(collate_fn([dp[i] for i in (2, 0)])) == [2, 0]
    shuffle = {"shuffle": True}
    seen = [rows(mb) for mb in dp.make_iterator(mini_batch_size=2, epochs=2, seed=1, dataloader_kwargs=shuffle)]
    assert len(seen) == 4  # 2 epochs x 2 mini-batches, each epoch a permutation of the 4 rows
    assert sorted(seen[0] + seen[1]) == [0, 1, 2, 3] and sorted(seen[2] + seen[3]) == [0, 1, 2, 3]
    again = [rows(mb) for mb in dp.make_iterator(2, 2, seed=1, dataloader_kwargs={"shuffle": True})]
    assert again == seen  # seeded
    with pytest.raises(ValueError, match="divisible"):
        dp.make_iterator(3, 1)


def test_copy_and_deepcopy():
    dp = make(2, meta={"m": [1]})
    shallow = copy.copy(dp)
    assert shallow.batch is dp.batch and shallow is not dp
    deep = copy.deepcopy(dp)
    deep.batch["x"][0, 0] = 42.0
    deep.meta_info["m"].append(2)
    assert dp.batch["x"][0, 0] == 0.0 and dp.meta_info["m"] == [1]
    assert_dp_equal(deep.select(batch_keys=["rid"]), dp.select(batch_keys=["rid"]), meta=False)


def test_save_and_load_from_disk(tmp_path):
    dp = make(3, meta={"step": 4})
    dp.save_to_disk(tmp_path / "dp.pkl")
    assert_dp_equal(DataProto.load_from_disk(tmp_path / "dp.pkl"), dp)


def _all_gather_rank(rank: int, world: int, init_file: str, out_dir: str) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        dp = make(6).select_idxs([2 * rank, 2 * rank + 1])  # rank 0: rows 0, 1; rank 1: rows 2, 3
        all_gather_data_proto(dp)
        dp.save_to_disk(os.path.join(out_dir, f"rank{rank}.pkl"))
    finally:
        dist.destroy_process_group()


def test_all_gather_data_proto_two_ranks(tmp_path):
    """Two gloo ranks in their own processes (whatever this process holds does not matter): each ends up
    with every rank's rows, in rank order, tensors and non-tensors aligned."""
    import torch.multiprocessing as mp

    mp.spawn(_all_gather_rank, args=(2, str(tmp_path / "pg"), str(tmp_path)), nprocs=2, join=True)
    expected = make(6).select_idxs([0, 1, 2, 3])
    for rank in range(2):
        gathered = DataProto.load_from_disk(tmp_path / f"rank{rank}.pkl")
        assert rows(gathered) == [0, 1, 2, 3]
        assert_dp_equal(gathered, expected)


# ----------------------------------------------------------------------------- pickling


def odd_tensors_dp() -> DataProto:
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    return DataProto.from_dict(
        tensors={
            "bf16": torch.linspace(-3, 3, 12).reshape(4, 3).to(torch.bfloat16),
            "fp8": torch.tensor([0.5, -1.0, 2.0, 448.0]).to(torch.float8_e4m3fn),
            "u16": torch.tensor([0, 1, 65535, 7], dtype=torch.uint16),
            "flag": torch.tensor([True, False, False, True]),
            "transposed": base.reshape(6, 4).T,  # non-contiguous view (4, 6)
            "expanded": torch.arange(4)[:, None].expand(4, 5),  # stride 0
            "grad": torch.ones(4, 2, requires_grad=True),
        },
        non_tensors={"uid": ["a", "b", "c", "d"]},
        meta_info={"t": torch.tensor(1.5)},
    )


@pytest.mark.parametrize("protocol", [4, 5])
def test_pickle_round_trip_of_awkward_dtypes_and_layouts(protocol):
    dp = odd_tensors_dp()
    assert not dp.batch["transposed"].is_contiguous()
    back = pickle.loads(pickle.dumps(dp, protocol=protocol))
    for key in dp.batch.keys():
        assert back.batch[key].dtype == dp.batch[key].dtype, key
        sent, got = dp.batch[key].detach(), back.batch[key]
        if key == "fp8":  # compare bits: torch.equal has no float8 kernel
            sent, got = sent.view(torch.uint8), got.view(torch.uint8)
        assert torch.equal(got, sent), key
    assert back.non_tensor_batch["uid"].tolist() == ["a", "b", "c", "d"] and back.meta_info["t"].item() == 1.5
    back.batch["transposed"][0, 0] = -7.0  # writable, and not the sender's memory
    assert dp.batch["transposed"][0, 0] == 0.0


def test_pickle_protocol5_moves_tensors_out_of_band():
    tensors = {"a": torch.randn(64, 1024), "b": torch.randn(64, 512).to(torch.bfloat16)}
    dp = DataProto.from_dict(tensors, non_tensors={"s": ["x"] * 64})
    buffers = []
    payload = pickle.dumps(dp, protocol=5, buffer_callback=buffers.append)
    assert len(buffers) == 2 and len(payload) < 4096  # 320 KB of tensors ride outside the pickle stream
    # receivers such as Ray hand back read-only buffers: tensors must still be writable copies
    ro = [memoryview(b.raw()).toreadonly() for b in buffers]
    back = pickle.loads(payload, buffers=ro)
    assert_dp_equal(back, dp)
    back.batch["a"].zero_()
    assert dp.batch["a"].abs().sum() > 0


def test_pickle_sends_only_the_rows_of_a_slice():
    big = DataProto.from_dict({"a": torch.zeros(1000, 256)})
    assert len(pickle.dumps(big[:10], protocol=5)) < 20_000  # 10 KB of rows, not the 1 MB storage


def test_pickle_nested_tensordict_and_empty_batch_keys():
    td = TensorDict({"a": torch.ones(2), "n": {"b": torch.zeros(2, 3)}}, batch_size=[2])
    dp = DataProto(batch=td)
    back = pickle.loads(pickle.dumps(dp))
    assert torch.equal(back.batch["n", "b"], torch.zeros(2, 3))
    empty = DataProto(batch=TensorDict({}, batch_size=[5]))
    assert len(pickle.loads(pickle.dumps(empty))) == 5


# ----------------------------------------------------------------------------- futures


def test_future_with_concurrent_futures():
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        futs = [pool.submit(make, 2), pool.submit(make, 4)]
        fut = DataProtoFuture.concat(futs)
        assert rows(fut.get()) == [0, 1, 0, 1, 2, 3]
        assert fut.is_ready() and fut.done()
        halves = fut.chunk(2)
        assert [rows(h.get()) for h in halves] == [[0, 1, 0], [1, 2, 3]]
        assert [rows(q.get()) for q in halves[1].chunk(3)] == [[1], [2], [3]]  # chunk of a chunk
        # plain values mix with futures
        assert rows(DataProtoFuture.concat([make(1), futs[0]]).get()) == [0, 0, 1]


def test_future_not_ready_until_done():
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        gate = concurrent.futures.Future()
        f = pool.submit(lambda: (gate.result(), make(2))[1])
        fut = DataProtoFuture.concat([f])
        assert not fut.is_ready()
        gate.set_result(None)
        assert rows(fut.get()) == [0, 1] and fut.is_ready()


def test_protocol_needs_ray_neither_to_import_nor_for_local_futures(monkeypatch):
    import ast

    import hybridflow.protocol as protocol

    tree = ast.parse(open(protocol.__file__).read())
    top_level = {a.name.split(".")[0] for node in tree.body if isinstance(node, ast.Import) for a in node.names}
    top_level |= {node.module.split(".")[0] for node in tree.body if isinstance(node, ast.ImportFrom) and node.module}
    assert "ray" not in top_level
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` now fails
    f = concurrent.futures.Future()
    f.set_result(make(4))
    fut = DataProtoFuture.concat([f])
    assert rows(fut.chunk(2)[1].get()) == [2, 3] and fut.is_ready()


# ----------------------------------------------------------------------------- Ray


@pytest.fixture(scope="module")
def ray_mod(request):
    """The session's shared Ray (tests/conftest.py's ``ray_session``)."""
    pytest.importorskip("ray")
    return request.getfixturevalue("ray_session")


@pytest.fixture(scope="module")
def echo_actor(ray_mod):
    @ray_mod.remote(num_cpus=0)
    class Echo:
        def echo(self, data):
            return data

        def add_key(self, data):
            # in-place writes on received tensors must work (and not touch the object store)
            data.batch["x"].mul_(2)
            data.batch["y"] = data.batch["x"] + 1
            data.non_tensor_batch["seen"] = np.array([True] * len(data), dtype=object)
            data.meta_info["worker"] = "echo"
            return data

        def resolve(self, fut):
            return fut.get()

    actor = Echo.remote()
    ray_mod.get(actor.echo.remote(None))  # warm up: the first call imports torch in the worker
    yield actor
    ray_mod.kill(actor)


def test_ray_put_get_and_actor_round_trip(ray_mod, echo_actor):
    dp = odd_tensors_dp()
    dp.batch["grad"] = dp.batch["grad"].detach()
    assert_dp_equal(ray_mod.get(ray_mod.put(dp)), dp, meta=False)
    assert_dp_equal(ray_mod.get(echo_actor.echo.remote(dp)), dp, meta=False)
    out = ray_mod.get(echo_actor.add_key.remote(make(3)))
    assert out.batch["x"].tolist() == (make(3).batch["x"] * 2).tolist()
    assert torch.equal(out.batch["y"], out.batch["x"] + 1)
    assert out.non_tensor_batch["seen"].tolist() == [True] * 3 and out.meta_info["worker"] == "echo"
    assert rows(out) == [0, 1, 2]


def test_ray_10mb_batch_timing(ray_mod, echo_actor):
    # 256 x 4096 fp32 (4 MiB) + 256 x 2048 int64 (4 MiB) + 256 x 4096 bf16 (2 MiB) = 10 MiB
    g = torch.Generator().manual_seed(0)
    dp = DataProto.from_dict(
        tensors={
            "logits": torch.randn(256, 4096, generator=g),
            "ids": torch.randint(0, 50_000, (256, 2048), generator=g),
            "h": torch.randn(256, 4096, generator=g).to(torch.bfloat16),
        },
        non_tensors={"uid": [str(i) for i in range(256)]},
    )
    put_get, actor = [], []
    for _ in range(5):
        t0 = time.perf_counter()
        back = ray_mod.get(ray_mod.put(dp))
        t1 = time.perf_counter()
        echoed = ray_mod.get(echo_actor.echo.remote(dp))
        t2 = time.perf_counter()
        put_get.append(t1 - t0), actor.append(t2 - t1)
    assert_dp_equal(back, dp)
    assert_dp_equal(echoed, dp)
    print(f"\n10 MiB DataProto: ray.get(ray.put) median {1e3 * np.median(put_get):.1f} ms, "
          f"actor echo median {1e3 * np.median(actor):.1f} ms")  # fmt: skip


def test_future_with_ray_refs(ray_mod, echo_actor):
    refs = [echo_actor.echo.remote(make(2)), echo_actor.echo.remote(make(2))]
    fut = DataProtoFuture.concat(refs)
    assert rows(fut.get()) == [0, 1, 0, 1]
    assert fut.is_ready()
    # a chunked future travels to a worker and is resolved there (collect/dispatch fns pickle)
    assert rows(ray_mod.get(echo_actor.resolve.remote(fut.chunk(2)[1]))) == [0, 1]
    mixed = DataProtoFuture.concat([refs[0], make(1)])
    assert rows(mixed.get()) == [0, 1, 0]
