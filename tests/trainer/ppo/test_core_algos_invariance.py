"""Splitting a mini-batch into micro-batches and ranks must not change the loss or its gradient when
agg_loss is given the mini-batch's global token / sequence counts.

Simulation: the batch is permuted, dealt to 2 ranks, and each rank's rows are cut into k micro-batches
(k = 1, 2, 4) of unequal sizes; each micro-batch is re-trimmed to its own longest response (dynamic
padding), so ``seq-mean-token-sum-norm`` receives a fixed ``loss_scale_factor``. The per-micro-batch
losses are summed (gradient accumulation + all-reduce SUM) and compared with the full-batch loss.
"""

import pytest
import torch

from hybridflow.trainer.ppo import core_algos

MODES = ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]
B, L = 12, 7


def _batch(seed=0):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, L + 1, (B,), generator=g)
    lengths[3] = 0  # one response with no valid token
    mask = (torch.arange(L).unsqueeze(0) < lengths.unsqueeze(1)).double()  # (B, L) right-padded
    old = -torch.rand(B, L, generator=g, dtype=torch.float64) * 3
    new = old + 0.4 * torch.randn(B, L, generator=g, dtype=torch.float64)  # ratios that hit every clip branch
    adv = torch.randn(B, L, generator=g, dtype=torch.float64)
    return old, new, adv, mask


def _splits(n_micro, seed):
    """Row-index lists: 2 ranks x n_micro micro-batches of uneven sizes over a permutation."""
    g = torch.Generator().manual_seed(seed)
    perm = torch.randperm(B, generator=g)
    ranks = [perm[:5], perm[5:]]  # uneven ranks (5 and 7 rows)
    out = []
    for rows in ranks:
        cuts = sorted(torch.randperm(len(rows) - 1, generator=g)[: n_micro - 1].add(1).tolist())
        out += [chunk for chunk in torch.tensor_split(rows, cuts) if len(chunk)]
    return out


def _loss(old, new, adv, mask, mode, **counts):
    config = {"clip_ratio": 0.2, "clip_ratio_high": 0.28, "clip_ratio_c": 3.0, "loss_scale_factor": L}
    fn = core_algos.get_policy_loss_fn("vanilla")
    return fn(old, new, adv, mask, mode, config, **counts)[0]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("n_micro", [1, 2, 4])
def test_micro_batch_and_rank_split_is_invariant(mode, n_micro):
    old, new, adv, mask = _batch()
    full_lp = new.clone().requires_grad_(True)
    full = _loss(old, full_lp, adv, mask, mode)
    full.backward()

    token_count, seq_count = core_algos.global_counts(mask)
    split_lp = new.clone().requires_grad_(True)
    total = 0.0
    parts = _splits(n_micro, seed=n_micro)
    assert sorted(torch.cat(parts).tolist()) == list(range(B))
    for rows in parts:
        width = max(int(mask[rows].sum(-1).max()), 1)  # trim the micro-batch to its longest response
        sl = (rows, slice(0, width))
        total = total + _loss(
            old[sl], split_lp[sl], adv[sl], mask[sl], mode, global_token_count=token_count, global_seq_count=seq_count
        )
    total.backward()
    torch.testing.assert_close(total, full)
    torch.testing.assert_close(split_lp.grad, full_lp.grad)
    assert full_lp.grad.abs().sum() > 0


def test_global_counts_add_up_over_micro_batches():
    _, _, _, mask = _batch()
    parts = _splits(4, seed=7)
    tok = sum(core_algos.global_counts(mask[rows])[0] for rows in parts)
    seq = sum(core_algos.global_counts(mask[rows])[1] for rows in parts)
    assert (tok, seq) == tuple(core_algos.global_counts(mask)) == (mask.sum(), torch.tensor(B - 1))


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean"])
def test_without_global_counts_the_split_changes_the_loss(mode):
    # Control: the test above would catch a wrong normaliser. Averaging local means over uneven
    # micro-batches is NOT the full-batch loss.
    old, new, adv, mask = _batch()
    full = _loss(old, new, adv, mask, mode)
    parts = _splits(4, seed=4)
    avg = sum(_loss(old[r], new[r], adv[r], mask[r], mode) for r in parts) / len(parts)
    assert not torch.allclose(avg, full)
