"""topokeeper's stack in the emulator, built from the stack's own definitions (``topokeeper.contract.stack_spec``).

The same table keys, queue settings, rule patterns and alarm settings as ``infra/`` deploys; the differences are
the ones moto imposes: EventBridge rules target SQS inbox queues instead of the functions (moto cannot invoke a
Lambda; ``topokeeper.sim.lambda_host`` drains them into the handlers), and moto never evaluates alarms
(``topokeeper.sim.monitoring`` does). Alarms on AWS metrics the emulator does not produce (Lambda Errors and
Throttles, dead-letter queue depth) are not created.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from topokeeper.adapters.aws import client
from topokeeper.contract import stack_spec as spec
from topokeeper.contract.config import ClusterConfig, Settings
from topokeeper.contract.deployment import Deployment
from topokeeper.contract.ports import METRICS_DIMENSION, METRICS_NAMESPACE, Channel, Metric
from topokeeper.sim.aws.s3 import KMS_DEFAULT_ENCRYPTION

TABLE = "topokeeper-state"
BUCKET = "topokeeper-plans-sim"
WORK_QUEUE = "topokeeper-work.fifo"
DEAD_LETTER_QUEUES = {spec.WORK_DLQ: "topokeeper-work-dlq.fifo", spec.EVENT_DLQ: "topokeeper-event-dlq"}
ALARM_PREFIX = "topokeeper"


@dataclass(frozen=True)
class ClusterAlarm:
    name: str
    cluster: str
    metric: Metric
    spec: spec.AlarmSpec


@dataclass
class SimStack:
    deployment: Deployment
    dead_letter_urls: dict[str, str]  # stack_spec.WORK_DLQ / EVENT_DLQ -> queue URL
    data_key_arn: str  # the stack's data key: the bucket's default encryption, the queues'
    inboxes: dict[str, str] = field(default_factory=dict)  # function -> the queue its rules target
    alarms: list[ClusterAlarm] = field(default_factory=list)

    @property
    def queue_url(self) -> str:
        return self.deployment.queue_url

    @property
    def dead_letter_url(self) -> str:
        return self.dead_letter_urls[spec.WORK_DLQ]

    def alarm(self, cluster: str, metric: Metric) -> ClusterAlarm:
        return next(a for a in self.alarms if a.cluster == cluster and a.metric is metric)


def create_stack(settings: Settings) -> SimStack:
    """The stack's resources for ``settings``, in the emulator the boto3 clients point at."""
    s3, sqs = client("s3"), client("sqs")
    create_state_table(client("dynamodb"), TABLE)
    s3.create_bucket(Bucket=BUCKET)
    s3.put_bucket_versioning(Bucket=BUCKET, VersioningConfiguration={"Status": "Enabled"})
    # Like the stack's bucket: KMS by default with the stack's data key, so the emulator refuses a SigV2 read as
    # S3 does, and a read or write needs the caller's use of the key through S3.
    data_key = client("kms").create_key(Description="topokeeper data key")["KeyMetadata"]["Arn"]
    default = {**KMS_DEFAULT_ENCRYPTION["Rules"][0]["ApplyServerSideEncryptionByDefault"], "KMSMasterKeyID": data_key}
    s3.put_bucket_encryption(
        Bucket=BUCKET, ServerSideEncryptionConfiguration={"Rules": [{"ApplyServerSideEncryptionByDefault": default}]}
    )
    dead_letters = {
        name: sqs.create_queue(
            QueueName=queue,
            Attributes={
                **({"FifoQueue": "true"} if spec.DEAD_LETTER_QUEUES_FIFO[name] else {}),
                "MessageRetentionPeriod": str(spec.DEAD_LETTER_RETENTION_SECONDS),
            },
        )["QueueUrl"]
        for name, queue in DEAD_LETTER_QUEUES.items()
    }
    redrive = {
        "deadLetterTargetArn": _queue_arn(sqs, dead_letters[spec.WORK_DLQ]),
        "maxReceiveCount": spec.WORK_MAX_RECEIVE_COUNT,
    }
    queue_url = sqs.create_queue(
        QueueName=WORK_QUEUE,
        Attributes={
            "FifoQueue": "true",
            "ContentBasedDeduplication": str(spec.WORK_CONTENT_BASED_DEDUPLICATION).lower(),
            "VisibilityTimeout": str(spec.WORK_VISIBILITY_TIMEOUT_SECONDS),
            "RedrivePolicy": json.dumps(redrive),
        },
    )["QueueUrl"]
    # Like the stack's bundle-signing key: reconcile signs every bundle, the head node checks it.
    signing_key = client("kms").create_key(KeySpec="RSA_3072", KeyUsage="SIGN_VERIFY")["KeyMetadata"]["Arn"]
    stack = SimStack(
        Deployment(
            table=TABLE,
            bucket=BUCKET,
            queue_url=queue_url,
            dead_letter_queue_url=dead_letters[spec.WORK_DLQ],
            signing_key_id=signing_key,
            settings=settings,
        ),
        dead_letters,
        data_key,
    )
    head_nodes = [c.head_node for c in settings.clusters if c.effective_channel is Channel.SSM and c.head_node]
    for function, rules in spec.rule_patterns(head_nodes).items():
        inbox = sqs.create_queue(QueueName=f"topokeeper-{function}-inbox")["QueueUrl"]
        stack.inboxes[function] = inbox
        for rule, pattern in rules.items():
            client("events").put_rule(Name=rule, EventPattern=json.dumps(pattern), State="ENABLED")
            client("events").put_targets(Rule=rule, Targets=[{"Id": function, "Arn": _queue_arn(sqs, inbox)}])
    for cluster in settings.clusters:
        stack.alarms.extend(_create_cluster_alarms(settings, cluster))
    return stack


