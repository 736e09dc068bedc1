"""Settings that change the stack's shape, in one variant synth: no SSM head node, a CloudTrail Lake
channel, an existing alarm topic instead of a new one, and an EKS cluster."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.infra.conftest import Synthesized, example_config, synthesize

pytestmark = pytest.mark.infra

CHANNEL = "arn:aws:cloudtrail:us-west-2:111122223333:channel/01234567-89ab-cdef-0123-456789abcdef"
TOPIC = "arn:aws:sns:us-west-2:111122223333:hpc-alarms"


@pytest.fixture(scope="module")
def variant(tmp_path_factory: pytest.TempPathFactory) -> Synthesized:
    config = example_config()
    del config["clusters"][1]  # the only SSM cluster
    config["clusters"].append({"name": "eks-train", "orchestrator": "eks"})
    config.update(cloudtrail_lake_channel_arn=CHANNEL, alarm_topic_arn=TOPIC, alarm_email=None)
    return synthesize(tmp_path_factory.mktemp("variant"), config)


def template_text(synthesized: Synthesized) -> str:
    return json.dumps(synthesized.template.to_json())


def result_environment(synthesized: Synthesized) -> dict[str, Any]:
    function = synthesized.resource(synthesized.stack.functions.result)
    variables: dict[str, Any] = function["Properties"]["Environment"]["Variables"]
    return variables


def test_without_ssm_head_nodes_nothing_may_send_commands(variant: Synthesized) -> None:
    text = template_text(variant)
    assert "ssm:SendCommand" not in text
    assert "ssm:GetCommandInvocation" not in text
    assert sorted(variant.stack.triggers.rules) == [
        "AgentResults",
        "Ec2InstanceStates",
        "HyperPodApiCalls",
        "HyperPodEvents",
        "HyperPodTopologyUpdates",
    ]


def test_a_cloudtrail_lake_channel_reaches_only_the_result_function(variant: Synthesized) -> None:
    assert result_environment(variant)["CLOUDTRAIL_CHANNEL_ARN"] == CHANNEL
    grants = [
        (resource["Properties"]["Roles"], statement["Resource"])
        for resource in variant.resources.values()
        if resource["Type"] == "AWS::IAM::Policy"
        for statement in resource["Properties"]["PolicyDocument"]["Statement"]
        if "cloudtrail-data:PutAuditEvents" in json.dumps(statement["Action"])
    ]
    assert grants == [([{"Ref": variant.logical_id(variant.stack.functions.result.role)}], CHANNEL)]


def test_without_a_channel_there_is_no_lake_permission(example: Synthesized) -> None:
    assert "CLOUDTRAIL_CHANNEL_ARN" not in result_environment(example)
    assert "cloudtrail-data" not in template_text(example)


def test_an_existing_alarm_topic_is_used_instead_of_a_new_one(variant: Synthesized) -> None:
    types = {resource["Type"] for resource in variant.resources.values()}
    assert "AWS::SNS::Topic" not in types
    assert "AWS::SNS::Subscription" not in types
    alarms = [r["Properties"] for r in variant.resources.values() if r["Type"] == "AWS::CloudWatch::Alarm"]
    assert alarms
    assert all(alarm["AlarmActions"] == [TOPIC] for alarm in alarms)


def test_an_eks_cluster_alarms_on_nodes_without_topology_data_and_its_reconcile_may_audit(variant: Synthesized) -> None:
    alarms = {
        resource["Properties"]["MetricName"]
        for resource in variant.resources.values()
        if resource["Type"] == "AWS::CloudWatch::Alarm"
        and {"Name": "cluster", "Value": "eks-train"} in resource["Properties"].get("Dimensions", [])
    }
    assert alarms == {"NodesWithoutTopologyData"}
    reconcile_role = variant.logical_id(variant.stack.functions.reconcile.role)
    audit_grants = [
        statement["Condition"]
        for resource in variant.resources.values()
        if resource["Type"] == "AWS::IAM::Policy" and {"Ref": reconcile_role} in resource["Properties"]["Roles"]
        for statement in resource["Properties"]["PolicyDocument"]["Statement"]
        if statement["Action"] == "events:PutEvents"
    ]
    assert audit_grants == [{"StringEquals": {"events:source": "topokeeper"}}]
