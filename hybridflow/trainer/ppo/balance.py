"""``trainer.balance_batch``: reorder a batch so every data-parallel rank gets nearly the same number of
tokens (veRL's ``_balance_batch``). Pure functions; the trainer applies the order to its DataProto.

DP_COMPUTE_PROTO hands rank r the r-th contiguous chunk of B / k rows, so the order lists partition 0's
rows, then partition 1's, ...; each partition has exactly B / k rows (Karmarkar-Karp with equal sizes).
"""

from __future__ import annotations

from typing import Sequence

from hybridflow.workers.utils.micro_batches import balance_partitions

__all__ = ["balanced_order", "seqlen_balance_metrics"]


def balanced_order(seqlens: Sequence[int], k: int) -> list[int] | None:
    """A permutation of ``range(len(seqlens))`` whose k contiguous equal chunks carry nearly equal token
    sums; None when there is nothing to balance (k <= 1) or the rows do not split evenly over k ranks."""
    n = len(seqlens)
    if k <= 1 or n < k or n % k:
        return None
    return [i for part in balance_partitions(list(seqlens), k, equal_size=True) for i in part]


def _chunk_loads(seqlens: Sequence[int], k: int) -> list[int]:
    size = len(seqlens) // k
    return [sum(seqlens[r * size:(r + 1) * size]) for r in range(k)]


def seqlen_balance_metrics(seqlens: Sequence[int], k: int, order: Sequence[int] | None,
                           prefix: str = "global_seqlen") -> dict[str, float]:
    """veRL's metrics: ``min``/``max``/``minmax_diff`` of the tokens per rank as the batch arrived,
    ``balanced_min``/``balanced_max`` after reordering, and the ``mean`` per rank."""
    before = _chunk_loads(seqlens, k)
    after = _chunk_loads([seqlens[i] for i in order], k) if order is not None else before
    return {
        f"{prefix}/min": float(min(before)), f"{prefix}/max": float(max(before)),
        f"{prefix}/minmax_diff": float(max(before) - min(before)),
        f"{prefix}/balanced_min": float(min(after)), f"{prefix}/balanced_max": float(max(after)),
        f"{prefix}/mean": float(sum(before)) / k,
    }
