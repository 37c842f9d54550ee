import os

import pytest
import torch
from torch.utils.data import Dataset

from hybridflow.data.sampler import ResumableRandomSampler, create_rl_dataloader, epoch_order


class Ints(Dataset):
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return {"i": torch.tensor(i), "tag": f"s{i}"}


def batches(loader, epochs):
    out = []
    for _ in range(epochs):
        out += [b["i"].tolist() for b in loader]
    return out


def test_epoch_order_is_a_function_of_seed_and_epoch():
    a = epoch_order(50, seed=1, epoch=0)
    assert sorted(a) == list(range(50))
    assert a == epoch_order(50, seed=1, epoch=0)
    assert a != epoch_order(50, seed=1, epoch=1)
    assert a != epoch_order(50, seed=2, epoch=0)
    assert epoch_order(5, seed=1, epoch=3, shuffle=False) == [0, 1, 2, 3, 4]
    torch.manual_seed(0)
    x = epoch_order(50, 1, 0)
    torch.manual_seed(99)
    assert x == epoch_order(50, 1, 0)  # global RNG plays no part


def test_sampler_walks_epochs_and_resumes_from_state():
    s = ResumableRandomSampler(6, seed=3)
    it = iter(s)
    first = [next(it) for _ in range(4)]
    state = s.state_dict()
    assert state == {"epoch": 0, "position": 4, "seed": 3}
    rest = list(it)
    assert first + rest == epoch_order(6, 3, 0) and s.state_dict()["epoch"] == 1
    s2 = ResumableRandomSampler(6, seed=3)
    s2.load_state_dict(state)
    assert list(s2) == rest
    assert list(s2) == epoch_order(6, 3, 1)
    with pytest.raises(ValueError, match="seed 3"):
        ResumableRandomSampler(6, seed=4).load_state_dict(state)


@pytest.mark.parametrize("k", [0, 1, 2, 3, 5])
@pytest.mark.parametrize("drop_last", [True, False])
def test_resumed_loader_continues_the_uninterrupted_sequence(k, drop_last):
    ds = Ints(10)  # batch 4 -> 2 batches/epoch (drop_last) or 3 (last one of 2 samples)
    ref_loader = create_rl_dataloader(ds, batch_size=4, seed=5, drop_last=drop_last)
    per_epoch = 2 if drop_last else 3
    assert len(ref_loader) == per_epoch
    ref = batches(ref_loader, 3)
    assert len(ref) == 3 * per_epoch
    assert ref[0] == epoch_order(10, 5, 0)[:4] and ref[per_epoch] == epoch_order(10, 5, 1)[:4]

    # consume k batches (crossing an epoch boundary for k >= per_epoch), then "crash"
    loader = create_rl_dataloader(ds, batch_size=4, seed=5, drop_last=drop_last)
    seen, epochs_started = [], 0
    while len(seen) < k:
        epochs_started += 1
        for b in loader:
            seen.append(b["i"].tolist())
            if len(seen) == k:
                break
    state = loader.state_dict()
    assert state["epoch"] == k // per_epoch and state["batches"] == k % per_epoch

    resumed = create_rl_dataloader(ds, batch_size=4, seed=5, drop_last=drop_last)
    resumed.load_state_dict(state)
    rest = []
    while len(seen) + len(rest) < len(ref):
        rest += [b["i"].tolist() for b in resumed]
    assert seen + rest == ref


def test_loader_yields_collated_dicts_and_checks_state():
    loader = create_rl_dataloader(Ints(8), batch_size=3, seed=0, shuffle=False)
    got = list(loader)
    assert [b["i"].tolist() for b in got] == [[0, 1, 2], [3, 4, 5]]
    assert got[0]["tag"].dtype == object and list(got[0]["tag"]) == ["s0", "s1", "s2"]
    other = create_rl_dataloader(Ints(8), batch_size=2, seed=0)
    with pytest.raises(ValueError, match="batch_size=3"):
        other.load_state_dict(loader.state_dict())
    with pytest.raises(ValueError, match="fewer than batch_size=16"):
        create_rl_dataloader(Ints(8), batch_size=16)


def test_rl_dataset_through_the_loader(tiny_data_dir, tiny_tokenizer):
    from hybridflow.data.rl_dataset import RLHFDataset

    ds = RLHFDataset(os.path.join(tiny_data_dir, "train.parquet"), tiny_tokenizer, {"max_prompt_length": 128})
    loader = create_rl_dataloader(ds, batch_size=16, seed=0)
    assert len(loader) == 4
    got = list(loader)
    order = epoch_order(64, 0, 0)
    assert [b["index"].tolist() for b in got] == [order[i : i + 16] for i in range(0, 64, 16)]
    assert got[0]["input_ids"].shape == (16, 128)
