"""Micro-batches: cutting a batch, stitching results back, and turning many micro-batch backward
passes into one correct optimizer step (veRL's seqlen_balancing + the accumulation loop's helpers).

Two ways to cut:

- ``split_fixed``: ``micro_batch_size`` rows each (the last one may be smaller).
- ``split_by_token_budget``: as few micro-batches as possible such that each holds at most
  ``max_token_len`` tokens (``attention_mask.sum`` per row), with the rows spread so that the
  micro-batches carry nearly equal token totals (a balanced partition, not first-fit: first-fit
  leaves a long tail of small micro-batches that waste a forward each). The rows come back in a
  different order; ``restore_order`` undoes it with the returned indices (veRL's
  ``restore_dynamic_batch`` / ``get_reverse_idx`` on one tensor). ``token_budget_partitions`` is
  the partitioning step; ``dynamic_batch.py`` offers it under veRL's names and options.

``balance_partitions`` is the pure partitioning step (Karmarkar-Karp largest differencing), also
usable by the trainer to give every data-parallel rank the same number of rows and nearly the same
number of tokens (veRL's ``balance_batch``).
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import math
from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

__all__ = [
    "split_fixed",
    "split_by_token_budget",
    "token_budget_partitions",
    "split_for_forward",
    "split_for_update",
    "restore_order",
    "restore_dynamic_batch",
    "get_reverse_idx",
    "balance_partitions",
    "take_rows",
    "GlobalBatchInfo",
    "global_batch_info",
    "dp_size_of",
    "response_mask_of",
    "sync_group",
    "grad_sync",
    "clip_grad_and_step",
    "MetricBuffer",
    "accumulate",
]


def take_rows(data, indices):
    """Rows ``indices`` of a DataProto, in that order (batch, non-tensor batch and meta_info kept aligned)."""
    return data.select_idxs(torch.as_tensor(indices, dtype=torch.long))


def split_fixed(data, micro_batch_size: int) -> list:
    """Consecutive micro-batches of ``micro_batch_size`` rows (the last may be smaller)."""
    if micro_batch_size is None or micro_batch_size < 1:
        raise ValueError(f"micro_batch_size must be a positive int, got {micro_batch_size!r}")
    return data.split(micro_batch_size)


# ---------------------------------------------------------------------------------------------
# Balanced partitioning
# ---------------------------------------------------------------------------------------------


def balance_partitions(seqlens: Sequence[int], k: int, equal_size: bool = True) -> list[list[int]]:
    """Split the indices of ``seqlens`` into ``k`` groups whose sums are as equal as possible.

    Karmarkar-Karp for k-way partitions: every item starts as a k-tuple of bins (the item in one
    bin), and the two tuples with the largest spread (max - min bin sum) are merged repeatedly by
    putting the heaviest bin of one with the lightest bin of the other, which cancels the spreads.
    With ``equal_size`` the sorted items are first grouped k at a time, one per bin, so every bin
    receives exactly one item per group: all bins get ``len(seqlens) / k`` items.

    Returns ``k`` lists of indices, each sorted ascending; the lists are ordered heaviest first.
    """
    n = len(seqlens)
    if not 1 <= k <= n:
        raise ValueError(f"cannot split {n} items into {k} non-empty partitions")
    if equal_size and n % k:
        raise ValueError(f"equal_size needs len(seqlens) ({n}) divisible by k ({k})")

    order = sorted(range(n), key=lambda i: (seqlens[i], i))
    # A state is a list of k bins (sum, indices).
    if equal_size:
        states = [[(seqlens[i], [i]) for i in order[g : g + k]] for g in range(0, n, k)]
    else:
        states = [[(seqlens[i], [i])] + [(0, []) for _ in range(k - 1)] for i in order]

    tie = itertools.count()  # heap tie-breaker, so bins are never compared

    def entry(bins):
        sums = [s for s, _ in bins]
        return (-(max(sums) - min(sums)), next(tie), bins)

    heap = [entry(state) for state in states]
    heapq.heapify(heap)
    while len(heap) > 1:
        a = heapq.heappop(heap)[2]
        b = heapq.heappop(heap)[2]
        a = sorted(a, key=lambda x: x[0], reverse=True)  # heaviest first
        b = sorted(b, key=lambda x: x[0])  # lightest first
        heapq.heappush(heap, entry([(sa + sb, ia + ib) for (sa, ia), (sb, ib) in zip(a, b)]))

    bins = [list(ix) for _, ix in heap[0][2]]
    _fill_empty_bins(bins, seqlens)
    bins = [sorted(ix) for ix in bins]
    bins.sort(key=lambda ix: (-sum(seqlens[i] for i in ix), ix))
    return bins


def _fill_empty_bins(bins: list[list[int]], seqlens: Sequence[int]) -> None:
    # Karmarkar-Karp can in principle leave a bin empty when items are very uneven; a micro-batch
    # must hold at least one row, so move the lightest item of the most crowded bin there.
    for empty in [b for b in bins if not b]:
        donor = max(bins, key=len)
        lightest = min(donor, key=lambda i: seqlens[i])
        donor.remove(lightest)
        empty.append(lightest)


# ---------------------------------------------------------------------------------------------
# Token-budget micro-batches
# ---------------------------------------------------------------------------------------------


def _fitting_partition(seqlens: list[int], max_token_len: int, k: int, step: int = 1) -> tuple[int, list[list[int]]]:
    """Smallest k' = k, k + step, ... whose balanced partition keeps every bin within the budget."""
    for k_try in range(k, len(seqlens) + 1, step):
        parts = balance_partitions(seqlens, k_try, equal_size=False)
        if max(sum(seqlens[i] for i in p) for p in parts) <= max_token_len:
            return k_try, parts
    raise ValueError(
        f"cannot cut {len(seqlens)} rows into {k} or more micro-batches (a multiple of {step}) "
        f"of at most {max_token_len} tokens each; every micro-batch needs a row"
    )