def _create_cluster_alarms(settings: Settings, cluster: ClusterConfig) -> list[ClusterAlarm]:
    created = []
    for metric, alarm in spec.cluster_alarms(settings, cluster).items():
        name = spec.cluster_alarm_name(ALARM_PREFIX, cluster.name, metric)
        optional = {"DatapointsToAlarm": alarm.datapoints_to_alarm} if alarm.datapoints_to_alarm else {}
        client("cloudwatch").put_metric_alarm(
            AlarmName=name,
            Namespace=METRICS_NAMESPACE,
            MetricName=metric.value,
            Dimensions=[{"Name": METRICS_DIMENSION, "Value": cluster.name}],
            Statistic=alarm.statistic,
            Period=alarm.period_seconds,
            EvaluationPeriods=alarm.evaluation_periods,
            Threshold=alarm.threshold,
            ComparisonOperator=alarm.comparison.value,
            TreatMissingData=alarm.missing.value,
            **optional,
        )
        created.append(ClusterAlarm(name, cluster.name, metric, alarm))
    return created


def create_state_table(dynamodb: Any, name: str) -> None:
    """The stack's single table, as infra/state.py creates it (on demand, TTL)."""
    dynamodb.create_table(
        TableName=name,
        KeySchema=[
            {"AttributeName": spec.PARTITION_KEY, "KeyType": "HASH"},
            {"AttributeName": spec.SORT_KEY, "KeyType": "RANGE"},
        ],
        AttributeDefinitions=[
            {"AttributeName": spec.PARTITION_KEY, "AttributeType": spec.KEY_TYPE},
            {"AttributeName": spec.SORT_KEY, "AttributeType": spec.KEY_TYPE},
        ],
        BillingMode=spec.BILLING_MODE,
    )
    dynamodb.update_time_to_live(
        TableName=name, TimeToLiveSpecification={"Enabled": True, "AttributeName": spec.TTL_ATTRIBUTE}
    )


def _queue_arn(sqs: Any, url: str) -> str:
    arn: str = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    return arn
