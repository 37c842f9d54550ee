"""Metric / AggregationType / reduce_metrics (veRL's verl.utils.metric) against hand-computed values."""

import math

import numpy as np
import pytest
import torch

from hybridflow.utils.metric import AggregationType, Metric, reduce_metrics


@pytest.mark.parametrize(
    "aggregation, expected", [("mean", 2.0), ("sum", 6.0), ("min", 1.0), ("max", 3.0), (AggregationType.SUM, 6.0)]
)
def test_each_aggregation_type(aggregation, expected):
    metric = Metric(aggregation, 1.0)
    metric.append(torch.tensor(2.0))  # a scalar tensor is read back
    metric.append(np.float32(3.0))
    assert metric.aggregate() == expected
    assert metric.values == [1.0, 2.0, 3.0]


def test_extend_and_merge():
    a = Metric("sum", [1, 2])  # a list as initial value: several values
    a.extend([3, torch.tensor([4.0])])
    a.append(Metric("sum", 10))  # appending a Metric adds its values
    assert a.aggregate() == 1 + 2 + 3 + 4 + 10
    with pytest.raises(ValueError, match="mismatch"):
        a.extend(Metric("mean", 1))


@pytest.mark.parametrize("bad", ["1.0", torch.tensor([1.0, 2.0]), None, [1.0]])
def test_append_refuses_non_scalars(bad):
    with pytest.raises(ValueError):
        Metric("mean").append(bad)


def test_unknown_aggregation_and_empty_metric():
    with pytest.raises(ValueError, match="unsupported aggregation type 'median'.*mean, sum, min, max"):
        Metric("median")
    with pytest.raises(ValueError, match="empty"):
        Metric("mean").aggregate()


def test_from_dict_and_init_list():
    metrics = Metric.from_dict({"a": 1.0, "b": 4.0}, aggregation="max")
    assert set(metrics) == {"a", "b"} and all(m.aggregation is AggregationType.MAX for m in metrics.values())
    assert metrics["b"].aggregate() == 4.0
    empty = metrics["a"].init_list()
    assert empty.aggregation is AggregationType.MAX and empty.values == []


def test_aggregate_dp():
    # two ranks, two accumulation steps each: sum/mean average the ranks step by step, then combine
    ranks = [Metric("sum", [1.0, 3.0]), Metric("sum", [3.0, 5.0])]
    assert Metric.aggregate_dp(ranks) == (1 + 3) / 2 + (3 + 5) / 2  # 6
    assert Metric.aggregate_dp([Metric("mean", [1.0, 3.0]), Metric("mean", [3.0, 5.0])]) == 3.0
    assert Metric.aggregate_dp([Metric("max", [1.0, 7.0]), Metric("max", [3.0, 5.0])]) == 7.0
    with pytest.raises(ValueError, match="same number of values"):
        Metric.aggregate_dp([Metric("sum", [1.0]), Metric("sum", [1.0, 2.0])])
    with pytest.raises(ValueError):
        Metric.aggregate_dp([])


def test_reduce_metrics_honours_metric_and_key_names():
    out = reduce_metrics(
        {
            "loss": [1.0, 2.0, 3.0],  # mean
            "x/max": [[1.0, 5.0], [3.0]],  # nested per rank; a key naming max takes the max
            "x/min": [4.0, 2.0],
            "summed": Metric("sum", [1.0, 2.0]),
            "per_rank": [Metric("sum", [1.0, 3.0]), Metric("sum", [3.0, 5.0])],  # gathered from two ranks
            "tensor": torch.tensor(0.5),
            "number": 2,
            "empty": [],
        }
    )
    assert list(out)[:3] == ["loss", "x/max", "x/min"]  # the caller's order
    assert out["loss"] == 2.0 and out["x/max"] == 5.0 and out["x/min"] == 2.0
    assert out["summed"] == 3.0 and out["per_rank"] == 6.0
    assert out["tensor"] == 0.5 and out["number"] == 2.0 and math.isnan(out["empty"])
    assert all(type(v) is float for v in out.values())
    with pytest.raises(ValueError, match="mixes"):
        reduce_metrics({"m": [Metric("sum", 1.0), 2.0]})