def _collective_device(group) -> torch.device:
    """NCCL only reduces CUDA tensors; gloo takes CPU ones."""
    if dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _all_reduce_max(value: int, group) -> int:
    t = torch.tensor([value], dtype=torch.long, device=_collective_device(group))
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return int(t.item())


def token_budget_partitions(
    seqlens: Sequence[int], max_token_len: int, dp_group=None, min_micro_batches: int = 1, multiple_of: int = 1
) -> list[list[int]]:
    """Row indices of as few micro-batches as possible (at least ``min_micro_batches``, a multiple of
    ``multiple_of``: pipeline stages) of at most ``max_token_len`` tokens each, with nearly equal
    token totals; heaviest micro-batch first.

    k starts at ceil(total / max_token_len) and grows until every balanced bin fits. With
    ``dp_group`` (and torch.distributed initialised) every rank of the group uses the largest k of
    the group, so all ranks run the same number of forward/backward passes and collectives inside
    them (FSDP all-gathers) stay in step.
    """
    seqlens = list(seqlens)
    if not seqlens:
        raise ValueError("cannot split an empty batch")
    longest = max(seqlens)
    if longest > max_token_len:
        raise ValueError(f"a row has {longest} tokens, more than max_token_len={max_token_len}; raise the budget")
    if multiple_of < 1 or min_micro_batches < 1:
        raise ValueError(f"min_micro_batches ({min_micro_batches}) and multiple_of ({multiple_of}) must be >= 1")
    k = max(math.ceil(sum(seqlens) / max_token_len), min_micro_batches)
    k = math.ceil(k / multiple_of) * multiple_of
    k, parts = _fitting_partition(seqlens, max_token_len, k, multiple_of)
    if dp_group is not None and dist.is_available() and dist.is_initialized():
        # Agree on the largest k; a rank whose partition with that k does not fit (rare: KK is not
        # monotone in k) asks for more, and the group agrees again.
        agreed = None
        while True:
            k = _all_reduce_max(k, dp_group)
            if k == agreed:
                break
            if k > len(seqlens):
                raise ValueError(
                    f"another data-parallel rank needs {k} micro-batches but this rank has only "
                    f"{len(seqlens)} rows; give every rank the same number of rows"
                )
            agreed = k
            k, parts = _fitting_partition(seqlens, max_token_len, agreed, multiple_of)
    return parts


def split_by_token_budget(data, max_token_len: int, dp_group=None) -> tuple[list, list[list[int]]]:
    """Micro-batches of at most ``max_token_len`` tokens each, balanced by token count
    (``token_budget_partitions`` over ``attention_mask.sum`` per row). Returns (micro-batches,
    indices): micro-batch j holds rows ``indices[j]`` of ``data``; pass ``indices`` to ``restore_order``.
    """
    seqlens = data.batch["attention_mask"].sum(dim=-1).tolist()  # one host sync per split, outside the hot loop
    parts = token_budget_partitions(seqlens, max_token_len, dp_group)
    return [take_rows(data, p) for p in parts], parts


