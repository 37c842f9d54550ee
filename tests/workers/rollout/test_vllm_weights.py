"""The bucket wire format and the name rules of the vLLM weight sync (no vLLM needed)."""

from __future__ import annotations

import os

import pytest
import torch

from hybridflow.workers.rollout.vllm_weights import (
    SHARED_DIR,
    TIED_EMBEDDING,
    TIED_HEAD,
    BucketFiles,
    PackedBucket,
    TiedEmbeddingNames,
    pack_bucket,
    unpack_bucket,
)


def mixed_tensors():
    g = torch.Generator().manual_seed(0)
    return [
        ("a.weight", torch.randn(3, 5, generator=g)),
        ("b.bias", torch.randn(7, generator=g).to(torch.bfloat16)),
        ("c.idx", torch.arange(6, dtype=torch.int64).reshape(2, 3)),
        ("d.t", torch.randn(4, 6, generator=g).t()),  # not contiguous
        ("e.scalar", torch.tensor(1.5, dtype=torch.float16)),
    ]


def test_bucket_round_trips_through_msgpack_bit_for_bit():
    msgspec = pytest.importorskip("msgspec", reason="vLLM's wire format library (installed with vllm)")
    tensors = mixed_tensors()
    # the payload crosses vLLM's RPC as msgpack: plain values and one bytes buffer
    wire = msgspec.msgpack.decode(msgspec.msgpack.encode(pack_bucket(tensors)))
    for copy in (False, True):
        back = list(unpack_bucket(wire, copy=copy))
        assert [n for n, _ in back] == [n for n, _ in tensors]
        for (_, want), (_, got) in zip(tensors, back):
            assert got.dtype == want.dtype and got.shape == want.shape and torch.equal(got, want)


@pytest.mark.skipif(SHARED_DIR is None, reason="no /dev/shm on this machine")
def test_bucket_through_a_shared_memory_file_outlives_the_file():
    msgspec = pytest.importorskip("msgspec", reason="vLLM's wire format library (installed with vllm)")
    tensors = mixed_tensors()
    with PackedBucket(tensors) as packed:
        assert "data" not in packed.payload and os.path.isfile(packed.payload["path"])
        wire = msgspec.msgpack.decode(msgspec.msgpack.encode(packed.payload))  # only the path and table travel
        back = list(unpack_bucket(wire))
    assert not os.path.exists(wire["path"])  # removed once the worker has it mapped
    for (name, want), (got_name, got) in zip(tensors, back):
        assert got_name == name and got.dtype == want.dtype and torch.equal(got, want)


def test_bucket_files_are_rewritten_in_place_and_the_workers_mapping_sees_the_new_bytes(tmp_path):
    files, maps = BucketFiles(str(tmp_path), keep=2), {}  # the sender's files; the worker's mappings
    first = [("a", torch.zeros(8)), ("b", torch.zeros(4))]
    views, before = {}, None
    for value in (1.0, 2.0):
        for named in (first, [("c", torch.zeros(16))]):
            with files.pack([(n, t + value) for n, t in named]) as packed:
                views.update(unpack_bucket(packed.payload, maps=maps))
        files.end_update()
        assert len(files.paths) == 2 and all(os.path.isfile(p) for p in files.paths)  # kept for the next update
        assert all(torch.equal(v, torch.full_like(v, value)) for v in views.values())
        assert len(maps) == 2 and (before is None or all(m is before[k] for k, m in maps.items()))  # mapped once
        before = dict(maps)
    with files.pack([("a", torch.ones(2))]):  # an update of one bucket: the second file is not needed now
        pass
    files.end_update()
    assert len(files.paths) == 1 and len(os.listdir(tmp_path)) == 1
    os.unlink(files.paths[0])  # removed behind the sender's back: made again, and mapped again
    with files.pack([(n, t + 3.0) for n, t in first]) as packed:  # the same size as before
        assert torch.equal(dict(unpack_bucket(packed.payload, maps=maps))["a"], torch.full((8,), 3.0))
    files.close()
    assert os.listdir(tmp_path) == []


def test_buckets_beyond_the_kept_files_get_files_of_their_own(tmp_path):
    files, seen, maps = BucketFiles(str(tmp_path)), [], {}  # keeps one
    for _ in range(2):
        for _ in range(2):
            with files.pack([("a", torch.ones(4))]) as packed:
                seen.append(packed.payload["path"])
                list(unpack_bucket(packed.payload, maps=maps))
        assert [key[0] for key in maps] == [seen[0]]  # the worker holds no mapping of a file of one bucket
        files.end_update()
        assert os.listdir(tmp_path) == [os.path.basename(seen[0])]  # the second bucket's file is gone
    assert seen[2] == seen[0] and len({seen[1], seen[3], seen[0]}) == 3


def test_without_room_for_a_file_the_bytes_travel_inline(tmp_path):
    packed = PackedBucket(mixed_tensors(), shared_dir=str(tmp_path / "missing"))  # cannot create the file
    assert "path" not in packed.payload and len(packed.payload["data"]) > 0
    assert [n for n, _ in unpack_bucket(packed.payload)] == [n for n, _ in mixed_tensors()]


