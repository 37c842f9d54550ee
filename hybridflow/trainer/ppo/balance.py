"""``trainer.balance_batch``: reorder a batch so every data-parallel rank gets nearly the same number of
tokens (veRL's ``_balance_batch``). Pure functions; the trainer applies the order to its DataProto.

DP_COMPUTE_PROTO hands rank r the r-th contiguous chunk of B / k rows, so the order lists partition 0's
rows, then partition 1's, ...; each partition has exactly B / k rows (Karmarkar-Karp with equal sizes).
"""

from __future__ import annotations

from collections.abc import Sequence

from hybridflow.workers.utils.micro_batches import balance_partitions

__all__ = ["balanced_order", "get_group_balanced_partitions", "seqlen_balance_metrics"]


def balanced_order(seqlens: Sequence[int], k: int) -> list[int] | None:
    """A permutation of ``range(len(seqlens))`` whose k contiguous equal chunks carry nearly equal token
    sums; None when there is nothing to balance (k <= 1) or the rows do not split evenly over k ranks."""
    n = len(seqlens)
    if k <= 1 or n < k or n % k:
        return None
    return [i for part in balance_partitions(list(seqlens), k, equal_size=True) for i in part]


def get_group_balanced_partitions(seqlen_list: Sequence[int], uid_list: Sequence, k_partitions: int) -> list[list[int]]:
    """k lists of row indices (each sorted) with nearly equal token sums, where the rows of one group
    (consecutive rows with the same uid: a prompt's responses) stay in one partition, and every
    partition gets the same number of groups (veRL's name; groups sharing a prefix stay on one rank)."""
    if len(seqlen_list) != len(uid_list):
        raise ValueError(f"{len(seqlen_list)} sequence lengths for {len(uid_list)} uids")
    groups: list[list[int]] = []
    for i, uid in enumerate(uid_list):
        if groups and uid_list[groups[-1][0]] == uid:
            groups[-1].append(i)
        else:
            groups.append([i])
    if len(groups) < k_partitions or len(groups) % k_partitions:
        raise ValueError(
            f"{len(groups)} uid groups cannot be split evenly over {k_partitions} partitions; "
            "the number of prompts must be a multiple of the number of ranks"
        )
    loads = [sum(seqlen_list[i] for i in g) for g in groups]
    return [
        sorted(i for g in part for i in groups[g]) for part in balance_partitions(loads, k_partitions, equal_size=True)
    ]


def _chunk_loads(seqlens: Sequence[int], k: int) -> list[int]:
    size = len(seqlens) // k
    return [sum(seqlens[r * size : (r + 1) * size]) for r in range(k)]


def seqlen_balance_metrics(
    seqlens: Sequence[int], k: int, order: Sequence[int] | None, prefix: str = "global_seqlen"
) -> dict[str, float]:
    """veRL's metrics: ``min``/``max``/``minmax_diff`` of the tokens per rank as the batch arrived,
    ``balanced_min``/``balanced_max`` after reordering, and the ``mean`` per rank."""
    before = _chunk_loads(seqlens, k)
    after = _chunk_loads([seqlens[i] for i in order], k) if order is not None else before
    return {
        f"{prefix}/min": float(min(before)),
        f"{prefix}/max": float(max(before)),
        f"{prefix}/minmax_diff": float(max(before) - min(before)),
        f"{prefix}/balanced_min": float(min(after)),
        f"{prefix}/balanced_max": float(max(after)),
        f"{prefix}/mean": float(sum(before)) / k,
    }