def split_for_forward(
    data, use_dynamic_bsz: bool, max_token_len: int | None, micro_batch_size: int | None, dp_group=None
) -> tuple[list, list[list[int]] | None]:
    """Micro-batches for a no-grad forward pass (log-probs, values): by token budget, with the same
    count on every rank of the group (FSDP all-gathers inside each forward must pair up), or
    ``micro_batch_size`` rows each. Returns (micro-batches, indices or None); pass both results'
    pieces and the indices to ``restore_order``."""
    if use_dynamic_bsz:
        return split_by_token_budget(data, max_token_len, dp_group=sync_group(dp_group))
    return split_fixed(data, micro_batch_size), None


def split_for_update(
    mini_batch, use_dynamic_bsz: bool, max_token_len: int | None, micro_batch_size: int | None, dp_group=None
) -> list:
    """The micro-batches of one optimizer step: ``max_token_len`` tokens each (same count on every
    rank: collectives inside forward/backward) when ``use_dynamic_bsz``, else ``micro_batch_size`` rows each."""
    if use_dynamic_bsz:
        return split_by_token_budget(mini_batch, max_token_len, dp_group=sync_group(dp_group))[0]
    return split_fixed(mini_batch, micro_batch_size)


def get_reverse_idx(idx_map: Sequence[int]) -> list[int]:
    """The inverse permutation: ``out[idx_map[i]] = i`` (where row i of a reordered batch came from)."""
    reverse = [0] * len(idx_map)
    for i, idx in enumerate(idx_map):
        reverse[idx] = i
    return reverse


def restore_dynamic_batch(data: torch.Tensor, batch_idx_list: Sequence[Sequence[int]]) -> torch.Tensor:
    """Rows of ``data``, concatenated in micro-batch order (micro-batch j holds original rows
    ``batch_idx_list[j]``), back in the original order; a jagged nested tensor stays nested."""
    flat = [i for part in batch_idx_list for i in part]
    if len(flat) != data.shape[0]:
        raise ValueError(f"{data.shape[0]} rows of results for {len(flat)} indices")
    inverse = get_reverse_idx(flat)
    if data.is_nested:
        rows = data.unbind()
        return torch.nested.as_nested_tensor([rows[i] for i in inverse], layout=torch.jagged)
    return data[torch.as_tensor(inverse, dtype=torch.long, device=data.device)]


def restore_order(
    tensors_in_micro_order: Sequence[torch.Tensor], indices: Sequence[Sequence[int]] | None
) -> torch.Tensor:
    """Concatenate per-micro-batch results and put the rows back in the original order (``indices``
    None: the micro-batches were consecutive, concatenation is the order)."""
    stacked = torch.cat(list(tensors_in_micro_order), dim=0)
    return stacked if indices is None else restore_dynamic_batch(stacked, indices)


# ---------------------------------------------------------------------------------------------
# One optimizer step from many micro-batches
# ---------------------------------------------------------------------------------------------
#
# Normalisation. A mini-batch is spread over W data-parallel ranks and, on each rank, over several
# micro-batches. Each micro-batch loss is aggregated with the token / sequence counts of the WHOLE
# mini-batch (all micro-batches, all ranks) and dp_size=W (veRL's global_batch_info; see
# core_algos.agg_loss), so it is W * (its share of the full-batch loss L). FSDP and DDP AVERAGE
# gradients over ranks: mean_r(W * grad(share_r)) = sum_r grad(share_r) = grad(L).
# The update is then the full-batch update whatever the micro-batch size, token budget or W.


class GlobalBatchInfo:
    """Totals of one mini-batch over all its micro-batches and data-parallel ranks."""

    def __init__(self, token_count: torch.Tensor, seq_count: torch.Tensor, dp_size: int):
        self.token_count = token_count  # valid response tokens (0-d tensor, stays on device)
        self.seq_count = seq_count  # sequences with at least one valid token
        self.dp_size = dp_size

    def agg_kwargs(self) -> dict:
        """veRL's global_batch_info: keyword arguments for core_algos.agg_loss / the value loss."""
        return {"dp_size": self.dp_size, "batch_num_tokens": self.token_count, "global_batch_size": self.seq_count}


