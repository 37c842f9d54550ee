"""veRL's ``verl.utils.metric``: ``Metric`` values with an ``AggregationType`` and ``reduce_metrics``."""

from hybridflow.utils.metric.utils import AggregationType, Metric, flat_metric_values, reduce_metrics

__all__ = ["AggregationType", "Metric", "flat_metric_values", "reduce_metrics"]
