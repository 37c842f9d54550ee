"""Helpers over TensorDict batches in veRL's engine-worker layout (``verl.utils.tensordict_utils``).

A batch TensorDict holds three kinds of entries, one batch dimension:

- tensors, first dim the batch; ragged per-row sequences as *jagged nested tensors*
  (``torch.nested`` with ``layout=torch.jagged``, e.g. packed ``input_ids``);
- per-row Python objects as a ``NonTensorStack`` (one ``NonTensorData`` per row);
- values global to the batch (temperature, step, ...) as a single ``NonTensorData``.

TensorDict's own ``chunk``/``cat``/indexing do not handle jagged tensors of every shape, so the batch
operations here take the nested entries apart row by row and rebuild them. ``get``/``pop`` return
plain Python values (a list for a stack, the value for a ``NonTensorData``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np
import torch
from tensordict import NonTensorData, NonTensorStack, TensorDict

__all__ = [
    "TensorDictError",
    "assign_non_tensor_data",
    "assign_non_tensor_stack",
    "assign_non_tensor",
    "unwrap_non_tensor_data",
    "get_non_tensor_data",
    "nested_tensor_from_tensor_list",
    "concat_nested_tensors",
    "concat_tensordict_with_none_bsz",
    "concat_tensordict",
    "chunk_tensordict",
    "get_tensordict",
    "index_select_tensor_dict",
    "union_tensor_dict",
    "make_iterator",
    "assert_tensordict_eq",
    "get",
    "get_keys",
    "pop",
    "pop_keys",
    "pad_to_divisor",
    "unpad",
    "contiguous",
    "maybe_fix_3d_position_ids",
    "list_of_dict_to_tensordict",
]

logger = logging.getLogger(__name__)


class TensorDictError(ValueError, AssertionError):
    """A batch these helpers cannot work on. veRL asserts these conditions, so callers catching
    AssertionError (veRL's) or ValueError both see it."""


def _require_tensordict(value: Any, what: str = "input dict") -> None:
    if not isinstance(value, TensorDict):
        raise TypeError(f"{what} must be a TensorDict, got {type(value).__name__}")


def _is_nested(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.is_nested


def _ragged_idx(nested: torch.Tensor) -> int:
    return getattr(nested, "_ragged_idx", nested.dim() - 1)


def _stack(items: Iterable[Any]) -> NonTensorStack:
    return NonTensorStack.from_list([NonTensorData(item) for item in items])


def _plain(value: Any) -> Any:
    """A stored entry as user code reads it: tensors as they are, a stack as a list, data unwrapped."""
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, NonTensorStack):
        return value.tolist()
    if isinstance(value, NonTensorData):
        return value.data
    raise TypeError(f"unexpected TensorDict entry of type {type(value).__name__}")


# ----------------------------------------------------------------------------- non-tensor entries


def assign_non_tensor_data(tensor_dict: TensorDict, key: str, val: Any) -> None:
    """Store ``val`` as one value global to the batch."""
    _require_tensordict(tensor_dict)
    tensor_dict[key] = NonTensorData(val)


def assign_non_tensor_stack(tensor_dict: TensorDict, key: str, val: list) -> None:
    """Store ``val`` as one object per row (lists, dicts, nested lists of dicts, ...)."""
    _require_tensordict(tensor_dict)
    tensor_dict[key] = _stack(val)


def assign_non_tensor(tensor_dict: TensorDict, **kwargs: Any) -> TensorDict:
    """Store each keyword: a list as one object per row, anything else as a batch-global value
    (an already wrapped ``NonTensorData``/``NonTensorStack`` as it is). Returns ``tensor_dict``."""
    _require_tensordict(tensor_dict)
    for key, val in kwargs.items():
        if isinstance(val, (NonTensorData, NonTensorStack)):
            tensor_dict[key] = val
        elif isinstance(val, list):
            assign_non_tensor_stack(tensor_dict, key, val)
        else:
            assign_non_tensor_data(tensor_dict, key, val)
    return tensor_dict


def unwrap_non_tensor_data(data: Any) -> Any:
    """The value inside a ``NonTensorData``; anything else unchanged."""
    return data.data if isinstance(data, NonTensorData) else data


def get_non_tensor_data(data: TensorDict, key: str, default: Any) -> Any:
    """``data[key]`` unwrapped, or ``default`` when absent."""
    return unwrap_non_tensor_data(data.get(key, default))


# ----------------------------------------------------------------------------- nested (jagged) tensors


def nested_tensor_from_tensor_list(tensors: list[torch.Tensor], ragged_idx: int | None = None) -> torch.Tensor:
    """A jagged nested tensor whose rows are ``tensors``; ``ragged_idx`` (1-based over the nested
    tensor's dims, default the rows' last dim) is the dimension whose length varies."""
    if not tensors:
        raise TensorDictError("nested_tensor_from_tensor_list needs at least one tensor")
    row_dims = tensors[0].dim()
    ragged = row_dims if ragged_idx is None else ragged_idx
    if not 1 <= ragged <= row_dims:
        raise TensorDictError(f"ragged_idx must be in [1, {row_dims}], got {ragged}")
    if row_dims == 1:
        return torch.nested.as_nested_tensor(list(tensors), layout=torch.jagged)
    along = ragged - 1  # the varying dim within one row
    values = torch.cat(list(tensors), dim=along)
    lengths = torch.tensor([t.shape[along] for t in tensors], dtype=torch.long, device=values.device)
    offsets = torch.cat([lengths.new_zeros(1), lengths.cumsum(0)])
    nested = torch.nested.nested_tensor_from_jagged(values=values, offsets=offsets)
    nested._ragged_idx = ragged
    return nested


def _rows(nested: torch.Tensor) -> list[torch.Tensor]:
    """The rows of a jagged tensor. ``unbind`` splits 3-d+ jagged tensors along the wrong dim on some
    torch versions; then go through the padded form and the lengths the offsets give."""
    try:
        return list(nested.unbind(0))
    except RuntimeError:
        padded = nested.to_padded_tensor(0)
        lengths = nested.offsets().diff().tolist()
        return [padded[i, :length] for i, length in enumerate(lengths)]


def concat_nested_tensors(tensors: list[torch.Tensor]) -> torch.Tensor:
    """Jagged tensors (contiguous, 2-d or more) joined along the batch dimension."""
    rows: list[torch.Tensor] = []
    for t in tensors:
        if not (t.is_nested and t.is_contiguous()):
            raise TensorDictError("concat_nested_tensors needs contiguous nested tensors")
        if t.dim() < 2:
            raise TensorDictError(f"nested tensor must have 2 or more dimensions. Got {t.shape}")
        rows.extend(_rows(t))
    return nested_tensor_from_tensor_list(rows, ragged_idx=_ragged_idx(tensors[0]))


# ----------------------------------------------------------------------------- batches


def concat_tensordict_with_none_bsz(data: list[TensorDict]) -> TensorDict:
    """TensorDicts without a batch dimension (batch-global values only): the first one stands for all."""
    for d in data:
        if len(d.batch_size):
            raise TensorDictError(
                f"expected TensorDicts without a batch dimension, got batch_size {list(d.batch_size)}"
            )
    return data[0]


def concat_tensordict(data: list[TensorDict]) -> TensorDict:
    """``data`` joined along the batch dimension: nested entries row by row, the rest with
    ``TensorDict.cat`` (a batch-global value is taken from the first)."""
    if not data:
        raise TensorDictError("Must have at least one tensordict")
    nested_keys = {k for k, v in data[0].items() if _is_nested(v)}
    if not nested_keys:
        if len(data[0].batch_size) == 0:
            return concat_tensordict_with_none_bsz(data)
        return TensorDict.cat(data, dim=0)
    flat = []
    for td in data:
        if {k for k, v in td.items() if _is_nested(v)} != nested_keys:
            raise TensorDictError("All tensordicts must have the same set of nested tensors.")
        flat.append(
            TensorDict(
                {k: v for k, v in td.items() if k not in nested_keys}, batch_size=td.batch_size, device=td.device
            )
        )
    out = TensorDict.cat(flat, dim=0)
    for key in nested_keys:
        out[key] = concat_nested_tensors([td[key] for td in data])
    return out


def chunk_tensordict(td: TensorDict, chunks: int) -> list[TensorDict]:
    """``td`` in ``chunks`` consecutive equal parts (the length must divide); nested entries are split
    row by row, batch-global values go to every part."""
    _require_tensordict(td, "td")
    if len(td) % chunks:
        raise TensorDictError(f"expecting td with length divisible by chunks, but got {len(td)} and {chunks}")
    size = len(td) // chunks
    nested = {k: v for k, v in td.items() if _is_nested(v)}
    rest = TensorDict({k: v for k, v in td.items() if k not in nested}, batch_size=td.batch_size, device=td.device)
    parts = list(rest.chunk(chunks, dim=0))
    for key, value in nested.items():
        rows = _rows(value)
        for i, part in enumerate(parts):
            part[key] = nested_tensor_from_tensor_list(rows[i * size : (i + 1) * size], ragged_idx=_ragged_idx(value))
    return parts


def _length(key: str, value: Any) -> int:
    return value.size(0) if isinstance(value, torch.Tensor) else len(value)


def get_tensordict(tensor_dict: dict[str, Any], non_tensor_dict: dict | None = None) -> TensorDict:
    """A batch from ``tensor_dict`` (tensors, jagged nested tensors, and lists or numpy arrays of per-row
    objects, stored as stacks) and ``non_tensor_dict`` (batch-global values). Every per-row entry has the
    same length; without one the TensorDict has no batch dimension."""
    entries: dict[str, Any] = {}
    batch: int | None = None
    for key, val in tensor_dict.items():
        if _is_nested(val) and (val.layout != torch.jagged or not val.is_contiguous()):
            raise TensorDictError(f"{key}: nested tensors must be contiguous and jagged (layout=torch.jagged)")
        if isinstance(val, NonTensorStack) or isinstance(val, torch.Tensor):
            entries[key] = val
        elif isinstance(val, (list, np.ndarray)):
            if any(isinstance(v, torch.Tensor) for v in val):
                raise TensorDictError(
                    f"{key}: Passing a list makes the data NonTensorStack, which doesn't support torch.Tensor. "
                    "Please convert to numpy first"
                )
            entries[key] = _stack(val)
        else:
            raise TensorDictError(f"{key} -> {type(val)} isn't of 'torch.Tensor | list | np.ndarray' type")
        n = _length(key, val)
        if batch is not None and n != batch:
            raise TensorDictError(
                f"Batch size of {key} is not consistent with other tensors. Expected {batch}, got {n}"
            )
        batch = n
    for key, val in (non_tensor_dict or {}).items():
        if key in entries:
            raise TensorDictError(f"{key} is both a per-row entry and a batch-global value")
        entries[key] = NonTensorData(val)
    return TensorDict(entries, batch_size=[] if batch is None else [batch])


def index_select_tensor_dict(batch: TensorDict | None, indices: torch.Tensor | list[int]) -> TensorDict | None:
    """The rows ``indices`` (1-d) of ``batch``, in that order; batch-global values are kept."""
    idx = torch.as_tensor(indices)
    if idx.dim() != 1:
        raise TensorDictError("indices must be a 1D tensor")
    if batch is None:
        return None
    out: dict[str, Any] = {}
    for key, value in batch.items():
        if _is_nested(value):
            rows = _rows(value)
            out[key] = nested_tensor_from_tensor_list([rows[int(i)] for i in idx], ragged_idx=_ragged_idx(value))
        elif isinstance(value, torch.Tensor) or value.shape:
            out[key] = value[idx]
        else:  # a batch-global value
            out[key] = value
    return TensorDict(out, batch_size=[len(idx)])


def union_tensor_dict(tensor_dict1: TensorDict, tensor_dict2: TensorDict) -> TensorDict:
    """Add the entries of ``tensor_dict2`` that ``tensor_dict1`` lacks, in place; an entry both hold must
    be equal. Returns ``tensor_dict1``."""
    if tensor_dict1.batch_size != tensor_dict2.batch_size:
        raise TensorDictError(
            "Two tensor dict must have identical batch size. "
            f"Got {tensor_dict1.batch_size} and {tensor_dict2.batch_size}"
        )
    for key in tensor_dict2.keys():
        theirs = tensor_dict2.get(key)
        if key not in tensor_dict1.keys():
            tensor_dict1[key] = theirs
            continue
        ours = tensor_dict1.get(key)
        same = ours.equal(theirs) if isinstance(theirs, torch.Tensor) else _plain(ours) == _plain(theirs)
        if not same:
            raise TensorDictError(f"{key} in tensor_dict1 and tensor_dict2 are not the same object")
    return tensor_dict1


def make_iterator(
    tensordict: TensorDict, mini_batch_size: int, epochs: int, seed: int | None = None, dataloader_kwargs=None
) -> Iterator[TensorDict]:
    """Mini-batches of ``mini_batch_size`` rows, ``epochs`` passes; ``dataloader_kwargs`` go to the
    DataLoader over row indices (``shuffle=True`` with ``seed`` for a reproducible order)."""
    from torch.utils.data import DataLoader

    n = tensordict.batch_size[0]
    if n % mini_batch_size:
        raise TensorDictError(f"{n} % {mini_batch_size} != 0")
    generator = torch.Generator().manual_seed(seed) if seed is not None else None
    loader = DataLoader(
        torch.arange(n),
        batch_size=mini_batch_size,
        collate_fn=lambda x: x,
        generator=generator,
        **(dataloader_kwargs or {}),
    )

    def batches():
        for _ in range(epochs):
            for idx in loader:
                yield index_select_tensor_dict(tensordict, torch.stack(list(idx)))

    return batches()


def assert_tensordict_eq(tensordict1: TensorDict, tensordict2: TensorDict) -> None:
    """AssertionError unless both hold the same keys with equal values (nested tensors row by row)."""
    keys1, keys2 = set(tensordict1.keys()), set(tensordict2.keys())
    assert keys1 == keys2, f"key set diffs. Got {keys2=} vs {keys1=}"
    for key in keys1:
        a, b = tensordict1[key], tensordict2[key]
        assert type(a) is type(b), f"The type of {key} must be the same. Got {type(a)} vs {type(b)}"
        if _is_nested(a):
            assert _is_nested(b), f"{key}: both tensors must be nested"
            rows_a, rows_b = _rows(a), _rows(b)
            assert len(rows_a) == len(rows_b), f"{key}: {len(rows_a)} rows vs {len(rows_b)}"
            assert all(torch.equal(x, y) for x, y in zip(rows_a, rows_b, strict=True)), f"{key}: rows differ"
        elif isinstance(a, torch.Tensor):
            assert torch.equal(a, b), f"{key}: values differ"
        else:
            assert a == b, f"{key}: values differ"


def get(tensordict: TensorDict, key: str, default: Any = None) -> Any:
    """``tensordict[key]`` as a plain value (a list for per-row objects), or ``default``."""
    if key not in tensordict.keys():
        return default
    return _plain(tensordict.get(key))


def _split(entries: dict[str, Any]) -> TensorDict:
    per_row = {k: (v.tolist() if isinstance(v, NonTensorStack) else v) for k, v in entries.items()}
    per_row = {k: v for k, v in per_row.items() if not isinstance(v, NonTensorData)}
    glob = {k: v.data for k, v in entries.items() if isinstance(v, NonTensorData)}
    return get_tensordict(per_row, glob)


def get_keys(tensordict: TensorDict, keys: Iterable[str]) -> TensorDict:
    """A new TensorDict with only ``keys`` (KeyError naming a missing one)."""
    keys = list(keys)
    for key in keys:
        if key not in tensordict.keys():
            raise KeyError(f"key {key} not in tensordict")
    return _split({k: tensordict.get(k) for k in keys})


def pop(tensordict: TensorDict, key: str, default: Any = None) -> Any:
    """Remove ``key`` and return it as ``get`` would (``default`` when absent)."""
    if key not in tensordict.keys():
        return default
    return _plain(tensordict.pop(key))


def pop_keys(tensordict: TensorDict, keys: Iterable[str]) -> TensorDict:
    """Remove ``keys`` (KeyError naming a missing one) and return them as a new TensorDict."""
    keys = list(keys)
    for key in keys:
        if key not in tensordict.keys():
            raise KeyError(f"key {key} not in tensordict")
    return _split({k: tensordict.pop(k) for k in keys})


def pad_to_divisor(data: TensorDict, size_divisor: int) -> tuple[TensorDict, int]:
    """(``data`` padded to a multiple of ``size_divisor`` rows by repeating its first rows, pad size)."""
    _require_tensordict(data, "data")
    n = len(data)
    if n == 0:
        logger.warning("padding a TensorDict with no rows: nothing to repeat, left as it is")
        return data, 0
    pad = -n % size_divisor
    if not pad:
        return data, 0
    repeats = [data[: min(n, pad - done)] for done in range(0, pad, n)]
    return torch.cat([data, *repeats], dim=0), pad


def unpad(data: TensorDict, pad_size: int) -> TensorDict:
    """``data`` without its last ``pad_size`` rows (the padding ``pad_to_divisor`` added)."""
    return data[:-pad_size] if pad_size else data


def contiguous(data: TensorDict) -> TensorDict:
    """A new TensorDict with contiguous tensors (TensorDict's own ``contiguous`` turns batch-global
    values into per-row stacks)."""
    per_row, glob = {}, {}
    for key in data.keys():
        value = data.get(key)
        if isinstance(value, NonTensorData):
            glob[key] = value.data
        elif isinstance(value, NonTensorStack):
            per_row[key] = value
        elif isinstance(value, torch.Tensor):
            per_row[key] = value.contiguous()
        else:
            raise TypeError(f"{key}: expected a tensor or non-tensor entry, got {type(value).__name__}")
    return get_tensordict(per_row, glob)


def maybe_fix_3d_position_ids(data: TensorDict) -> None:
    """A 3-d nested ``position_ids`` (mRoPE) loses its ragged dim through pickling on some tensordict
    versions; set it back (it is the last dim)."""
    if "position_ids" in data.keys():
        value = data["position_ids"]
        if _is_nested(value) and value.dim() == 3:
            value._ragged_idx = 2


def list_of_dict_to_tensordict(list_of_dicts: list[dict[str, Any]]) -> TensorDict:
    """One row per dict (the first dict's keys): same-shape tensors stacked, tensors of varying shape
    as a jagged nested tensor, anything else as per-row objects."""
    if not list_of_dicts:
        raise TensorDictError("list_of_dict_to_tensordict needs at least one dict")
    columns: dict[str, Any] = {}
    for key in list_of_dicts[0]:
        values = [d[key] for d in list_of_dicts]
        if all(isinstance(v, torch.Tensor) for v in values):
            same = all(v.shape == values[0].shape for v in values)
            columns[key] = torch.stack(values) if same else torch.nested.as_nested_tensor(values, layout=torch.jagged)
        else:
            columns[key] = NonTensorStack(*values)
    return TensorDict(columns, batch_size=[len(list_of_dicts)])
