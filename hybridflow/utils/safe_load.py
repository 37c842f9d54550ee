"""Reading checkpoint files without running code they may hold.

A checkpoint directory can be replaced or damaged between a save and a resume (a shared disk, a copy
from elsewhere, a write cut short). ``torch.load(weights_only=False)`` and ``pickle.load`` would run
whatever a replaced file asks for, so every file hybridflow reads back goes through here:

- ``load_torch_file``: ``torch.load(weights_only=True)`` with the few numpy types that RNG states
  hold allow-listed;
- ``SafeMetadataReader``: torch.distributed.checkpoint's reader, whose ``.metadata`` is unpickled
  with an allow-list of DCP's own metadata classes instead of a plain ``pickle.load``.

A file that asks for anything else raises ``UnsafeCheckpointError``, one that cannot be read
``DamagedCheckpointError``; both name the file.
"""

from __future__ import annotations

import os
import pickle
import re

import numpy as np
import torch
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta

# numpy's RNG state (np.random.get_state) is a tuple holding a uint32 array
_NUMPY_GLOBALS = [np.core.multiarray._reconstruct, np.ndarray, np.dtype, type(np.dtype(np.uint32))]

# what torch.distributed.checkpoint's .metadata pickles: its own classes, torch.Size, dtypes, layouts
_DCP_MODULES = ("torch.distributed.checkpoint.metadata", "torch.distributed.checkpoint.filesystem")
_DCP_GLOBALS = {("torch", "Size"), ("torch.serialization", "_get_layout"), ("pathlib", "PosixPath")}
_DCP_GLOBALS |= {
    ("torch", str(dtype).removeprefix("torch.")) for dtype in vars(torch).values() if isinstance(dtype, torch.dtype)
}


class CheckpointFileError(ValueError):
    """A checkpoint file that will not be loaded; ``path`` names it."""

    def __init__(self, path: str, detail: str):
        self.path = str(path)
        self.detail = detail
        super().__init__(f"checkpoint file {self.path!r}: {detail}")


class UnsafeCheckpointError(CheckpointFileError):
    """The file asks to import or call something a checkpoint never holds (it may run code)."""


class DamagedCheckpointError(CheckpointFileError):
    """The file is missing, empty, truncated or otherwise unreadable."""


def load_torch_file(path: str, map_location="cpu"):
    """``torch.load`` of a file hybridflow wrote (tensors, numbers, strings, lists, dicts, numpy RNG state)."""
    if not os.path.isfile(path):
        raise DamagedCheckpointError(path, "missing")
    try:
        with torch.serialization.safe_globals(_NUMPY_GLOBALS):
            return torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as e:
        if "GLOBAL" in str(e) or "nsupported" in str(e):
            raise UnsafeCheckpointError(
                path, f"refused: it holds objects a checkpoint never holds ({_reason(e)})"
            ) from None
        raise DamagedCheckpointError(path, f"unreadable ({_first_line(e)})") from e
    except Exception as e:  # EOFError, zip and struct errors, ...: whatever a cut or overwritten file raises
        raise DamagedCheckpointError(path, f"truncated or unreadable ({type(e).__name__}: {_first_line(e)})") from e


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        if module in _DCP_MODULES or (module, name) in _DCP_GLOBALS:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"{module}.{name} is not part of a checkpoint's metadata")


def read_dcp_metadata(path: str) -> Metadata:
    """The ``.metadata`` file of a DCP directory, unpickled with an allow-list."""
    try:
        with open(path, "rb") as f:
            metadata = _MetadataUnpickler(f).load()
    except FileNotFoundError:
        raise DamagedCheckpointError(path, "missing") from None
    except pickle.UnpicklingError as e:
        if "not part of a checkpoint" in str(e):
            raise UnsafeCheckpointError(path, f"refused: {e}") from None
        raise DamagedCheckpointError(path, f"unreadable ({_first_line(e)})") from e
    except Exception as e:
        raise DamagedCheckpointError(path, f"truncated or unreadable ({type(e).__name__}: {_first_line(e)})") from e
    if not isinstance(metadata, Metadata):
        raise UnsafeCheckpointError(path, f"refused: holds a {type(metadata).__name__}, not DCP metadata")
    return metadata


class SafeMetadataReader(FileSystemReader):
    """DCP's file reader; only the metadata read differs (the shards are already read with weights_only)."""

    def read_metadata(self, *args, **kwargs) -> Metadata:
        rank = kwargs.get("rank")
        metadata = read_dcp_metadata(os.fspath(self._get_metadata_path(rank)))
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0][:200] if text else type(e).__name__


def _reason(e: BaseException) -> str:
    """torch's weights_only refusal: what the file asked for, not the advice around it."""
    found = re.search(r"GLOBAL ([\w.]+)", str(e))
    return f"it asks for {found.group(1)}" if found else _first_line(e)
