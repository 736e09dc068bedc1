"""The stack's own definitions, shared by ``infra/`` (which deploys them) and the simulator (which builds the same
stack in the emulator): the state table's keys, the queues' settings, every alarm's evaluation settings, the rule
patterns and the drift schedule's period.

Plain values only (no CDK, no boto3), so the simulator never needs Node or a synth;
``tests/infra/test_stack_spec.py`` checks them against the synthesized template.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from topokeeper.contract.config import ClusterConfig, Orchestrator, Settings
from topokeeper.contract.constants import LOGIN_TARGET_GROUPS_ENV
from topokeeper.contract.errors import InputError
from topokeeper.contract.event_schemas import WORK_QUEUE_MAX_RECEIVES, change_patterns, result_patterns
from topokeeper.contract.ports import Channel, Metric

# ---------------------------------------------------------------- the functions (each one's code is functions/<name>/)

INGEST = "ingest"
RECONCILE = "reconcile"
RESULT = "result"
DRIFT = "drift"
FUNCTION_NAMES = (INGEST, RECONCILE, RESULT, DRIFT)
# Python 3.14 is the newest runtime with both a CDK constant and a Powertools public layer.
PYTHON_VERSION = "3.14"
# The AWS-managed Powertools layer ARN, resolved by CloudFormation at deploy time (``topokeeper preflight`` reads it).
POWERTOOLS_LAYER_PARAMETER = f"/aws/service/powertools/python/arm64/python{PYTHON_VERSION}/latest"
# The minimum an SQS event source allows. It bounds reconciles running at once without reserved
# concurrency, whose throttles would count as receives and push messages into the DLQ; ordering per
# cluster comes from the FIFO message groups.
RECONCILE_MAX_CONCURRENCY = 2
# What the stack runs at once at most in steady use: the reconciles, and one each of the others (no function
# reserves concurrency; all draw on the account's Lambda ``Concurrent executions`` quota, L-B99A9384).
PEAK_CONCURRENT_EXECUTIONS = RECONCILE_MAX_CONCURRENCY + len(FUNCTION_NAMES) - 1

# ---------------------------------------------------------------- the state table (single-table design)

PARTITION_KEY = "pk"
SORT_KEY = "sk"
KEY_TYPE = "S"  # both keys are strings
TTL_ATTRIBUTE = "expires_at"
BILLING_MODE = "PAY_PER_REQUEST"

# ---------------------------------------------------------------- the queues

# The reconcile function's timeout; the work queue's visibility timeout derives from it.
RECONCILE_TIMEOUT_SECONDS = 180
# Every function's timeout (the simulator fails a run in which an invocation outlives its own).
FUNCTION_TIMEOUT_SECONDS = {INGEST: 30, RECONCILE: RECONCILE_TIMEOUT_SECONDS, RESULT: 60, DRIFT: 600}
# Six times the consumer's timeout, as Lambda recommends for SQS event sources.
VISIBILITY_TIMEOUT_FACTOR = 6
WORK_VISIBILITY_TIMEOUT_SECONDS = VISIBILITY_TIMEOUT_FACTOR * RECONCILE_TIMEOUT_SECONDS
# A deferred reconcile returns its message to the queue, which counts as a receive (see
# topokeeper.contract.event_schemas).
WORK_MAX_RECEIVE_COUNT = WORK_QUEUE_MAX_RECEIVES
# One message group per cluster; senders set MessageDeduplicationId themselves (cluster, generation, reason).
WORK_CONTENT_BASED_DEDUPLICATION = False
DEAD_LETTER_RETENTION_SECONDS = 14 * 24 * 3600
# The work queue dead-letters into a FIFO queue; EventBridge and Scheduler only into a standard one.
WORK_DLQ = "WorkDlq"
EVENT_DLQ = "EventDlq"
DEAD_LETTER_QUEUES_FIFO = {WORK_DLQ: True, EVENT_DLQ: False}

# ---------------------------------------------------------------- the rules and the drift schedule


def rule_patterns(head_nodes: list[str]) -> dict[str, dict[str, dict[str, Any]]]:
    """Function -> its EventBridge rules (name -> pattern), from ``topokeeper.contract.event_schemas``."""
    return {INGEST: change_patterns(), RESULT: result_patterns(head_nodes)}


_RATE = re.compile(r"rate\((?P<value>[1-9]\d*) (?P<unit>minutes?|hours?|days?)\)")
_CRON = re.compile(r"cron\([^()]+\)")
_UNIT_SECONDS = {"minute": 60, "hour": 3600, "day": 86_400}
# A cron schedule has no single interval; its alarm counts drift checks per hour.
CRON_ALARM_PERIOD_SECONDS = 3600
# CloudWatch evaluates at most one day of periods shorter than an hour, and at most seven days otherwise.
_ONE_DAY = 86_400


def schedule_rate_seconds(schedule: str) -> int | None:
    """The interval of a ``rate(...)`` schedule; None for ``cron(...)``. Anything else is an InputError."""
    if rate := _RATE.fullmatch(schedule):
        return int(rate["value"]) * _UNIT_SECONDS[rate["unit"].rstrip("s")]
    if _CRON.fullmatch(schedule):
        return None
    raise InputError("drift_schedule", f"expected rate(N minutes|hours|days) or cron(...): {schedule!r}")


def rate_expression(seconds: float) -> str:
    """The ``rate(...)`` schedule of an interval of whole minutes (the schedule's finest unit)."""
    minutes, rest = divmod(seconds, 60)
    if rest or minutes < 1:
        raise InputError("drift_schedule", f"a rate is a whole number of minutes, not {seconds} s")
    return f"rate({int(minutes)} minute{'s' if minutes > 1 else ''})"


def drift_alarm_period_seconds(settings: Settings) -> int:
    """One alarm period per drift check: the schedule's rate, or an hour for a cron schedule."""
    period = schedule_rate_seconds(settings.drift_schedule) or CRON_ALARM_PERIOD_SECONDS
    window = settings.drift_alarm_periods * period
    limit = _ONE_DAY if period < 3600 else 7 * _ONE_DAY
    if window > limit:
        raise InputError(
            "drift_alarm_periods",
            f"{settings.drift_alarm_periods} periods of {period} s exceed CloudWatch's {limit // _ONE_DAY}-day "
            "evaluation window",
        )
    return period


# ---------------------------------------------------------------- alarms


class Comparison(StrEnum):
    """CloudWatch's ComparisonOperator (member names as CDK's)."""

    GREATER_THAN_OR_EQUAL_TO_THRESHOLD = "GreaterThanOrEqualToThreshold"
    GREATER_THAN_THRESHOLD = "GreaterThanThreshold"
    LESS_THAN_THRESHOLD = "LessThanThreshold"
    LESS_THAN_OR_EQUAL_TO_THRESHOLD = "LessThanOrEqualToThreshold"


class MissingData(StrEnum):
    """CloudWatch's TreatMissingData (member names as CDK's)."""

    MISSING = "missing"
    IGNORE = "ignore"
    BREACHING = "breaching"
    NOT_BREACHING = "notBreaching"


@dataclass(frozen=True)
class AlarmSpec:
    """How CloudWatch evaluates one alarm. ``datapoints_to_alarm`` None means all ``evaluation_periods``."""

    statistic: str
    period_seconds: int
    evaluation_periods: int = 1
    datapoints_to_alarm: int | None = None
    threshold: float = 1
    comparison: Comparison = Comparison.GREATER_THAN_OR_EQUAL_TO_THRESHOLD
    missing: MissingData = MissingData.NOT_BREACHING

    @property
    def datapoints(self) -> int:
        return self.datapoints_to_alarm or self.evaluation_periods


ALARM_PERIOD_SECONDS = 300
# Alarms on the functions' and the dead-letter queues' AWS metrics; the name is the alarm's suffix.
DEAD_LETTER_DEPTH_ALARM = AlarmSpec(
    "Maximum", ALARM_PERIOD_SECONDS, threshold=0, comparison=Comparison.GREATER_THAN_THRESHOLD
)  # ApproximateNumberOfMessagesVisible of each dead-letter queue
FUNCTION_ERRORS_ALARM = AlarmSpec("Sum", ALARM_PERIOD_SECONDS)
FUNCTION_THROTTLES_ALARM = AlarmSpec("Sum", ALARM_PERIOD_SECONDS)


def cluster_alarms(settings: Settings, cluster: ClusterConfig) -> dict[Metric, AlarmSpec]:
    """The alarms on ``cluster``'s topokeeper metrics (namespace ``METRICS_NAMESPACE``)."""
    if cluster.orchestrator is Orchestrator.EKS:
        # No head node, so no drift or apply failures; nodes Kueue cannot place alarm like drift does.
        return {
            Metric.NODES_WITHOUT_TOPOLOGY_DATA: AlarmSpec(
                "Maximum",
                drift_alarm_period_seconds(settings),
                evaluation_periods=settings.drift_alarm_periods,
                missing=MissingData.MISSING,
            )
        }
    alarms = {
        Metric.TOPOLOGY_DRIFT: AlarmSpec(
            "Maximum",
            drift_alarm_period_seconds(settings),
            evaluation_periods=settings.drift_alarm_periods,
            # No data means no check ran (the Errors alarm reports that); keep the last verdict.
            missing=MissingData.MISSING,
        ),
        Metric.APPLY_FAILURES: AlarmSpec("Sum", ALARM_PERIOD_SECONDS),
        # A forged or replayed bundle reached the head node: someone wrote the bucket, or its key is wrong.
        Metric.BUNDLE_REFUSALS: AlarmSpec("Sum", ALARM_PERIOD_SECONDS),
    }
    if cluster.effective_channel is Channel.AGENT:
        alarms[Metric.AGENT_OUTDATED] = AlarmSpec("Sum", ALARM_PERIOD_SECONDS)
        alarms[Metric.FORGED_REPORTS] = AlarmSpec("Sum", ALARM_PERIOD_SECONDS)
    if cluster.alarm_on_managed_topology_updates:
        alarms[Metric.MANAGED_TOPOLOGY_UPDATES] = AlarmSpec("Sum", ALARM_PERIOD_SECONDS)
    return alarms


def placement_alarms(settings: Settings, cluster: ClusterConfig) -> list[tuple[str, Metric, AlarmSpec]]:
    """The alarms ``placement_alarms`` asks for: (partition, metric, spec), on the metrics with dimensions cluster
    and partition. One per drift check like the drift alarm; no data (facts not read) keeps the last verdict."""
    period = drift_alarm_period_seconds(settings)
    alarms: list[tuple[str, Metric, AlarmSpec]] = []
    for partition, wanted in sorted(cluster.placement_alarms.items()):
        if wanted.largest_placeable_below is not None:
            below = AlarmSpec(
                "Minimum",
                period,
                evaluation_periods=settings.drift_alarm_periods,
                threshold=wanted.largest_placeable_below,
                comparison=Comparison.LESS_THAN_THRESHOLD,
                missing=MissingData.MISSING,
            )
            alarms.append((partition, Metric.LARGEST_PLACEABLE_JOB_NODES, below))
        if wanted.topology_pending_seconds_above is not None:
            above = AlarmSpec(
                "Maximum",
                period,
                evaluation_periods=settings.drift_alarm_periods,
                threshold=wanted.topology_pending_seconds_above,
                comparison=Comparison.GREATER_THAN_THRESHOLD,
                missing=MissingData.MISSING,
            )
            alarms.append((partition, Metric.TOPOLOGY_PENDING_SECONDS, above))
    return alarms


def cluster_alarm_name(prefix: str, cluster: str, metric: Metric) -> str:
    return f"{prefix}-{cluster}-{metric.value}"


# The longest target group ARN: arn:<partition>:elasticloadbalancing:<region>:<account>:targetgroup/<32>/<16 hex>.
MAX_TARGET_GROUP_ARN_BYTES = 128


def login_environment_bytes(clusters: list[str]) -> int:
    """The most ``LOGIN_TARGET_GROUPS`` can take in a function's environment (its ARNs are known only at deploy)."""
    if not clusters:
        return 0
    longest = {name: "x" * MAX_TARGET_GROUP_ARN_BYTES for name in clusters}
    return len(LOGIN_TARGET_GROUPS_ENV) + len(json.dumps(longest).encode())
