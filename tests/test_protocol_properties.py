"""Property-based checks of DataProto's row algebra (hypothesis).

Every generated DataProto carries its row id in a tensor and in two non-tensor columns, so each
property also checks that tensors and non-tensors stay aligned.
"""

from __future__ import annotations

import pickle

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hybridflow.protocol import DataProto, pad_dataproto_to_divisor, unpad_dataproto

PROPS = settings(max_examples=50, deadline=None)


def build(n: int, seed: int, width: int = 3) -> DataProto:
    g = torch.Generator().manual_seed(seed)
    return DataProto.from_dict(
        tensors={
            "rid": torch.arange(n),
            "f": torch.randn(n, width, generator=g),
            "bf": torch.randn(n, 2, generator=g).to(torch.bfloat16),
            "m": torch.rand(n, generator=g) > 0.5,
        },
        non_tensors={"uid": [f"u{i}" for i in range(n)], "gt": [{"row": i} for i in range(n)]},
        meta_info={"temperature": 0.5},
    )


def row_ids(dp: DataProto) -> list[int]:
    rid = dp.batch["rid"].tolist()
    assert [int(u[1:]) for u in dp.non_tensor_batch["uid"]] == rid
    assert [d["row"] for d in dp.non_tensor_batch["gt"]] == rid
    return rid


def same(a: DataProto, b: DataProto) -> bool:
    if len(a) != len(b) or set(a.batch.keys()) != set(b.batch.keys()) or a.meta_info != b.meta_info:
        return False
    if any(a.batch[k].dtype != b.batch[k].dtype or not torch.equal(a.batch[k], b.batch[k]) for k in a.batch.keys()):
        return False
    if a.non_tensor_batch.keys() != b.non_tensor_batch.keys():
        return False
    return all(a.non_tensor_batch[k].tolist() == b.non_tensor_batch[k].tolist() for k in a.non_tensor_batch)


@PROPS
@given(chunks=st.integers(1, 6), per_chunk=st.integers(0, 5), seed=st.integers(0, 2**16))
def test_chunk_then_concat_is_identity(chunks, per_chunk, seed):
    dp = build(chunks * per_chunk, seed)
    parts = dp.chunk(chunks)
    assert [len(p) for p in parts] == [per_chunk] * chunks
    assert same(DataProto.concat(parts), dp)


@PROPS
@given(n=st.integers(1, 20), split_size=st.integers(1, 25), seed=st.integers(0, 2**16))
def test_split_then_concat_is_identity(n, split_size, seed):
    dp = build(n, seed)
    parts = dp.split(split_size)
    assert len(parts) == -(-n // split_size)  # ceil(n / split_size)
    assert all(len(p) == split_size for p in parts[:-1]) and 1 <= len(parts[-1]) <= split_size
    assert same(DataProto.concat(parts), dp)


@PROPS
@given(n=st.integers(0, 12), times=st.integers(0, 5), interleave=st.booleans(), seed=st.integers(0, 2**16))
def test_repeat_shapes_and_order(n, times, interleave, seed):
    dp = build(n, seed)
    out = dp.repeat(times, interleave=interleave)
    assert len(out) == n * times and out.batch["f"].shape == (n * times, 3)
    # interleave: a a b b c c (row i // times); tile: a b c a b c (row i % n)
    expected = [i // times if interleave else i % n for i in range(n * times)]
    assert row_ids(out) == expected
    assert torch.equal(out.batch["bf"], dp.batch["bf"][expected])


@PROPS
@given(n=st.integers(1, 20), divisor=st.integers(1, 9), seed=st.integers(0, 2**16))
def test_pad_then_unpad_is_identity(n, divisor, seed):
    dp = build(n, seed)
    padded, pad = pad_dataproto_to_divisor(dp, divisor)
    assert len(padded) % divisor == 0 and 0 <= pad < divisor and len(padded) == n + pad
    assert row_ids(padded) == list(range(n)) + [i % n for i in range(pad)]  # padding cycles from the start
    assert same(unpad_dataproto(padded, pad), dp)


@PROPS
@given(n=st.integers(0, 10), seed=st.integers(0, 2**16), split=st.integers(0, 4))
def test_union_of_disjoint_halves_is_symmetric(n, seed, split):
    full = build(n, seed)
    tensor_keys, non_tensor_keys = ["rid", "f", "bf", "m"], ["uid", "gt"]
    a_keys, b_keys = tensor_keys[:split], tensor_keys[split:]

    def half(batch_keys, nt_keys, meta):
        part = full.select(batch_keys=batch_keys, non_tensor_batch_keys=nt_keys)
        part.meta_info = meta
        return part

    def a():
        return half(a_keys, non_tensor_keys[:1], {"x": 1})

    def b():
        return half(b_keys, non_tensor_keys[1:], {"y": 2})

    ab, ba = a().union(b()), b().union(a())
    assert same(ab, ba) and same(ab, half(tensor_keys, non_tensor_keys, {"x": 1, "y": 2}))


@PROPS
@given(n=st.integers(1, 15), seed=st.integers(0, 2**16), data=st.data())
def test_index_selection_matches_numpy(n, seed, data):
    dp = build(n, seed)
    idx = data.draw(st.lists(st.integers(-n, n - 1), max_size=2 * n))
    mask = data.draw(st.lists(st.booleans(), min_size=n, max_size=n))
    assert row_ids(dp[idx]) == np.arange(n)[idx].tolist()
    assert row_ids(dp[torch.tensor(mask, dtype=torch.bool)]) == np.arange(n)[np.array(mask, dtype=bool)].tolist()


@PROPS
@given(n=st.integers(0, 10), seed=st.integers(0, 2**16), start=st.integers(0, 10), step=st.integers(1, 3))
def test_pickle_round_trip_of_any_slice(n, seed, start, step):
    view = build(n, seed)[start::step]  # a view into a larger storage, possibly empty
    back = pickle.loads(pickle.dumps(view, protocol=5))
    assert same(back, view)
