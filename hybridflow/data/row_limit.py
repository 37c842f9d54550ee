"""veRL's ``data.train_max_samples`` / ``data.val_max_samples``: a dataset reads only part of its files.

The rows are chosen as veRL 0.9.1 chooses them, so a run that moves over sees the same subset: the first
``max_samples`` rows, or with ``shuffle`` a draw without replacement from ``numpy.random.default_rng(seed)``
(an unseeded generator when ``seed`` is None). The limit applies before long prompts are filtered out.
"""

from __future__ import annotations

import inspect
import logging

import numpy as np

from hybridflow.config.loader import ConfigError

logger = logging.getLogger(__name__)

__all__ = ["row_subset", "limit_rows", "max_samples_kwargs"]


def row_subset(total: int, max_samples: int, shuffle: bool, seed: int | None) -> list[int] | None:
    """The indices of the rows kept out of ``total``, or None when every row is kept (``max_samples`` <= 0
    or >= ``total``)."""
    if max_samples is None or max_samples <= 0 or max_samples >= total:
        return None
    if shuffle:
        rng = np.random.default_rng(seed) if seed is not None else np.random.default_rng()
        return rng.choice(total, size=max_samples, replace=False).tolist()
    return list(range(max_samples))


def limit_rows(rows: list, max_samples: int, shuffle: bool = False, seed: int | None = None, what: str = "") -> list:
    """``rows`` cut to ``max_samples`` by ``row_subset`` (the list itself when nothing is cut)."""
    kept = row_subset(len(rows), max_samples, shuffle, seed)
    if kept is None:
        return rows
    logger.info("%sselected %d of %d rows (max_samples)", f"{what}: " if what else "", len(kept), len(rows))
    return [rows[i] for i in kept]


def max_samples_kwargs(cls: type, max_samples: int, key: str) -> dict:
    """The ``max_samples`` keyword for a dataset class of the user's (``data.custom_cls``): veRL passes it,
    so a class written for veRL takes it; a class that does not take it is called without it, unless a limit
    is set (``key``: the config key that set it, named in the error)."""
    try:
        params = inspect.signature(cls).parameters.values()
    except (TypeError, ValueError):  # no signature to read: call it as veRL does
        return {"max_samples": max_samples}
    if any(p.name == "max_samples" or p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return {"max_samples": max_samples}
    if max_samples is not None and max_samples > 0:
        raise ConfigError(
            f"{key}={max_samples}: the dataset class {cls.__qualname__} (data.custom_cls) takes no max_samples "
            "argument; add one (veRL's signature) or set the key back to -1"
        )
    return {}
