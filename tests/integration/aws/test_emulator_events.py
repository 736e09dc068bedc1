"""Events the emulated HyperPod sends, routed by EventBridge rules to SQS, and the fixed envelope."""

from __future__ import annotations

import json

import pytest

from tests.integration.aws.support import all_nodes, cluster_request, drain, group, subscribe
from topokeeper.sim.aws_emulator import CLOUDTRAIL, AwsEmulator, ManualClock

STATE_CHANGE = {"source": ["aws.sagemaker"], "detail-type": ["SageMaker HyperPod Cluster State Change"]}
NODE_HEALTH = {"source": ["aws.sagemaker"], "detail-type": ["SageMaker HyperPod Cluster Node Health Event"]}
CLOUDTRAIL_PATTERN = {
    "source": ["aws.sagemaker"],
    "detail-type": ["AWS API Call via CloudTrail"],
    "detail": {
        "eventSource": ["sagemaker.amazonaws.com"],
        "eventName": [
            "CreateCluster",
            "UpdateCluster",
            "DeleteCluster",
            "BatchDeleteClusterNodes",
            "BatchReplaceClusterNodes",
            "BatchRebootClusterNodes",
        ],
    },
}
ENVELOPE = {"version", "id", "detail-type", "source", "account", "time", "region", "resources", "detail"}


def test_cluster_state_change_on_create_update_and_scale(aws: AwsEmulator, clock: ManualClock) -> None:
    queue = subscribe(aws, "state", STATE_CHANGE)
    sagemaker = aws.client("sagemaker")
    arn = sagemaker.create_cluster(**cluster_request())["ClusterArn"]
    sagemaker.update_cluster(
        ClusterName="llm-train", InstanceGroups=[group("p5-train", "ml.p5.48xlarge", 6, partition="ml-p5")]
    )
    aws.hyperpod.scale("llm-train", "gb200", 17)

    events = drain(aws, queue)

    assert len(events) == 3
    for event in events:
        assert set(event) == ENVELOPE
        assert event["account"] == aws.account_id
        assert event["resources"] == [arn]
        assert event["time"] == "2026-01-05T09:00:00Z"
        assert event["detail"]["ClusterArn"] == arn
        assert event["detail"]["ClusterName"] == "llm-train"
        assert event["detail"]["ClusterStatus"] == "InService"
        assert event["detail"]["CreationTime"] == 1767603600000  # epoch milliseconds
    counts = [{g["InstanceGroupName"]: g["CurrentCount"] for g in e["detail"]["InstanceGroups"]} for e in events]
    assert [c["p5-train"] for c in counts] == [4, 6, 6]
    assert [c["gb200"] for c in counts] == [18, 18, 17]
    slurm = {g["InstanceGroupName"]: g["SlurmConfig"] for g in events[0]["detail"]["InstanceGroups"]}
    assert slurm["gb200"] == {"NodeType": "Compute", "PartitionNames": ["ml-p6e"]}


def test_node_health_event_on_failure_and_recovery(aws: AwsEmulator) -> None:
    queue = subscribe(aws, "health", NODE_HEALTH)
    sagemaker = aws.client("sagemaker")
    arn = sagemaker.create_cluster(**cluster_request())["ClusterArn"]
    node = all_nodes(sagemaker, "llm-train")[3]["InstanceId"]

    aws.hyperpod.set_status(node, "Failure", "NvidiaErrorTerminate on this node")
    aws.hyperpod.set_status(node, "Failure", "still failing")  # no new event: the node was already unhealthy
    aws.hyperpod.set_status(node, "Running")

    unhealthy, healthy = drain(aws, queue)
    assert unhealthy["detail"]["ClusterArn"] == arn
    assert unhealthy["detail"]["ClusterName"] == "llm-train"
    assert unhealthy["detail"]["InstanceId"] == node
    assert "InstanceGroupName" not in unhealthy["detail"]  # as AWS: resolve it with ListClusterNodes
    assert unhealthy["detail"]["HealthSummary"]["HealthStatus"] == "Unhealthy"
    assert unhealthy["detail"]["HealthSummary"]["RepairAction"] == "Replace"  # NodeRecovery Automatic
    assert "NvidiaErrorTerminate" in unhealthy["detail"]["HealthSummary"]["HealthStatusReason"]
    assert healthy["detail"]["HealthSummary"]["HealthStatus"] == "Healthy"


