"""veRL's import path ``verl.utils.dataset.rl_dataset``; the dataset lives in ``hybridflow.data.rl_dataset``."""

from hybridflow.data.rl_dataset import RLHFDataset, collate_fn

__all__ = ["RLHFDataset", "collate_fn"]
