"""veRL's dynamic-batch API (``verl.utils.seqlen_balancing``): ``rearrange_micro_batches`` over a
TensorDict and ``prepare_dynamic_batch`` over a DataProto, both on hybridflow's token-budget
partitioning (``micro_batches.token_budget_partitions``).

Differences from veRL, on purpose: micro-batches are balanced by token count (veRL weighs each row
by an attention-cost estimate, 24576·s + s², which orders rows the same way for rows of similar
length); the budget, the micro-batch count agreed over the data-parallel group, the rounding to a
multiple of the pipeline stages and the kept-together groups are the same.
"""

from __future__ import annotations

import torch

from hybridflow.workers.utils.micro_batches import (
    balance_partitions,
    get_reverse_idx,
    restore_dynamic_batch,
    take_rows,
    token_budget_partitions,
)

__all__ = [
    "rearrange_micro_batches",
    "prepare_dynamic_batch",
    "restore_dynamic_batch",
    "get_reverse_idx",
    "get_seqlen_balanced_partitions",
    "micro_batch_partitions",
]


def get_seqlen_balanced_partitions(seqlen_list: list[int], k_partitions: int, equal_size: bool) -> list[list[int]]:
    """veRL's keywords for ``balance_partitions``: k index lists (each sorted) with nearly equal sums."""
    return balance_partitions(seqlen_list, k_partitions, equal_size=equal_size)


def _row_token_counts(batch) -> list[int]:
    """Tokens per row: a jagged ``input_ids``' lengths, else ``attention_mask.sum``."""
    input_ids = batch.get("input_ids", None) if hasattr(batch, "get") else None
    if input_ids is not None and input_ids.is_nested:
        return input_ids.offsets().diff().tolist()
    return batch["attention_mask"].sum(dim=-1).tolist()


def _pipeline_friendly(parts: list[list[int]], weights: list[int]) -> list[list[int]]:
    """Heaviest micro-batches in the middle, lighter ones at both ends: a pipeline's warm-up and
    cool-down then wait on short micro-batches (veRL's use_dynamic_bsz_balance order)."""
    ordered = sorted(parts, key=lambda p: (sum(weights[i] for i in p), p[0] if p else 0), reverse=True)
    return ordered[::2][::-1] + ordered[1::2]


def micro_batch_partitions(
    seqlens: list[int],
    max_token_len: int,
    dp_group=None,
    num_batches_divided_by=None,
    same_micro_num_in_dp: bool = True,
    min_num_micro_batch=None,
    use_dynamic_bsz_balance: bool = True,
    force_group_size: int = 1,
) -> list[list[int]]:
    """Row indices of each micro-batch, with veRL's options: ``force_group_size`` consecutive rows
    stay together (pairs of a reward model's chosen / rejected answers), ``num_batches_divided_by``
    rounds the count up to a multiple (pipeline stages), ``min_num_micro_batch`` is a floor, and
    with ``same_micro_num_in_dp`` every rank of ``dp_group`` gets the same count."""
    if force_group_size < 1 or len(seqlens) % force_group_size:
        raise ValueError(f"batch size {len(seqlens)} must be divisible by force_group_size {force_group_size}")
    group_lens = [sum(seqlens[g : g + force_group_size]) for g in range(0, len(seqlens), force_group_size)]
    if max(group_lens, default=0) > max_token_len:
        raise ValueError(
            f"a group of {force_group_size} rows has {max(group_lens)} tokens, more than "
            f"max_token_len={max_token_len}; raise the budget"
        )
    group_parts = token_budget_partitions(
        group_lens,
        max_token_len,
        dp_group if same_micro_num_in_dp else None,
        min_micro_batches=min_num_micro_batch or 1,
        multiple_of=num_batches_divided_by or 1,
    )
    if use_dynamic_bsz_balance:
        group_parts = _pipeline_friendly(group_parts, group_lens)
    return [[g * force_group_size + j for g in part for j in range(force_group_size)] for part in group_parts]


def rearrange_micro_batches(
    batch,
    max_token_len: int,
    dp_group=None,
    num_batches_divided_by=None,
    same_micro_num_in_dp: bool = True,
    min_num_micro_batch=None,
    use_dynamic_bsz_balance: bool = True,
    force_group_size: int = 1,
):
    """(micro-batches of ``batch`` (a TensorDict), the original row indices of each): see
    ``micro_batch_partitions``. Undo the order of results with ``restore_dynamic_batch``."""
    parts = micro_batch_partitions(
        _row_token_counts(batch),
        max_token_len,
        dp_group,
        num_batches_divided_by,
        same_micro_num_in_dp,
        min_num_micro_batch,
        use_dynamic_bsz_balance,
        force_group_size,
    )
    return [batch[torch.as_tensor(p, dtype=torch.long)] for p in parts], parts


def prepare_dynamic_batch(
    data,
    max_token_len: int,
    dp_group=None,
    num_batches_divided_by=None,
    same_micro_num_in_dp: bool = True,
    min_num_micro_batch=None,
    use_dynamic_bsz_balance: bool = True,
):
    """``rearrange_micro_batches`` for a DataProto: (micro-batch DataProtos with their non-tensor rows
    and meta_info, the original row indices of each)."""
    parts = micro_batch_partitions(
        _row_token_counts(data.batch),
        max_token_len,
        dp_group,
        num_batches_divided_by,
        same_micro_num_in_dp,
        min_num_micro_batch,
        use_dynamic_bsz_balance,
    )
    return [take_rows(data, p) for p in parts], parts
