"""Alarms to one SNS topic, and a dashboard with one row per managed cluster."""

from __future__ import annotations

from aws_cdk import Duration, Stack
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_cloudwatch_actions as actions
from aws_cdk import aws_sns as sns
from aws_cdk import aws_sns_subscriptions as subscriptions
from aws_cdk import aws_sqs as sqs
from constructs import Construct

from infra.config import drift_alarm_period
from infra.encryption import DataKey
from infra.functions import Functions
from topokeeper.contract import stack_spec as spec
from topokeeper.contract.config import Settings
from topokeeper.contract.ports import METRICS_DIMENSION, METRICS_NAMESPACE, METRICS_PARTITION_DIMENSION, Metric

_PERIOD = Duration.seconds(spec.ALARM_PERIOD_SECONDS)
_ROW_HEIGHT = 6
_LABEL_WIDTH = 4
_GRAPH_WIDTH = 4  # five graphs and the label fill the dashboard's 24 columns
_PLACEMENT_WIDTH = 5  # the placement row: the label and four graphs


def cluster_metric(metric: Metric, cluster: str, statistic: str, period: Duration = _PERIOD) -> cloudwatch.Metric:
    return cloudwatch.Metric(
        namespace=METRICS_NAMESPACE,
        metric_name=metric.value,
        dimensions_map={METRICS_DIMENSION: cluster},
        statistic=statistic,
        period=period,
    )


def partition_metric(
    metric: Metric, cluster: str, partition: str, statistic: str, period: Duration
) -> cloudwatch.Metric:
    return cloudwatch.Metric(
        namespace=METRICS_NAMESPACE,
        metric_name=metric.value,
        dimensions_map={METRICS_DIMENSION: cluster, METRICS_PARTITION_DIMENSION: partition},
        statistic=statistic,
        period=period,
    )


def every_partition(metric: Metric, cluster: str, statistic: str) -> cloudwatch.MathExpression:
    """One line per partition: partitions are discovered, not configured, so the dashboard searches for them.
    Cluster names and metric names are validated to ``[A-Za-z0-9._-]``: nothing to escape in the search."""
    dimensions = f"{METRICS_NAMESPACE},{METRICS_DIMENSION},{METRICS_PARTITION_DIMENSION}"
    search = f'{{{dimensions}}} MetricName="{metric.value}" {METRICS_DIMENSION}="{cluster}"'
    return cloudwatch.MathExpression(
        expression=f"SEARCH('{search}', '{statistic}', {spec.ALARM_PERIOD_SECONDS})",
        using_metrics={},
        label=metric.value,
        period=_PERIOD,
    )


