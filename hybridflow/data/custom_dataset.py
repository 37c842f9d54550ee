"""veRL's ``data.custom_cls`` (``path``: a Python file, ``name``: a class in it): a dataset class of your own.

The class must subclass ``torch.utils.data.Dataset`` and is built as veRL builds it:
``cls(data_files=..., tokenizer=..., processor=None, config=<the data section>, max_samples=...)`` (``max_samples``
only where the class takes it). Subclassing
``RLHFDataset`` keeps its prompt templating and row layout; a class from scratch must give the same
fields per row (``input_ids``, ``attention_mask``, ``position_ids``, ``raw_prompt``, ``reward_model``, ...).
"""

from __future__ import annotations

from torch.utils.data import Dataset

from hybridflow.config.data import DataConfig
from hybridflow.config.loader import ConfigError
from hybridflow.data.rl_dataset import RLHFDataset
from hybridflow.data.row_limit import max_samples_kwargs
from hybridflow.utils.import_utils import load_module_from_file


def rl_dataset_class(data_config: DataConfig) -> type:
    """``RLHFDataset`` unless ``data.custom_cls.path`` names a file; errors name the key."""
    path, name = data_config.custom_cls.path, data_config.custom_cls.name
    if not path:
        return RLHFDataset
    if not name:
        raise ConfigError(f"data.custom_cls.path={path!r} needs data.custom_cls.name (the class in that file)")
    try:
        module = load_module_from_file(str(path))
    except ImportError as err:
        raise ConfigError(f"data.custom_cls.path={path!r}: {err}") from err
    cls = getattr(module, str(name), None)
    if cls is None:
        raise ConfigError(f"data.custom_cls.name={name!r}: no such class in {path}")
    if not (isinstance(cls, type) and issubclass(cls, Dataset)):
        raise ConfigError(f"data.custom_cls.name={name!r} in {path} is not a torch.utils.data.Dataset subclass")
    return cls


def build_rl_dataset(
    data_files,
    tokenizer,
    data_config: DataConfig,
    max_samples: int = -1,
    max_samples_key: str = "data.train_max_samples",
) -> Dataset:
    """The RL dataset of ``data_files`` with the configured class (veRL's keyword arguments); ``max_samples``:
    the row limit that ``max_samples_key`` set (a class of the user's that takes no such argument is called
    without it while no limit is set)."""
    cls = rl_dataset_class(data_config)
    limit = max_samples_kwargs(cls, max_samples, max_samples_key)
    return cls(data_files=data_files, tokenizer=tokenizer, processor=None, config=data_config, **limit)
