"""Metric values and their reduction to one number per key (veRL's ``verl.utils.metric.utils``).

Workers report a metric as a list of values (one per mini-batch or micro-batch, nested once more per
rank after the worker group gathers them), as a tensor, or as a ``Metric`` that says how its values
combine: a loss summed over gradient-accumulation steps must not be averaged like a clip fraction.
``reduce_metrics`` turns all of them into floats for the logger.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import Enum
from typing import Any

import numpy as np
import torch

__all__ = ["AggregationType", "Metric", "flat_metric_values", "reduce_metrics"]


class AggregationType(Enum):
    """How a ``Metric``'s values combine into one number."""

    MEAN = "mean"
    SUM = "sum"
    MIN = "min"
    MAX = "max"


_REDUCERS = {
    AggregationType.MEAN: np.mean,
    AggregationType.SUM: np.sum,
    AggregationType.MIN: np.min,
    AggregationType.MAX: np.max,
}


def _as_aggregation(aggregation: str | AggregationType) -> AggregationType:
    if isinstance(aggregation, AggregationType):
        return aggregation
    try:
        return AggregationType(aggregation)
    except ValueError:
        known = ", ".join(a.value for a in AggregationType)
        raise ValueError(f"unsupported aggregation type {aggregation!r}; known: {known}") from None


def _as_number(value: Any) -> float | int:
    """A scalar number from a Python/numpy number or a one-element tensor/array (read back to host)."""
    if isinstance(value, (torch.Tensor, np.ndarray)):
        size = value.numel() if isinstance(value, torch.Tensor) else value.size
        if size != 1:
            raise ValueError(f"a metric value must be a scalar; got a tensor/array of shape {tuple(value.shape)}")
        return value.item()
    if isinstance(value, (int, float, np.number)):
        return value
    raise ValueError(f"unsupported metric value type {type(value).__name__}: {value!r}")


class Metric:
    """Values of one metric with the rule that combines them: ``Metric("sum", loss)``, then
    ``append`` / ``extend`` more, ``aggregate()`` for the number."""

    def __init__(self, aggregation: str | AggregationType, value: Any = None) -> None:
        self.aggregation = _as_aggregation(aggregation)
        self.values: list = []
        if isinstance(value, (list, tuple)):
            self.extend(value)
        elif value is not None:
            self.append(value)

    def __repr__(self) -> str:
        return f"Metric({self.aggregation.value!r}, {self.values!r})"

    def __len__(self) -> int:
        return len(self.values)

    def append(self, value: Any) -> None:
        """Add one scalar (a one-element tensor is read back); another Metric adds all its values."""
        if isinstance(value, Metric):
            self.extend(value)
            return
        self.values.append(_as_number(value))

    def extend(self, values: Metric | Iterable) -> None:
        """Add several values; a Metric must have the same aggregation (a sum is not a mean)."""
        if isinstance(values, Metric):
            if values.aggregation != self.aggregation:
                raise ValueError(f"aggregation type mismatch: {self.aggregation.value} != {values.aggregation.value}")
            values = values.values
        for value in values:
            self.append(value)

    def aggregate(self) -> float:
        if not self.values:
            raise ValueError(f"cannot aggregate an empty Metric ({self.aggregation.value})")
        return float(_REDUCERS[self.aggregation](self.values))

    @classmethod
    def aggregate_dp(cls, metrics: list[Metric]) -> float:
        """One number from the same metric on several data-parallel ranks, each holding one value per
        accumulation step: sum/mean average the ranks step by step first (every rank saw a share of
        the same batch), then combine the steps; min/max take the extreme of all values."""
        if not metrics:
            raise ValueError("cannot aggregate an empty list of metrics")
        aggregation = metrics[0].aggregation
        if any(m.aggregation != aggregation for m in metrics):
            raise ValueError(
                f"aggregation type mismatch across ranks: {sorted({m.aggregation.value for m in metrics})}"
            )
        lengths = [len(m.values) for m in metrics]
        if len(set(lengths)) != 1:
            raise ValueError(f"every rank must hold the same number of values for dp aggregation, got {lengths}")
        values = np.asarray([m.values for m in metrics], dtype=np.float64)  # (ranks, steps)
        if aggregation in (AggregationType.MEAN, AggregationType.SUM):
            values = values.mean(axis=0)
        return float(_REDUCERS[aggregation](values))

    @classmethod
    def from_dict(cls, data: dict[str, Any], aggregation: str | AggregationType) -> dict[str, Metric]:
        """``{key: Metric(aggregation, value)}`` for a dict of plain values."""
        return {key: cls(aggregation, value) for key, value in data.items()}

    def init_list(self) -> Metric:
        """An empty Metric with the same aggregation, to collect values into."""
        return Metric(self.aggregation)


def flat_metric_values(value: Any) -> list:
    """A metric's values as one flat list: worker groups return one list per rank, collected by
    ``DataProto.concat`` into a list of lists (veRL's shape), e.g. ``[[l0, l1], [l0', l1']]``."""
    if isinstance(value, (list, tuple, np.ndarray)):
        return [v for item in value for v in flat_metric_values(item)]
    return [value]


def _reduce_list(key: str, values: list) -> float:
    if values and all(isinstance(v, Metric) for v in values):
        return Metric.aggregate_dp(values)  # one Metric per rank
    if any(isinstance(v, Metric) for v in values):
        raise ValueError(f"metric {key!r} mixes Metric objects and plain values")
    if not values:
        return float("nan")
    numbers = [float(_as_number(v)) for v in values]
    # veRL's rule for plain lists: a key naming max / min takes the extreme, any other the mean
    if "max" in key:
        return max(numbers)
    if "min" in key:
        return min(numbers)
    return float(np.mean(numbers))


def reduce_metrics(metrics: dict[str, Any]) -> dict[str, float]:
    """One float per key: a ``Metric`` by its aggregation; a list (nested per rank or not) by the
    max when the key contains "max", the min when it contains "min", else the mean; a list of
    Metrics (one per rank) by ``Metric.aggregate_dp``; tensors and numbers as they are.

    All scalar tensors are stacked and read back in a single host sync. Returns a new dict.
    """
    out: dict[str, float] = {}
    tensor_keys, tensor_vals = [], []
    for key, value in metrics.items():
        if isinstance(value, Metric):
            out[key] = value.aggregate()
        elif isinstance(value, (list, tuple, np.ndarray)) and not (isinstance(value, np.ndarray) and value.ndim == 0):
            out[key] = _reduce_list(key, flat_metric_values(value))
        elif isinstance(value, torch.Tensor):
            if value.numel() != 1:
                raise ValueError(f"metric {key!r} is a tensor of shape {tuple(value.shape)}, not a scalar")
            tensor_keys.append(key)
            tensor_vals.append(value.detach().float().reshape(()))
        else:
            out[key] = float(value)
    if tensor_vals:
        device = tensor_vals[0].device
        out.update(zip(tensor_keys, torch.stack([t.to(device) for t in tensor_vals]).tolist()))
    return {key: out[key] for key in metrics}  # the caller's key order