@pytest.mark.skipif(SHARED_DIR is None, reason="no /dev/shm on this machine")
def test_a_full_shared_memory_leaves_no_file_and_the_bytes_travel_inline(monkeypatch):
    import errno

    def no_room(fd, data, offset):
        raise OSError(errno.ENOSPC, "No space left on device")

    def mine() -> set:  # this process's files only: other test processes (pytest -n 2) write there too
        return {f for f in os.listdir(SHARED_DIR) if f.startswith(f"hybridflow_weights_{os.getpid()}_")}

    before = mine()
    monkeypatch.setattr(os, "pwrite", no_room)
    packed = PackedBucket(mixed_tensors())
    assert "path" not in packed.payload and mine() <= before
    for (_, want), (_, got) in zip(mixed_tensors(), unpack_bucket(packed.payload)):
        assert torch.equal(got, want)


@pytest.mark.parametrize("shared", [True, False])
def test_a_tensor_under_two_names_is_laid_out_once(shared, tmp_path):
    """Tied embeddings go out as embed_tokens and lm_head (TiedEmbeddingNames): one copy of the bytes."""
    embedding = torch.randn(50, 8)  # 1600 bytes, a multiple of ALIGN
    named = [(TIED_EMBEDDING, embedding), ("norm.weight", torch.ones(4)), (TIED_HEAD, embedding)]
    with PackedBucket(named, shared_dir=str(tmp_path) if shared else None) as packed:
        size = packed.payload["nbytes"] if shared else len(packed.payload["data"])
        assert size == 1600 + 16  # the embedding once, the norm (16 bytes) after it
        back = dict(unpack_bucket(packed.payload))
    assert torch.equal(back[TIED_EMBEDDING], embedding) and torch.equal(back[TIED_HEAD], embedding)
    assert torch.equal(back["norm.weight"], torch.ones(4))


def test_unpack_copy_owns_its_memory():
    payload = pack_bucket([("w", torch.ones(4))])
    data = bytearray(payload["data"])
    ((_, copied),) = unpack_bucket({**payload, "data": data}, copy=True)
    ((_, view),) = unpack_bucket({**payload, "data": data}, copy=False)
    data[:4] = bytes(4)  # the sender's buffer is reused (vLLM's ring buffer)
    assert copied[0].item() == 1.0 and view[0].item() == 0.0


def test_empty_bucket():
    assert list(unpack_bucket(pack_bucket([]))) == []


@pytest.mark.parametrize("first", [TIED_EMBEDDING, TIED_HEAD])
def test_tied_embedding_goes_out_under_both_names_once(first):
    tied, w = TiedEmbeddingNames(tied=True), torch.ones(2)
    tied.start_update()
    assert [n for n, _ in tied.expand(first, w)] == [TIED_EMBEDDING, TIED_HEAD]
    other = TIED_HEAD if first == TIED_EMBEDDING else TIED_EMBEDDING
    assert tied.expand(other, w) == []  # the state dict's second name for the same tensor
    assert [n for n, _ in tied.expand("model.norm.weight", w)] == ["model.norm.weight"]
    tied.start_update()  # next update: sent again
    assert len(tied.expand(other, w)) == 2


def test_untied_names_pass_through():
    untied, w = TiedEmbeddingNames(tied=False), torch.ones(2)
    assert [n for n, _ in untied.expand(TIED_HEAD, w) + untied.expand(TIED_EMBEDDING, w)] == [TIED_HEAD, TIED_EMBEDDING]


def test_tensors_kept_in_the_shared_file_travel_as_their_places(tmp_path, monkeypatch):
    """``BucketFiles.share``: the owner keeps its tensors in the file; a bucket of them writes no bytes and the
    worker's mapping sees the owner's later in-place changes; any other bucket is written as before."""
    files, maps = BucketFiles(str(tmp_path)), {}
    views = files.share(mixed_tensors())
    assert all(torch.equal(views[name], want) for name, want in mixed_tensors())
    with monkeypatch.context() as patched:
        patched.setattr(os, "pwrite", lambda *args: pytest.fail("a bucket of shared tensors wrote bytes"))
        with files.pack(list(views.items()), placed=True) as packed:
            assert packed.payload["path"] == files.shared.path
            got = dict(unpack_bucket(packed.payload, maps=maps))
    assert all(torch.equal(got[name], want) for name, want in mixed_tensors())
    views["a.weight"].add_(1.0)  # an optimizer step, in place
    assert torch.equal(got["a.weight"], mixed_tensors()[0][1] + 1.0)
    for named, placed in (([("x", torch.ones(3)), ("a.weight", views["a.weight"])], True), (views.items(), False)):
        with files.pack(named, placed=placed) as packed:
            assert packed.payload["path"] != files.shared.path
            assert torch.equal(dict(unpack_bucket(packed.payload))["a.weight"], views["a.weight"])
        files.end_update()
    files.close()
    assert os.listdir(tmp_path) == []
