"""DataProto's errors and the layout changes that reshape its columns (pure functions on a
TensorDict and a dict of numpy object arrays; ``hybridflow.protocol`` wraps them as methods).

- ``to_tensordict`` / ``from_tensordict``: one TensorDict holding tensors, per-sample objects
  (``NonTensorStack``) and batch-global values (``NonTensorData``), veRL's layout;
- ``unfold_column_chunks``: cut the second dim of some columns into ``n`` pieces that become rows;
- ``fold_batch_dim`` / ``unfold_batch_dim``: [B, ...] <-> [B', B // B', ...].
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from tensordict import TensorDict

__all__ = ["DataProtoError", "DataProtoTypeError"]


class DataProtoError(ValueError, AssertionError):
    """Misuse of a DataProto (conflicting union, uneven chunk, mismatched lengths, ...).

    A ``ValueError`` with a message naming the offending key, and an ``AssertionError`` because veRL
    asserts in the same places: code written against veRL that catches ``AssertionError`` still works.
    """


class DataProtoTypeError(DataProtoError, TypeError):
    """A value of the wrong type in a DataProto (also a TypeError)."""


# ----------------------------------------------------------------------------- TensorDict


def to_tensordict(batch: TensorDict | None, non_tensor_batch: dict, meta_info: dict, length: int) -> TensorDict:
    """Tensors as they are, each non-tensor column as a NonTensorStack (one object per row), each
    meta_info entry as NonTensorData. Names must be unique across the three."""
    from tensordict import NonTensorData, NonTensorStack

    tensors = {} if batch is None else batch.to_dict()
    for where, keys in (("non_tensor_batch", non_tensor_batch), ("meta_info", meta_info)):
        clash = sorted(set(tensors) & set(keys))
        if clash:
            raise DataProtoError(f"to_tensordict: {where} keys {clash} are also batch (or non_tensor_batch) keys")
        if where == "non_tensor_batch":
            for key, column in non_tensor_batch.items():
                tensors[key] = NonTensorStack.from_list([NonTensorData(item) for item in column])
        else:
            for key, value in meta_info.items():
                tensors[key] = NonTensorData(value)
    return TensorDict(tensors, batch_size=[length])


def from_tensordict(tensor_dict: TensorDict, meta_info: dict | None, num_batch_dims: int):
    """(batch, non_tensor_batch, meta_info) from a TensorDict laid out as ``to_tensordict`` writes it."""
    from tensordict import NonTensorData, NonTensorStack

    if not isinstance(tensor_dict, TensorDict):
        raise DataProtoTypeError(f"from_tensordict needs a TensorDict, got {type(tensor_dict).__name__}")
    if num_batch_dims != 1:
        raise DataProtoError(f"a DataProto has exactly one batch dimension; got num_batch_dims={num_batch_dims}")
    meta = {} if meta_info is None else dict(meta_info)
    tensors, non_tensor = {}, {}
    for key, value in tensor_dict.items():
        if isinstance(value, NonTensorStack):
            column = np.empty(len(value), dtype=object)
            for i, item in enumerate(value):
                column[i] = item.data if isinstance(item, NonTensorData) else item
            non_tensor[key] = column
        elif isinstance(value, NonTensorData):
            meta[key] = value.data
        elif isinstance(value, torch.Tensor):
            tensors[key] = value
        elif isinstance(value, TensorDict):  # a nested TensorDict stays one (nested) column
            tensors[key] = value
        else:
            raise DataProtoTypeError(f"from_tensordict: key {key!r} holds {type(value).__name__}")
    batch = None
    if tensors:
        size = tuple(tensor_dict.batch_size[:1]) or tuple(next(iter(tensors.values())).shape[:1])
        batch = TensorDict(tensors, batch_size=size)
    return batch, non_tensor, meta


# ----------------------------------------------------------------------------- column chunks


def unfold_column_chunks(batch: TensorDict | None, non_tensor_batch: dict, n_split: int, split_keys):
    """Columns in ``split_keys``: [B, C, ...] -> [B * n_split, C // n_split, ...] (row i's pieces become
    rows i*n .. i*n+n-1). Every other column: each row repeated ``n_split`` times (interleaved)."""
    if n_split < 1:
        raise DataProtoError(f"unfold_column_chunks needs n_split >= 1, got {n_split}")
    split_keys = set(split_keys or [])
    known = set(batch.keys() if batch is not None else []) | set(non_tensor_batch)
    unknown = sorted(split_keys - known)
    if unknown:
        raise DataProtoError(f"unfold_column_chunks: split_keys {unknown} are not columns; have {sorted(known)}")

    def split_shape(key, shape):
        if len(shape) < 2 or shape[1] % n_split:
            raise DataProtoError(
                f"unfold_column_chunks: column {key!r} of shape {tuple(shape)} has no second dim divisible by {n_split}"
            )
        return (shape[0] * n_split, shape[1] // n_split, *shape[2:])

    new_batch = None
    if batch is not None:
        columns = {}
        for key, value in batch.items():
            if key in split_keys:
                columns[key] = value.reshape(split_shape(key, value.shape))
            else:
                columns[key] = torch.repeat_interleave(value, n_split, dim=0)
        new_batch = TensorDict(columns, batch_size=(batch.batch_size[0] * n_split,), device=batch.device)
    new_non_tensor = {}
    for key, value in non_tensor_batch.items():
        if key in split_keys:
            new_non_tensor[key] = value.reshape(split_shape(key, value.shape))
        else:
            new_non_tensor[key] = np.repeat(value, n_split, axis=0)
    return new_batch, new_non_tensor


# ----------------------------------------------------------------------------- batch dims


def fold_batch_dim(batch: TensorDict | None, non_tensor_batch: dict, length: int, new_batch_size: int):
    """[B, ...] -> [new_batch_size, B // new_batch_size, ...] for every column (a new object)."""
    if new_batch_size < 1 or length % new_batch_size:
        raise DataProtoError(f"fold_batch_dim: batch size {length} is not divisible by new_batch_size {new_batch_size}")
    new_batch = None
    if batch is not None:
        new_batch = batch.reshape(new_batch_size, -1)  # (B', B // B', ...)
        new_batch.auto_batch_size_(batch_dims=1)
    new_non_tensor = {k: np.reshape(v, (new_batch_size, -1, *v.shape[1:])) for k, v in non_tensor_batch.items()}
    return new_batch, new_non_tensor


def unfold_batch_dim(batch: TensorDict | None, non_tensor_batch: dict, batch_dims: int = 2):
    """Merge the first ``batch_dims`` dims of every column into one batch dim (undoes the fold)."""
    if batch_dims < 1:
        raise DataProtoError(f"unfold_batch_dim needs batch_dims >= 1, got {batch_dims}")
    new_batch, size = None, None
    if batch is not None:
        leading = None
        for key, value in batch.items(include_nested=True, leaves_only=True):
            shape = tuple(value.shape[:batch_dims])
            if len(shape) < batch_dims or (leading is not None and shape != leading):
                raise DataProtoError(
                    f"unfold_batch_dim: column {key!r} has leading dims {tuple(value.shape)}, expected {batch_dims} "
                    f"dims shared by every column{'' if leading is None else f' ({leading})'}"
                )
            leading = shape
        work = batch.clone(False)
        work.batch_size = leading if leading is not None else batch.batch_size
        new_batch = work.reshape(-1)
        size = new_batch.batch_size[0]
    new_non_tensor = {}
    for key, value in non_tensor_batch.items():
        flat = int(np.prod(value.shape[:batch_dims]))
        if size is not None and flat != size:
            raise DataProtoError(f"unfold_batch_dim: non_tensor_batch[{key!r}] has {flat} rows, the batch {size}")
        new_non_tensor[key] = np.reshape(value, (flat, *value.shape[batch_dims:]))
    return new_batch, new_non_tensor


def describe_conflict(key: str, first: Any, other: Any) -> str:
    return f"meta_info[{key!r}] differs between parts ({_short(first)} vs {_short(other)})"


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
