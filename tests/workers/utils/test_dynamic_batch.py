"""veRL's dynamic-batch API (rearrange_micro_batches, prepare_dynamic_batch, restore_dynamic_batch,
get_reverse_idx) and the uid-group balancing: every row once, within budget, balanced, order restored."""

import pytest
import torch
from tensordict import TensorDict

from hybridflow.protocol import DataProto
from hybridflow.trainer.ppo.balance import get_group_balanced_partitions
from hybridflow.workers.utils.dynamic_batch import (
    get_reverse_idx,
    get_seqlen_balanced_partitions,
    prepare_dynamic_batch,
    rearrange_micro_batches,
    restore_dynamic_batch,
)

LENGTHS = [5, 9, 3, 7, 2, 8]  # 34 tokens


def _tensordict(lengths, width=12):
    n = len(lengths)
    mask = (torch.arange(width).expand(n, width) >= width - torch.tensor(lengths).unsqueeze(1)).long()  # left padded
    return TensorDict({"attention_mask": mask, "row_id": torch.arange(n)}, batch_size=[n])


def _loads(parts, lengths=LENGTHS):
    return [sum(lengths[i] for i in p) for p in parts]


def test_get_reverse_idx():
    assert get_reverse_idx([2, 0, 1]) == [1, 2, 0]  # row 0 came from position 1 of [2, 0, 1]


def test_rearrange_fits_the_budget_balances_and_restores():
    micro, parts = rearrange_micro_batches(_tensordict(LENGTHS), max_token_len=12)
    assert sorted(i for p in parts for i in p) == list(range(6))
    assert len(parts) == 3  # ceil(34 / 12) = 3 micro-batches suffice
    loads = _loads(parts)
    assert max(loads) <= 12 and max(loads) - min(loads) <= 2  # 34 over 3: 11/11/12 is the best split
    for m, p in zip(micro, parts):
        assert m["row_id"].tolist() == p
    restored = restore_dynamic_batch(torch.cat([m["row_id"] * 10 for m in micro]), parts)
    assert restored.tolist() == [10 * i for i in range(6)]


def test_rearrange_options():
    _, parts = rearrange_micro_batches(_tensordict(LENGTHS), 30, num_batches_divided_by=2)
    assert len(parts) == 2  # ceil(34 / 30) = 2, already even
    _, parts = rearrange_micro_batches(_tensordict(LENGTHS), 40, min_num_micro_batch=5)
    assert len(parts) == 5
    _, parts = rearrange_micro_batches(_tensordict(LENGTHS), 17, force_group_size=2)  # pairs (0,1), (2,3), (4,5)
    assert all(p == sorted(p) and all(p[j] // 2 == p[j + 1] // 2 for j in range(0, len(p), 2)) for p in parts)
    assert max(_loads(parts)) <= 17
    with pytest.raises(ValueError, match="divisible by force_group_size"):
        rearrange_micro_batches(_tensordict(LENGTHS), 40, force_group_size=4)
    with pytest.raises(ValueError, match="max_token_len"):
        rearrange_micro_batches(_tensordict(LENGTHS), 8)
    with pytest.raises(ValueError, match="micro-batches"):
        rearrange_micro_batches(_tensordict(LENGTHS), 40, min_num_micro_batch=7)  # more than rows


def test_balanced_order_puts_light_micro_batches_at_both_ends():
    lengths = [10, 9, 8, 7, 6]  # budget 10: no two rows fit together, five micro-batches of one row
    _, parts = rearrange_micro_batches(_tensordict(lengths), 10)
    # heaviest first is 10 9 8 7 6; every other one reversed, then the rest: 6 8 10 | 9 7
    assert _loads(parts, lengths) == [6, 8, 10, 9, 7]
    _, parts = rearrange_micro_batches(_tensordict(lengths), 10, use_dynamic_bsz_balance=False)
    assert _loads(parts, lengths)[0] == 10  # heaviest first without the pipeline order


def test_prepare_dynamic_batch_keeps_rows_aligned():
    td = _tensordict(LENGTHS)
    data = DataProto.from_dict(
        {"attention_mask": td["attention_mask"], "row_id": td["row_id"]},
        non_tensors={"tag": [f"r{i}" for i in range(6)]},
        meta_info={"temperature": 0.7},
    )
    micro, parts = prepare_dynamic_batch(data, 12)
    for m, p in zip(micro, parts):
        assert m.batch["row_id"].tolist() == p and list(m.non_tensor_batch["tag"]) == [f"r{i}" for i in p]
        assert m.meta_info["temperature"] == 0.7
    assert restore_dynamic_batch(torch.cat([m.batch["row_id"] for m in micro]), parts).tolist() == list(range(6))


def test_restore_keeps_a_nested_tensor_nested():
    rows = [torch.arange(n) for n in (3, 1, 2)]  # original rows 2, 0, 1 (micro-batches [2] and [0, 1])
    nested = torch.nested.as_nested_tensor(rows, layout=torch.jagged)
    restored = restore_dynamic_batch(nested, [[2], [0, 1]])
    assert restored.is_nested
    assert [t.tolist() for t in restored.unbind()] == [[0], [0, 1], [0, 1, 2]]


def test_group_balanced_partitions_keep_uid_groups_together():
    seqlens = [4, 4, 1, 1, 3, 3, 2, 2]  # groups a:8 b:2 c:6 d:4 -> best split 10 / 10
    uids = ["a", "a", "b", "b", "c", "c", "d", "d"]
    parts = get_group_balanced_partitions(seqlens, uids, 2)
    assert sorted(_loads(parts, seqlens)) == [10, 10]
    for p in parts:
        assert p == sorted(p) and len(p) == 4 and all(uids[i] == uids[i ^ 1] and (i ^ 1) in p for i in p)
    with pytest.raises(ValueError, match="cannot be split evenly"):
        get_group_balanced_partitions(seqlens, uids, 3)
    with pytest.raises(ValueError, match="uids"):
        get_group_balanced_partitions(seqlens, uids[:-1], 2)


def test_seqlen_balanced_partitions_with_verl_keywords():
    parts = get_seqlen_balanced_partitions(seqlen_list=[1, 2, 3, 4, 5, 6, 7, 8], k_partitions=4, equal_size=True)
    assert sorted(_loads(parts, [1, 2, 3, 4, 5, 6, 7, 8])) == [9, 9, 9, 9]
