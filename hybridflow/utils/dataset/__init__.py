"""veRL's import path ``verl.utils.dataset``; the datasets live in ``hybridflow.data``."""

from hybridflow.data.rl_dataset import RLHFDataset

__all__ = ["RLHFDataset"]
