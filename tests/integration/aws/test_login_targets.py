"""Login target sync on the emulator: moto's ELBv2 (IP targets), the emulated HyperPod, DynamoDB, EventBridge."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import pytest

from tests.integration.aws.support import cluster_request, drain, group, subscribe
from topokeeper.adapters.audit_trail import AuditTrail
from topokeeper.adapters.aws import clear_clients
from topokeeper.adapters.elbv2 import ElbTargetGroup
from topokeeper.adapters.login_nodes import DynamoLoginLedger, HyperPodLoginNodes
from topokeeper.contract.config import Settings
from topokeeper.contract.constants import LOGIN_TARGET_GROUPS_ENV
from topokeeper.contract.errors import Retryable
from topokeeper.contract.ports import Metric
from topokeeper.service.login import LoginSync, sync_login_targets
from topokeeper.sim.aws_emulator import AwsEmulator
from topokeeper.sim.stack import create_state_table
from topokeeper.wiring.login_sync import sync_login_endpoints
from topokeeper.wiring.runtime import LambdaEnvironment

CLUSTER = "llm-train"
TABLE = "topokeeper-state"


@dataclass
class RecordedMetrics:
    values: list[tuple[str, Metric, float]] = field(default_factory=list)

    def emit(self, cluster: str, metric: Metric, value: float, partition: str | None = None) -> None:
        self.values.append((cluster, metric, value))

    def last(self, metric: Metric) -> float:
        return [value for _, m, value in self.values if m is metric][-1]


@dataclass
class Endpoint:
    aws: AwsEmulator
    target_group: str
    metrics: RecordedMetrics
    audit_queue: str

    def sync(self, cluster: str = CLUSTER) -> LoginSync:
        return sync_login_targets(
            cluster=cluster,
            target_group_arn=self.target_group,
            nodes=HyperPodLoginNodes(self.aws.client("sagemaker"), self.aws.client("s3")),
            targets=ElbTargetGroup(self.aws.client("elbv2")),
            ledger=DynamoLoginLedger(self.aws.client("dynamodb"), TABLE),
            audit=self.audit_trail(),
            metrics=self.metrics,
            clock=self.aws.clock,
        )

    def audit_trail(self) -> AuditTrail:
        return AuditTrail(
            dynamodb=self.aws.client("dynamodb"),
            table=TABLE,
            events=self.aws.client("events"),
            event_bus="default",
            retention=timedelta(days=1),
            logger=logging.getLogger("test"),
        )

    def targets(self) -> dict[str, str]:
        return ElbTargetGroup(self.aws.client("elbv2")).states(self.target_group)

    def login_ips(self, cluster: str = CLUSTER) -> set[str]:
        return {node.private_ip for node in self.aws.hyperpod.nodes(cluster, "login")}


def login_cluster(name: str = CLUSTER, login_count: int = 2) -> dict[str, Any]:
    return cluster_request(
        name,
        group("p5-train", "ml.p5.48xlarge", 2, partition="ml-p5"),
        group("login", "ml.m5.4xlarge", login_count, node_type="Login"),
    )


@pytest.fixture
def endpoint(aws: AwsEmulator) -> Endpoint:
    ec2 = aws.client("ec2")
    vpc = ec2.create_vpc(CidrBlock="10.1.0.0/16")["Vpc"]["VpcId"]
    target_group = aws.client("elbv2").create_target_group(
        Name="llm-train-login", Protocol="TCP", Port=22, VpcId=vpc, TargetType="ip", HealthCheckProtocol="TCP"
    )["TargetGroups"][0]["TargetGroupArn"]
    create_state_table(aws.client("dynamodb"), TABLE)
    queue = subscribe(aws, "login-audit", {"source": ["topokeeper"], "detail-type": ["UpdateLoginTargets"]})
    aws.client("sagemaker").create_cluster(**login_cluster())
    return Endpoint(aws, target_group, RecordedMetrics(), queue)


def test_running_login_nodes_are_registered_and_audited_then_nothing_changes(endpoint: Endpoint) -> None:
    first = endpoint.sync()

    assert set(first.registered) == endpoint.login_ips() and len(first.registered) == 2
    assert set(endpoint.targets()) == endpoint.login_ips()
    assert endpoint.metrics.last(Metric.LOGIN_TARGETS_DRIFT) == 2
    (event,) = drain(endpoint.aws, endpoint.audit_queue)
    assert event["detail"]["event_name"] == "UpdateLoginTargets"
    assert set(event["detail"]["registered"]) == endpoint.login_ips()
    assert event["detail"]["deregistered"] == []
    # Stored in the history table like every audit record, apart from the partition records.
    (stored,) = endpoint.audit_trail().history(CLUSTER, event_name="UpdateLoginTargets")
    assert stored == event["detail"]
    assert endpoint.audit_trail().history(CLUSTER) == []

    second = endpoint.sync()
    assert (second.registered, second.deregistered, second.audit) == ((), (), None)
    assert endpoint.metrics.last(Metric.LOGIN_TARGETS_HEALTHY) == 2
    assert endpoint.metrics.last(Metric.LOGIN_TARGETS_DRIFT) == 0
    assert drain(endpoint.aws, endpoint.audit_queue) == []


def test_a_replaced_node_with_a_new_ip_swaps_its_target(endpoint: Endpoint) -> None:
    endpoint.sync()
    old = endpoint.aws.hyperpod.nodes(CLUSTER, "login")[0]
    endpoint.aws.hyperpod.replace(old.instance_id, new_ip=True)

    result = endpoint.sync()

    assert result.deregistered == (old.private_ip,)
    assert len(result.registered) == 1 and result.registered[0] != old.private_ip
    assert set(endpoint.targets()) == endpoint.login_ips()


def test_a_removed_node_and_a_failed_node_are_deregistered(endpoint: Endpoint) -> None:
    endpoint.aws.hyperpod.scale(CLUSTER, "login", 3)
    endpoint.sync()
    nodes = endpoint.aws.hyperpod.nodes(CLUSTER, "login")
    endpoint.aws.hyperpod.delete_nodes(CLUSTER, [nodes[0].instance_id])
    endpoint.aws.hyperpod.set_status(nodes[1].instance_id, "Failure")

    result = endpoint.sync()

    assert set(result.deregistered) == {nodes[0].private_ip, nodes[1].private_ip}
    assert set(endpoint.targets()) == {nodes[2].private_ip}


def test_an_unhealthy_login_node_stays_registered_and_the_healthy_count_drops(endpoint: Endpoint) -> None:
    endpoint.sync()
    sick = sorted(endpoint.login_ips())[0]
    endpoint.aws.target_health.set(endpoint.target_group, sick, "unhealthy")

    result = endpoint.sync()

    assert (result.registered, result.deregistered, result.healthy) == ((), (), 1)
    assert endpoint.targets()[sick] == "unhealthy"
    endpoint.aws.target_health.set(endpoint.target_group, sorted(endpoint.login_ips())[1], "unhealthy")
    endpoint.sync()
    assert endpoint.metrics.last(Metric.LOGIN_TARGETS_HEALTHY) == 0  # what the no-healthy-target alarm sees


def test_missed_events_are_healed_by_one_resync_and_foreign_targets_stay(endpoint: Endpoint) -> None:
    endpoint.sync()
    foreign = "10.1.200.9"
    ElbTargetGroup(endpoint.aws.client("elbv2")).register(endpoint.target_group, [foreign])
    # Several changes with no sync in between: the events were lost.
    endpoint.aws.hyperpod.scale(CLUSTER, "login", 4)
    first = endpoint.aws.hyperpod.nodes(CLUSTER, "login")[0]
    endpoint.aws.hyperpod.replace(first.instance_id, new_ip=True)

    endpoint.sync()

    assert set(endpoint.targets()) == endpoint.login_ips() | {foreign}
    assert first.private_ip not in endpoint.targets()


def test_a_cluster_without_login_nodes_creates_nothing_and_does_not_fail(endpoint: Endpoint) -> None:
    endpoint.aws.client("sagemaker").create_cluster(**cluster_request("no-login"))
    endpoint.aws.reset_counters()

    result = endpoint.sync("no-login")

    assert (result.has_login_group, result.registered, result.audit) == (False, (), None)
    assert endpoint.targets() == {}
    assert endpoint.aws.calls["RegisterTargets"] == 0
    assert endpoint.aws.calls["ListClusterNodes"] == 0
    assert drain(endpoint.aws, endpoint.audit_queue) == []


def test_the_emulator_refuses_an_unknown_health_state(aws: AwsEmulator) -> None:
    with pytest.raises(ValueError, match="target state must be one of"):
        aws.target_health.set("arn", "10.0.0.1", "sleepy")


def test_a_legacy_cluster_names_its_login_group_in_provisioning_parameters(endpoint: Endpoint) -> None:
    request = login_cluster("legacy")
    del request["Orchestrator"]
    for spec in request["InstanceGroups"]:
        del spec["SlurmConfig"]
        spec["LifeCycleConfig"] = {"SourceS3Uri": "s3://sagemaker-lifecycle/hyperpod/", "OnCreate": "on_create.sh"}
    endpoint.aws.client("sagemaker").create_cluster(**request)
    s3 = endpoint.aws.client("s3")
    s3.create_bucket(Bucket="sagemaker-lifecycle")
    parameters = {"controller_group": "controller", "login_group": "login", "worker_groups": []}
    s3.put_object(
        Bucket="sagemaker-lifecycle", Key="hyperpod/provisioning_parameters.json", Body=json.dumps(parameters)
    )

    result = endpoint.sync("legacy")

    assert result.has_login_group
    assert set(result.registered) == endpoint.login_ips("legacy") and len(result.registered) == 2


@dataclass
class FunctionRuntime:
    """What sync_login_endpoints takes from the Lambda runtime."""

    settings: Settings
    metrics: RecordedMetrics
    clock: Any
    env: LambdaEnvironment  # the real one, so a wrong attribute name fails here as it would in the Lambda
    audit: AuditTrail


@pytest.fixture
def runtime(endpoint: Endpoint, monkeypatch: pytest.MonkeyPatch) -> Iterator[FunctionRuntime]:
    for name, value in endpoint.aws.env().items():
        monkeypatch.setenv(name, value)
    clear_clients()  # the function's cached clients must reach this emulator
    login = {
        "enabled": True,
        "vpc_id": "vpc-0a1b2c3d4e5f60718",
        "vpc_config": {"security_group_ids": ["sg-0a1b2c3d4e5f60001"], "subnets": ["subnet-0a1b2c3d4e5f60001"]},
        "allowed_cidrs": ["10.0.0.0/8"],
    }
    settings = Settings.model_validate(
        {
            "clusters": [
                {
                    "name": CLUSTER,
                    "arn": endpoint.aws.client("sagemaker").describe_cluster(ClusterName=CLUSTER)["ClusterArn"],
                    "login": login,
                },
                {"name": "other"},
            ]
        }
    )
    env = LambdaEnvironment.model_validate(
        {
            "TOPOKEEPER_CONFIG": settings.to_env(),
            "TABLE_NAME": TABLE,
            "BUCKET_NAME": "unused",
            "QUEUE_URL": "https://unused",
        }
    )
    yield FunctionRuntime(settings, endpoint.metrics, endpoint.aws.clock, env, endpoint.audit_trail())
    clear_clients()


def test_the_functions_sync_only_clusters_with_a_login_endpoint(endpoint: Endpoint, runtime: FunctionRuntime) -> None:
    environ = {LOGIN_TARGET_GROUPS_ENV: json.dumps({CLUSTER: endpoint.target_group})}

    assert sync_login_endpoints(runtime, {}, CLUSTER).synced == {}  # no endpoint in this stack: no calls
    assert sync_login_endpoints(runtime, environ, "other").synced == {}
    report = sync_login_endpoints(
        runtime, environ, endpoint.aws.client("sagemaker").describe_cluster(ClusterName=CLUSTER)["ClusterArn"]
    )

    assert set(report.synced[CLUSTER]["registered"]) == endpoint.login_ips()
    assert set(endpoint.targets()) == endpoint.login_ips()
    report.raise_failures()  # nothing failed


def test_a_failing_cluster_is_reported_and_raised_after_the_rest(endpoint: Endpoint, runtime: FunctionRuntime) -> None:
    missing = endpoint.target_group.replace("llm-train-login", "gone")
    environ = {LOGIN_TARGET_GROUPS_ENV: json.dumps({CLUSTER: missing})}

    report = sync_login_endpoints(runtime, environ)

    assert report.synced == {} and len(report.failures) == 1 and report.failures[0].startswith(f"{CLUSTER}: ")
    with pytest.raises(Retryable, match="login target sync failed"):
        report.raise_failures()