class Monitoring(Construct):
    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        settings: Settings,
        key: DataKey,
        functions: Functions,
        dead_letter_queues: dict[str, sqs.IQueue],
    ) -> None:
        super().__init__(scope, construct_id)
        self._prefix = Stack.of(self).stack_name
        if settings.alarm_topic_arn:
            self.topic: sns.ITopic = sns.Topic.from_topic_arn(self, "Topic", settings.alarm_topic_arn)
        else:
            self.topic = sns.Topic(
                self, "Topic", display_name="topokeeper alarms", master_key=key.key, enforce_ssl=True
            )
        if settings.alarm_email:
            self.topic.add_subscription(subscriptions.EmailSubscription(settings.alarm_email))
        self._action = actions.SnsAction(self.topic)
        self.alarms: list[cloudwatch.Alarm] = []

        drift_alarm_period(settings)  # names the context key if the schedule cannot be alarmed on
        descriptions = {
            Metric.TOPOLOGY_DRIFT: "the live topology differed from the plan in {periods} drift checks",
            Metric.APPLY_FAILURES: "a topology apply failed, was refused or rolled back",
            Metric.AGENT_OUTDATED: "the head-node agent is outdated; re-run `topokeeper agent install-script` output",
            Metric.FORGED_REPORTS: "its agent's identity sent a report about another cluster; the controller may be "
            "compromised, or shares its role with another cluster",
            Metric.MANAGED_TOPOLOGY_UPDATES: "HyperPod changed the topology itself (UpdatePartitionTopology)",
            Metric.BUNDLE_REFUSALS: "the head node refused a bundle as bad_signature or replayed: someone wrote the "
            "bucket, or the head node trusts another signing key",
            Metric.NODES_WITHOUT_TOPOLOGY_DATA: "nodes lacked the network layers their Kueue Topology needs in "
            "{periods} checks (not reported yet, partial capacity-reservation topology, or not describable)",
            Metric.LARGEST_PLACEABLE_JOB_NODES: "the largest job one leaf or block of partition {partition} can "
            "start stayed under {threshold:g} nodes in {periods} drift checks (`topokeeper placement`)",
            Metric.TOPOLOGY_PENDING_SECONDS: "a job of partition {partition} waited on topology over {threshold:g} s"
            " in {periods} drift checks (`topokeeper placement`)",
        }
        for cluster in settings.clusters:
            for metric, alarm in spec.cluster_alarms(settings, cluster).items():
                self._alarm(
                    f"{cluster.name}-{metric}",
                    cluster_metric(metric, cluster.name, alarm.statistic, Duration.seconds(alarm.period_seconds)),
                    f"{cluster.name}: " + descriptions[metric].format(periods=alarm.evaluation_periods),
                    alarm,
                )
            for partition, metric, alarm in spec.placement_alarms(settings, cluster):
                period = Duration.seconds(alarm.period_seconds)
                self._alarm(
                    f"{cluster.name}-{partition}-{metric}",
                    partition_metric(metric, cluster.name, partition, alarm.statistic, period),
                    f"{cluster.name}: "
                    + descriptions[metric].format(
                        partition=partition, threshold=alarm.threshold, periods=alarm.evaluation_periods
                    ),
                    alarm,
                )
        depth = spec.DEAD_LETTER_DEPTH_ALARM
        for queue_name, queue in dead_letter_queues.items():
            self._alarm(
                f"{queue_name}-Depth",
                queue.metric_approximate_number_of_messages_visible(
                    period=Duration.seconds(depth.period_seconds), statistic=depth.statistic
                ),
                f"messages in {queue_name}: redrive them once the cause is fixed",
                depth,
            )
        errors, throttles = spec.FUNCTION_ERRORS_ALARM, spec.FUNCTION_THROTTLES_ALARM
        for function_name, function in functions.by_name.items():
            self._alarm(
                f"{function_name}-Errors",
                function.metric_errors(period=Duration.seconds(errors.period_seconds), statistic=errors.statistic),
                f"the {function_name} function failed",
                errors,
            )
            self._alarm(
                f"{function_name}-Throttles",
                function.metric_throttles(
                    period=Duration.seconds(throttles.period_seconds), statistic=throttles.statistic
                ),
                f"the {function_name} function was throttled",
                throttles,
            )

        self.dashboard = cloudwatch.Dashboard(self, "Dashboard", dashboard_name=f"{self._prefix}-clusters")
        for cluster in settings.clusters:
            self.dashboard.add_widgets(*self._cluster_row(cluster.name))
            if cluster.placement_metrics:
                self.dashboard.add_widgets(*self._placement_row(cluster.name))

    def _alarm(self, name: str, metric: cloudwatch.IMetric, description: str, alarm: spec.AlarmSpec) -> None:
        created = cloudwatch.Alarm(
            self,
            name,
            alarm_name=f"{self._prefix}-{name}",
            alarm_description=description,
            metric=metric,
            evaluation_periods=alarm.evaluation_periods,
            datapoints_to_alarm=alarm.datapoints_to_alarm,
            comparison_operator=cloudwatch.ComparisonOperator[alarm.comparison.name],
            threshold=alarm.threshold,
            treat_missing_data=cloudwatch.TreatMissingData[alarm.missing.name],
        )
        created.add_alarm_action(self._action)
        self.alarms.append(created)

    @staticmethod
    def _cluster_row(cluster: str) -> list[cloudwatch.IWidget]:
        def graph(title: str, *metrics: cloudwatch.IMetric) -> cloudwatch.GraphWidget:
            return cloudwatch.GraphWidget(title=title, left=list(metrics), width=_GRAPH_WIDTH, height=_ROW_HEIGHT)

        return [
            cloudwatch.TextWidget(markdown=f"## {cluster}", width=_LABEL_WIDTH, height=_ROW_HEIGHT),
            graph(
                "Topology updates (topokeeper's, HyperPod's own)",
                cluster_metric(Metric.TOPOLOGY_UPDATES, cluster, "Sum"),
                cluster_metric(Metric.MANAGED_TOPOLOGY_UPDATES, cluster, "Sum"),
            ),
            graph("Drift", cluster_metric(Metric.TOPOLOGY_DRIFT, cluster, "Maximum")),
            graph(
                "Nodes without topology (Slurm plan; EKS: Kueue's levels)",
                cluster_metric(Metric.NODES_WITHOUT_TOPOLOGY, cluster, "Maximum"),
                cluster_metric(Metric.NODES_WITHOUT_TOPOLOGY_DATA, cluster, "Maximum"),
            ),
            graph(
                "Reconcile seconds",
                cluster_metric(Metric.RECONCILE_SECONDS, cluster, "p50"),
                cluster_metric(Metric.RECONCILE_SECONDS, cluster, "Maximum"),
            ),
            graph("Events coalesced", cluster_metric(Metric.EVENTS_COALESCED, cluster, "Sum")),
        ]

    @staticmethod
    def _placement_row(cluster: str) -> list[cloudwatch.IWidget]:
        def graph(title: str, metric: Metric, statistic: str) -> cloudwatch.GraphWidget:
            return cloudwatch.GraphWidget(
                title=title,
                left=[every_partition(metric, cluster, statistic)],
                width=_PLACEMENT_WIDTH,
                height=_ROW_HEIGHT,
            )

        return [
            cloudwatch.TextWidget(markdown=f"### {cluster}: placement", width=_LABEL_WIDTH, height=_ROW_HEIGHT),
            graph("Largest job one leaf or block can start", Metric.LARGEST_PLACEABLE_JOB_NODES, "Minimum"),
            graph("Running jobs spread beyond need", Metric.JOBS_SPREAD_BEYOND_NEED, "Maximum"),
            graph("Longest wait on topology (s)", Metric.TOPOLOGY_PENDING_SECONDS, "Maximum"),
            cloudwatch.GraphWidget(
                title="Placement facts not read",
                left=[cluster_metric(Metric.PLACEMENT_FACTS_FAILURES, cluster, "Sum")],
                width=_PLACEMENT_WIDTH,
                height=_ROW_HEIGHT,
            ),
        ]
