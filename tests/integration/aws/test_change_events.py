"""Change events as AWS sends them: which the stack's rule lets through, and what ingest makes of them.

The rule patterns are the stack's (``change_patterns``) in moto's EventBridge; events come from the
emulator's emitter; state, queue and EC2 are the emulator's.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.integration.aws.support import drain, subscribe
from topokeeper.adapters.dynamodb import DynamoStateStore
from topokeeper.adapters.ec2 import instance_tags
from topokeeper.adapters.queue import SqsWorkQueue
from topokeeper.contract.config import ClusterConfig, Settings
from topokeeper.contract.constants import AUDIT_SOURCE
from topokeeper.contract.event_schemas import (
    CLOUDTRAIL_DETAIL_TYPE,
    CLOUDTRAIL_SERVICE_EVENT_DETAIL_TYPE,
    EC2_STATE_DETAIL_TYPE,
    MANAGED_TOPOLOGY_EVENT,
    TopokeeperEvent,
    change_patterns,
)
from topokeeper.contract.ports import Metric
from topokeeper.service.ingest import IngestDeps, ingest
from topokeeper.sim.aws.events import CLOUDTRAIL
from topokeeper.sim.aws_emulator import AwsEmulator, ManualClock
from topokeeper.sim.stack import create_state_table

ACCOUNT = "123456789012"
ARN_A = f"arn:aws:sagemaker:us-east-1:{ACCOUNT}:cluster/aaaaaaaaaaaa"
ARN_B = f"arn:aws:sagemaker:us-east-1:{ACCOUNT}:cluster/bbbbbbbbbbbb"
NAMES = {ARN_A: "train-a", ARN_B: "train-b"}


class Metrics:
    def __init__(self) -> None:
        self.points: list[tuple[str, str, float]] = []

    def emit(self, cluster: str, metric: Metric, value: float, partition: str | None = None) -> None:
        self.points.append((cluster, metric.value, value))


def _cloudtrail(name: str, parameters: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {
        "eventVersion": "1.11",
        "eventSource": "sagemaker.amazonaws.com",
        "eventName": name,
        "requestParameters": parameters,
        "eventID": f"ct-{name}",
        **extra,
    }


def _envelope(event_id: str, source: str, detail_type: str, detail: dict[str, Any]) -> TopokeeperEvent:
    return TopokeeperEvent.model_validate(
        {
            "version": "0",
            "id": event_id,
            "detail-type": detail_type,
            "source": source,
            "account": ACCOUNT,
            "time": "2026-12-02T10:00:00Z",
            "region": "us-east-1",
            "resources": [],
            "detail": detail,
        }
    )


def _deps(aws: AwsEmulator, clock: ManualClock, *clusters: ClusterConfig) -> tuple[IngestDeps, Any, str]:
    dynamodb, sqs = aws.client("dynamodb"), aws.client("sqs")
    create_state_table(dynamodb, "t")
    fifo = {"FifoQueue": "true"}
    dlq = sqs.create_queue(QueueName="w-dlq.fifo", Attributes=fifo)["QueueUrl"]
    url = sqs.create_queue(QueueName="w.fifo", Attributes=fifo)["QueueUrl"]
    ec2 = aws.client("ec2")
    deps = IngestDeps(
        settings=Settings(clusters=list(clusters or [ClusterConfig(name="train-a"), ClusterConfig(name="train-b")])),
        state=DynamoStateStore(dynamodb, "t"),
        queue=SqsWorkQueue(sqs, url, dlq),
        metrics=Metrics(),
        clock=clock,
        cluster_name_of_arn=NAMES.get,
        instance_tags=lambda instance_id: instance_tags(ec2, instance_id),
    )
    return deps, sqs, url


def _queued(sqs: Any, url: str) -> list[dict[str, Any]]:
    messages = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, VisibilityTimeout=0).get("Messages", [])
    return sorted((json.loads(m["Body"]) for m in messages), key=lambda body: body["cluster"])


def test_the_change_rule_lets_batch_add_and_move_cluster_nodes_through(aws: AwsEmulator) -> None:
    url = subscribe(aws, "api-calls", change_patterns()["HyperPodApiCalls"])
    for name in ("BatchAddClusterNodes", "MoveClusterNodes", "DescribeCluster"):
        aws.events.emit(
            CLOUDTRAIL, source="aws.sagemaker", detail_type=CLOUDTRAIL_DETAIL_TYPE, detail=_cloudtrail(name, {})
        )
    failed = _cloudtrail("MoveClusterNodes", {}, errorCode="ValidationException")
    aws.events.emit(CLOUDTRAIL, source="aws.sagemaker", detail_type=CLOUDTRAIL_DETAIL_TYPE, detail=failed)

    received = [message["detail"]["eventName"] for message in drain(aws, url)]

    assert sorted(received) == ["BatchAddClusterNodes", "MoveClusterNodes"]


def test_move_cluster_nodes_changes_its_source_and_its_target(aws: AwsEmulator, clock: ManualClock) -> None:
    deps, sqs, url = _deps(aws, clock)
    parameters = {
        "sourceClusterArn": ARN_A,
        "sourceInstanceGroupName": "p5",
        "targetClusterArn": ARN_B,
        "targetInstanceGroupName": "p5",
        "instanceCount": 2,
    }
    event = _envelope("move-1", "aws.sagemaker", CLOUDTRAIL_DETAIL_TYPE, _cloudtrail("MoveClusterNodes", parameters))

    result = ingest(event, deps)

    assert (result.status, result.clusters) == ("queued", ["train-a", "train-b"])
    assert [(m["cluster"], m["generation"]) for m in _queued(sqs, url)] == [("train-a", 1), ("train-b", 1)]
    # Redelivered: a duplicate for both, counted for both
    again = ingest(event, deps)
    assert (again.status, again.clusters) == ("duplicate", ["train-a", "train-b"])
    assert sorted(c for c, m, _ in deps.metrics.points if m == Metric.EVENTS_COALESCED.value) == ["train-a", "train-b"]


def test_batch_add_cluster_nodes_changes_its_cluster(aws: AwsEmulator, clock: ManualClock) -> None:
    deps, sqs, url = _deps(aws, clock)
    parameters = {"clusterName": ARN_B, "nodesToAdd": [{"instanceGroupName": "p5", "incrementTargetCountBy": 2}]}
    event = _envelope("add-1", "aws.sagemaker", CLOUDTRAIL_DETAIL_TYPE, _cloudtrail("BatchAddClusterNodes", parameters))

    assert ingest(event, deps).clusters == ["train-b"]
    assert [m["cluster"] for m in _queued(sqs, url)] == ["train-b"]


def test_a_move_without_its_target_names_the_field(aws: AwsEmulator, clock: ManualClock) -> None:
    deps, _, _ = _deps(aws, clock)
    detail = _cloudtrail("MoveClusterNodes", {"sourceClusterArn": ARN_A, "sourceInstanceGroupName": "p5"})
    with pytest.raises(Exception, match=r"detail\.requestParameters\.targetClusterArn"):
        ingest(_envelope("move-2", "aws.sagemaker", CLOUDTRAIL_DETAIL_TYPE, detail), deps)


@pytest.mark.parametrize("state", ["pending", "running"])
def test_a_state_change_of_an_instance_ec2_does_not_know_yet_is_ignored_quietly(
    aws: AwsEmulator, clock: ManualClock, state: str
) -> None:
    """DescribeInstances answers InvalidInstanceID.NotFound for a just-launched instance: no retry, no DLQ."""
    pcluster = ClusterConfig(name="pcluster", orchestrator="ec2", head_node="i-0123456789abcdef0")
    deps, sqs, url = _deps(aws, clock, pcluster)
    detail = {"instance-id": "i-0fedcba9876543210", "state": state}

    result = ingest(_envelope(f"ec2-{state}", "aws.ec2", EC2_STATE_DETAIL_TYPE, detail), deps)

    assert result.status == "ignored" and "i-0fedcba9876543210" in result.reason
    assert aws.calls["DescribeInstances"] == 1 and _queued(sqs, url) == []


def test_a_state_change_of_another_instance_is_ignored_without_asking_ec2(aws: AwsEmulator, clock: ManualClock) -> None:
    """Only HyperPod clusters configured: an EC2 instance's state change cannot concern them."""
    deps, sqs, url = _deps(aws, clock)
    detail = {"instance-id": "i-0fedcba9876543210", "state": "running"}

    assert ingest(_envelope("ec2-1", "aws.ec2", EC2_STATE_DETAIL_TYPE, detail), deps).status == "ignored"
    assert aws.calls["DescribeInstances"] == 0 and _queued(sqs, url) == []