def response_mask_of(batch) -> torch.Tensor:
    """``response_mask`` if the batch has one, else the response part of ``attention_mask``."""
    if "response_mask" in batch.keys():
        return batch["response_mask"]
    return batch["attention_mask"][:, -batch["responses"].shape[-1] :]


def sync_group(dp_group=None):
    """The group whose ranks must run the same number of micro-batches: ``dp_group``, else the
    whole world when torch.distributed is initialised, else None (single process)."""
    if dp_group is not None:
        return dp_group
    return dist.group.WORLD if dist.is_available() and dist.is_initialized() else None


def grad_sync(module: torch.nn.Module, sync: bool):
    """DDP all-reduces on every backward; skip it for all but the last micro-batch of a step.
    (FSDP keeps its per-micro-batch reduce-scatter: skipping it would keep unsharded gradients.)"""
    if isinstance(module, DistributedDataParallel) and not sync:
        return module.no_sync()
    return contextlib.nullcontext()


def dp_size_of(dp_group=None) -> int:
    """World size of ``dp_group`` (default group when None); 1 without torch.distributed."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size(dp_group)
    return 1


def global_batch_info(response_mask: torch.Tensor, dp_group=None) -> GlobalBatchInfo:
    """Token and sequence counts of this rank's mini-batch, summed over ``dp_group``.

    Counts as core_algos' agg_loss does: tokens = mask.sum(), sequences = rows with a valid token.
    """
    counts = torch.stack([response_mask.sum(), (response_mask.sum(dim=-1) > 0).sum()]).long()  # (2,)
    dp_size = dp_size_of(dp_group)
    if dp_size > 1:
        counts = counts.to(_collective_device(dp_group))
        dist.all_reduce(counts, op=dist.ReduceOp.SUM, group=dp_group)
        counts = counts.to(response_mask.device)
    return GlobalBatchInfo(counts[0], counts[1], dp_size)


def clip_grad_and_step(
    module: torch.nn.Module, optimizer, grad_clip: float | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Clip gradients, step unless the gradient norm is not finite, zero the gradients.

    Returns (grad_norm, skipped) as 0-d tensors; grad_norm is NaN for a skipped step. A NaN/inf
    update is never applied: one bad batch would otherwise destroy the weights. Deciding to skip is
    the one host sync per optimizer step.
    """
    max_norm = float("inf") if not grad_clip else float(grad_clip)
    if hasattr(module, "clip_grad_norm_"):  # FSDP1 knows its sharded parameters
        grad_norm = module.clip_grad_norm_(max_norm)
    else:  # plain / DDP / FSDP2 (DTensor parameters are handled by torch)
        grad_norm = torch.nn.utils.clip_grad_norm_(module.parameters(), max_norm)
    if hasattr(grad_norm, "full_tensor"):  # FSDP2 returns a DTensor
        grad_norm = grad_norm.full_tensor()
    grad_norm = grad_norm.detach()
    finite = bool(torch.isfinite(grad_norm))
    if finite:
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    skipped = torch.tensor(0.0 if finite else 1.0)
    return (grad_norm if finite else torch.full_like(grad_norm, float("nan"))), skipped


def accumulate(metrics: dict, key: str, value: torch.Tensor) -> None:
    """``metrics[key] += value`` (summing one optimizer step's micro-batch contributions)."""
    metrics[key] = metrics[key] + value if key in metrics else value


class MetricBuffer:
    """Metric values kept as tensors during the update, turned into floats once at the end."""

    def __init__(self):
        self._values: dict[str, list] = {}

    def add(self, key: str, value) -> None:
        self._values.setdefault(key, []).append(value)

    def add_all(self, metrics: dict) -> None:
        for key, value in metrics.items():
            self.add(key, value)

    def to_floats(self) -> dict[str, list[float]]:
        """``{key: [float, ...]}`` with a single device-to-host copy for all tensor values."""
        tensors = [v for vs in self._values.values() for v in vs if isinstance(v, torch.Tensor)]
        if tensors:
            device = tensors[0].device
            flat = torch.stack([t.detach().to(device=device, dtype=torch.float32).reshape(()) for t in tensors])
            host = iter(flat.cpu().tolist())
        out = {}
        for key, values in self._values.items():
            out[key] = [next(host) if isinstance(v, torch.Tensor) else float(v) for v in values]
        return out
