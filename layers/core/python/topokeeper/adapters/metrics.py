"""Metrics as CloudWatch Embedded Metric Format lines (Powertools), one blob per cluster and metric."""

from __future__ import annotations

from aws_lambda_powertools.metrics import MetricUnit, single_metric

from topokeeper.contract.ports import METRICS_DIMENSION, METRICS_NAMESPACE, METRICS_PARTITION_DIMENSION, Metric

UNITS = {Metric.RECONCILE_SECONDS: MetricUnit.Seconds, Metric.TOPOLOGY_PENDING_SECONDS: MetricUnit.Seconds}


class EmfMetrics:
    def emit(self, cluster: str, metric: Metric, value: float, partition: str | None = None) -> None:
        unit = UNITS.get(metric, MetricUnit.Count)
        with single_metric(name=metric.value, unit=unit, value=value, namespace=METRICS_NAMESPACE) as blob:
            blob.add_dimension(name=METRICS_DIMENSION, value=cluster)
            if partition is not None:
                blob.add_dimension(name=METRICS_PARTITION_DIMENSION, value=partition)


class NoMetrics:
    """For the operator CLI: what it measures is its own output, and stdout must stay clean for --json."""

    def emit(self, cluster: str, metric: Metric, value: float, partition: str | None = None) -> None:
        return None
