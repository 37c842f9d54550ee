"""Resumable shuffling: the sample order of an epoch is a pure function of (seed, epoch), and the
loader records how far into the epoch it got, so a run restored from a checkpoint sees exactly the
batches an uninterrupted run would have seen.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from hybridflow.data.rl_dataset import collate_fn as default_collate_fn


def epoch_order(data_len: int, seed: int, epoch: int, shuffle: bool = True) -> list[int]:
    """The sample order of one epoch; independent of any global RNG."""
    if not shuffle:
        return list(range(data_len))
    return np.random.default_rng([int(seed), int(epoch)]).permutation(data_len).tolist()


class ResumableRandomSampler(Sampler[int]):
    """Yields the rest of the current epoch from ``position``; when the epoch is exhausted the epoch
    counter advances and ``position`` returns to 0.

    ``position`` counts samples handed out. Under a DataLoader that prefetches, that runs ahead of the
    samples actually consumed; ``StatefulDataLoader`` therefore keeps the authoritative count.
    """

    def __init__(self, data_len: int, seed: int = 0, shuffle: bool = True):
        if data_len <= 0:
            raise ValueError(f"cannot sample from an empty dataset (data_len={data_len})")
        self.data_len, self.seed, self.shuffle = int(data_len), int(seed), bool(shuffle)
        self.epoch, self.position = 0, 0

    def __len__(self) -> int:
        return self.data_len

    def __iter__(self) -> Iterator[int]:
        order = epoch_order(self.data_len, self.seed, self.epoch, self.shuffle)
        while self.position < self.data_len:
            idx = order[self.position]
            self.position += 1
            yield idx
        self.epoch, self.position = self.epoch + 1, 0

    def set_epoch(self, epoch: int, position: int = 0) -> None:
        self.epoch, self.position = int(epoch), int(position)

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "position": self.position, "seed": self.seed}

    def load_state_dict(self, state: dict) -> None:
        if int(state["seed"]) != self.seed:
            raise ValueError(f"sampler state has seed {state['seed']} but this sampler was built with seed {self.seed}")
        if not 0 <= int(state["position"]) <= self.data_len:
            raise ValueError(f"sampler position {state['position']} is outside a dataset of {self.data_len} samples")
        self.set_epoch(state["epoch"], state["position"])


class StatefulDataLoader:
    """Iterates batches (dicts from ``collate_fn``) of the current epoch; one ``for`` loop is one epoch
    (the remainder of it after a resume). ``state_dict`` counts batches the caller has received."""

    def __init__(
        self,
        dataset: Dataset,
        batch_size: int,
        sampler: ResumableRandomSampler,
        collate_fn,
        drop_last: bool = True,
        num_workers: int = 0,
    ):
        if batch_size <= 0:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        if drop_last and len(dataset) < batch_size:
            raise ValueError(
                f"dataset has {len(dataset)} samples, fewer than batch_size={batch_size} with drop_last=True: "
                "no batch would ever be produced"
            )
        self.dataset, self.batch_size, self.sampler = dataset, int(batch_size), sampler
        self.collate_fn, self.drop_last, self.num_workers = collate_fn, drop_last, num_workers
        self.epoch, self.batches_in_epoch = 0, 0

    def __len__(self) -> int:
        n = len(self.dataset)
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def __iter__(self):
        if self.batches_in_epoch >= len(self):  # a state saved at the very end of an epoch
            self.epoch, self.batches_in_epoch = self.epoch + 1, 0
        # full batches always precede the last (partial or dropped) one, so batches * batch_size is exact
        self.sampler.set_epoch(self.epoch, self.batches_in_epoch * self.batch_size)
        # an own generator: DataLoader draws a base seed per iterator, which must not advance the
        # global torch RNG (in-process workers sample with it; a resume would shift their stream)
        loader = DataLoader(
            self.dataset,
            batch_size=self.batch_size,
            sampler=self.sampler,
            collate_fn=self.collate_fn,
            drop_last=self.drop_last,
            num_workers=self.num_workers,
            generator=torch.Generator().manual_seed(self.sampler.seed),
        )
        for batch in loader:
            # count the batch before handing it out: a checkpoint taken while the caller holds the
            # epoch's last batch must resume at the next epoch
            self.batches_in_epoch += 1
            if self.batches_in_epoch == len(self):
                self.epoch, self.batches_in_epoch = self.epoch + 1, 0
            yield batch
            if self.batches_in_epoch == 0:
                return

    def state_dict(self) -> dict:
        return {
            "epoch": self.epoch,
            "position": self.batches_in_epoch * self.batch_size,
            "batches": self.batches_in_epoch,
            "seed": self.sampler.seed,
            "batch_size": self.batch_size,
        }

    def load_state_dict(self, state: dict) -> None:
        if int(state.get("batch_size", self.batch_size)) != self.batch_size:
            raise ValueError(
                f"loader state was saved with batch_size={state['batch_size']}, this loader uses {self.batch_size}"
            )
        if int(state["seed"]) != self.sampler.seed:
            raise ValueError(
                f"loader state has seed {state['seed']} but this loader was built with seed {self.sampler.seed}"
            )
        self.epoch, self.batches_in_epoch = int(state["epoch"]), int(state["batches"])


def create_rl_dataloader(
    dataset: Dataset,
    batch_size: int,
    seed: int = 0,
    shuffle: bool = True,
    drop_last: bool = True,
    num_workers: int = 0,
    collate_fn=None,
) -> StatefulDataLoader:
    """A resumable loader over an ``RLHFDataset`` (or any dataset whose items ``collate_fn`` stacks)."""
    sampler = ResumableRandomSampler(len(dataset), seed=seed, shuffle=shuffle)
    return StatefulDataLoader(
        dataset, batch_size, sampler, collate_fn or default_collate_fn, drop_last=drop_last, num_workers=num_workers
    )


__all__ = ["ResumableRandomSampler", "StatefulDataLoader", "create_rl_dataloader", "epoch_order"]