def test_cloudtrail_events_for_mutating_calls_with_lower_camel_parameters(aws: AwsEmulator) -> None:
    queue = subscribe(aws, "trail", CLOUDTRAIL_PATTERN)
    sagemaker = aws.client("sagemaker")
    arn = sagemaker.create_cluster(**cluster_request())["ClusterArn"]
    node = all_nodes(sagemaker, "llm-train")[2]["InstanceId"]
    sagemaker.batch_delete_cluster_nodes(ClusterName="llm-train", NodeIds=[node, "i-0123456789abcdef0"])
    sagemaker.batch_reboot_cluster_nodes(ClusterName=arn, NodeIds=[all_nodes(sagemaker, "llm-train")[3]["InstanceId"]])
    sagemaker.describe_cluster(ClusterName="llm-train")  # read-only: no event

    created, deleted, rebooted = drain(aws, queue)

    assert created["source"] == "aws.sagemaker"
    assert created["detail"]["eventSource"] == "sagemaker.amazonaws.com"
    assert created["detail"]["eventName"] == "CreateCluster"
    assert created["detail"]["requestParameters"]["clusterName"] == "llm-train"
    first_group = created["detail"]["requestParameters"]["instanceGroups"][0]
    assert first_group["instanceGroupName"] == "controller"
    assert first_group["slurmConfig"] == {"nodeType": "Controller"}
    assert created["detail"]["responseElements"] == {"clusterArn": arn}
    assert created["detail"]["eventType"] == "AwsApiCall"
    assert created["detail"]["recipientAccountId"] == aws.account_id
    assert deleted["detail"]["eventName"] == "BatchDeleteClusterNodes"
    assert deleted["detail"]["requestParameters"]["nodeIds"] == [node, "i-0123456789abcdef0"]
    assert deleted["detail"]["responseElements"]["successful"] == [node]
    assert deleted["detail"]["responseElements"]["failed"][0]["code"] == "NodeIdNotFound"
    assert rebooted["detail"]["requestParameters"]["clusterName"] == arn  # a name or an ARN, as sent


def test_failed_calls_carry_error_code_and_emission_can_be_switched_off(aws: AwsEmulator) -> None:
    queue = subscribe(aws, "trail", CLOUDTRAIL_PATTERN)
    sagemaker = aws.client("sagemaker")
    with pytest.raises(sagemaker.exceptions.ResourceNotFound):
        sagemaker.delete_cluster(ClusterName="missing")
    (failed,) = drain(aws, queue)
    assert failed["detail"]["errorCode"] == "ResourceNotFound"
    assert failed["detail"]["responseElements"] is None

    aws.events.kinds[CLOUDTRAIL] = False
    sagemaker.create_cluster(**cluster_request())
    assert drain(aws, queue) == []
    before = len(aws.events.emitted())
    aws.events.enabled = False
    aws.hyperpod.scale("llm-train", "gb200", 2)
    assert len(aws.events.emitted()) == before


def test_put_events_payload_now_carries_account(aws: AwsEmulator) -> None:
    queue = subscribe(aws, "custom", {"source": ["topokeeper.test"]})
    aws.client("events").put_events(
        Entries=[{"Source": "topokeeper.test", "DetailType": "Probe", "Detail": json.dumps({"x": 1})}]
    )
    (event,) = drain(aws, queue)
    assert event["account"] == aws.account_id
    assert set(event) == ENVELOPE


def test_event_ids_are_deterministic_per_seed() -> None:
    def ids(seed: int) -> list[str]:
        with AwsEmulator(seed=seed, clock=ManualClock()) as aws:
            aws.client("sagemaker").create_cluster(**cluster_request())
            return [e["id"] for e in aws.events.emitted()]

    assert ids(5) == ids(5)
    assert ids(5) != ids(6)