def test_a_state_change_of_a_tagged_instance_changes_its_cluster(aws: AwsEmulator, clock: ManualClock) -> None:
    pcluster = ClusterConfig(name="pcluster", orchestrator="ec2", head_node="i-0123456789abcdef0")
    deps, sqs, url = _deps(aws, clock, pcluster)
    ec2 = aws.client("ec2")
    image = ec2.describe_images()["Images"][0]["ImageId"]
    tags = [{"ResourceType": "instance", "Tags": [{"Key": pcluster.ec2.cluster_tag, "Value": "pcluster"}]}]
    (instance,) = ec2.run_instances(ImageId=image, MinCount=1, MaxCount=1, TagSpecifications=tags)["Instances"]
    detail = {"instance-id": instance["InstanceId"], "state": "running"}

    assert ingest(_envelope("ec2-2", "aws.ec2", EC2_STATE_DETAIL_TYPE, detail), deps).clusters == ["pcluster"]
    assert [m["cluster"] for m in _queued(sqs, url)] == ["pcluster"]


@pytest.mark.parametrize("detail_type", [CLOUDTRAIL_DETAIL_TYPE, CLOUDTRAIL_SERVICE_EVENT_DETAIL_TYPE])
def test_the_managed_topology_rule_lets_hyperpods_own_updates_through(aws: AwsEmulator, detail_type: str) -> None:
    url = subscribe(aws, "managed", change_patterns()["HyperPodTopologyUpdates"])
    for name in (MANAGED_TOPOLOGY_EVENT, "UpdateCluster"):
        aws.events.emit(CLOUDTRAIL, source="aws.sagemaker", detail_type=detail_type, detail=_cloudtrail(name, {}))
    # Our own audit records share the name, not the source.
    aws.events.emit(
        CLOUDTRAIL, source=AUDIT_SOURCE, detail_type=detail_type, detail=_cloudtrail(MANAGED_TOPOLOGY_EVENT, {})
    )

    received = [(message["detail-type"], message["detail"]["eventName"]) for message in drain(aws, url)]

    assert received == [(detail_type, MANAGED_TOPOLOGY_EVENT)]
