"""EC2 login nodes on the emulator, through the deployed ingest handler (functions/ingest/handler.py): the instances
whose login tag holds the cluster's name. At launch the function sends the host identity installer (once per launch,
SSM authorized with the stack's own tag-scoped statements) and the endpoint's IP targets follow the login nodes
(moto's ELBv2); the drift function's sync heals a missed event."""

from __future__ import annotations

import functools
import itertools
import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from botocore.exceptions import ClientError

from infra.login_endpoint import installer_statements
from tests.integration.aws.support import drain, subscribe
from topokeeper.adapters.aws import clear_clients
from topokeeper.adapters.elbv2 import ElbTargetGroup
from topokeeper.adapters.login_nodes import DynamoLoginInstallLedger, launched_instance
from topokeeper.adapters.login_run_command import RunCommandInstaller
from topokeeper.contract.config import Settings
from topokeeper.contract.constants import (
    ENV_BUCKET,
    ENV_CONFIG,
    ENV_QUEUE,
    ENV_TABLE,
    LOGIN_TARGET_GROUPS_ENV,
    login_secret_names,
)
from topokeeper.contract.errors import Permanent, Retryable
from topokeeper.contract.event_schemas import EC2_STATE_DETAIL_TYPE
from topokeeper.contract.ports import InstallClaim
from topokeeper.login.install import install_script
from topokeeper.sim.aws_emulator import AwsEmulator, CommandInvocationRequest, CommandOutcome
from topokeeper.sim.lambda_host import LambdaContext, load_handler
from topokeeper.sim.stack import create_state_table
from topokeeper.wiring.login_sync import INSTALL_CLAIM_LEASE, sync_login_endpoints
from topokeeper.wiring.runtime import Runtime, install_runtime

CLUSTER = "cfd"
LOGIN_TAG = "topokeeper:login"
CLUSTER_TAG = "topokeeper:cluster"
# The ingest role as far as these tests go: anything but SendCommand, which only the stack's own statements grant.
ALL_BUT_SEND = {"Effect": "Allow", "NotAction": "ssm:SendCommand", "Resource": "*"}


@functools.cache
def ingest_handler() -> Any:
    return load_handler("ingest")


@dataclass
class Ec2Login:
    aws: AwsEmulator
    settings: Settings
    target_group: str
    environ: dict[str, str]
    role: str  # the ingest function's role, whose credentials its requests carry
    received: list[CommandInvocationRequest]
    audit_queue: str
    _ids: Iterator[int]

    def launch(self, tags: dict[str, str], count: int = 1) -> list[str]:
        spec = [{"ResourceType": "instance", "Tags": [{"Key": k, "Value": v} for k, v in tags.items()]}]
        reservation = self.aws.client("ec2").run_instances(
            ImageId="ami-12345678", MinCount=count, MaxCount=count, TagSpecifications=spec
        )
        return sorted(i["InstanceId"] for i in reservation["Instances"])

    def event(self, instance_id: str, state: str, event_id: str | None = None) -> dict[str, Any]:
        return {
            "version": "0",
            "id": event_id or f"ec2-event-{next(self._ids)}",
            "detail-type": EC2_STATE_DETAIL_TYPE,
            "source": "aws.ec2",
            "account": self.aws.account_id,
            "time": self.aws.clock.now().strftime("%Y-%m-%dT%H:%M:%SZ"),
            "region": self.aws.region,
            "resources": [f"arn:aws:ec2:{self.aws.region}:{self.aws.account_id}:instance/{instance_id}"],
            "detail": {"instance-id": instance_id, "state": state},
        }

    def ingest(self, event: dict[str, Any]) -> dict[str, Any]:
        with self.aws.iam.acting_as(self.role):
            result: dict[str, Any] = ingest_handler()(event, LambdaContext("ingest"))
        return result

    def ip(self, instance_id: str) -> str:
        (reservation,) = self.aws.client("ec2").describe_instances(InstanceIds=[instance_id])["Reservations"]
        return str(reservation["Instances"][0]["PrivateIpAddress"])

    def targets(self) -> dict[str, str]:
        return ElbTargetGroup(self.aws.client("elbv2")).states(self.target_group)

    def audit(self) -> dict[str, list[dict[str, Any]]]:
        """The audit records published since the last call, by kind."""
        kinds: dict[str, list[dict[str, Any]]] = {}
        for event in drain(self.aws, self.audit_queue):
            kinds.setdefault(event["detail-type"], []).append(event["detail"])
        return kinds


@pytest.fixture
def login(aws: AwsEmulator, monkeypatch: pytest.MonkeyPatch) -> Iterator[Ec2Login]:
    for name, value in aws.env().items():
        monkeypatch.setenv(name, value)
    clear_clients()
    vpc = aws.client("ec2").describe_vpcs()["Vpcs"][0]["VpcId"]  # the default VPC, where run_instances puts nodes
    target_group = aws.client("elbv2").create_target_group(
        Name="cfd-login", Protocol="TCP", Port=22, VpcId=vpc, TargetType="ip", HealthCheckProtocol="TCP"
    )["TargetGroups"][0]["TargetGroupArn"]
    login_settings = {
        "enabled": True,
        "vpc_id": "vpc-0a1b2c3d4e5f60718",
        "vpc_config": {"security_group_ids": ["sg-0a1b2c3d4e5f60001"], "subnets": ["subnet-0a1b2c3d4e5f60001"]},
        "allowed_cidrs": ["10.0.0.0/8"],
    }
    settings = Settings.model_validate(
        {
            "clusters": [
                {"name": CLUSTER, "orchestrator": "ec2", "head_node": "i-0a1b2c3d4e5f60718", "login": login_settings},
                {"name": "other", "orchestrator": "ec2", "head_node": "i-0a1b2c3d4e5f60719"},
            ]
        }
    )
    create_state_table(aws.client("dynamodb"), "topokeeper-state")
    queue = aws.client("sqs").create_queue(
        QueueName="work.fifo", Attributes={"FifoQueue": "true", "ContentBasedDeduplication": "false"}
    )["QueueUrl"]
    environ = {
        ENV_CONFIG: settings.to_env(),
        ENV_TABLE: "topokeeper-state",
        ENV_BUCKET: "unused-by-ingest",
        ENV_QUEUE: queue,
        LOGIN_TARGET_GROUPS_ENV: json.dumps({CLUSTER: target_group}),
    }
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    install_runtime(Runtime.from_environment({**aws.env(), **environ}, clock=aws.clock))
    # SendCommand as IAM would allow it to the ingest function: the stack's own installer statements.
    role = f"arn:aws:iam::{aws.account_id}:role/topokeeper-ingest"
    aws.iam.add_role(
        role, [ALL_BUT_SEND, *installer_statements(settings.clusters[:1], "aws", aws.region, aws.account_id)]
    )
    received: list[CommandInvocationRequest] = []

    def run(invocation: CommandInvocationRequest) -> CommandOutcome:
        received.append(invocation)
        return CommandOutcome("Success", 0, "topokeeper-host-identity: installed", "")

    aws.ssm.on_command = run
    audit_queue = subscribe(aws, "login-audit", {"source": ["topokeeper"]})
    yield Ec2Login(aws, settings, target_group, environ, role, received, audit_queue, itertools.count())
    install_runtime(None)
    clear_clients()


def expected_script(aws: AwsEmulator) -> str:
    # The secret in the stack's account and region, by its name (GetSecretValue takes an ARN without the suffix).
    arn = f"arn:aws:secretsmanager:{aws.region}:{aws.account_id}:secret:{login_secret_names(CLUSTER)[0]}"
    return install_script(arn, aws.region)


def test_a_launched_login_node_gets_the_installer_once_and_becomes_a_target(login: Ec2Login) -> None:
    first, second = login.launch({LOGIN_TAG: CLUSTER}, count=2)
    compute = login.launch({CLUSTER_TAG: CLUSTER})[0]

    result = login.ingest(login.event(first, "running", "launch-1"))

    assert result["status"] == "queued" and result["cluster"] == CLUSTER  # a login node is the cluster's too
    (sent,) = login.received
    assert (sent.instance_id, sent.document_name) == (first, "AWS-RunShellScript")
    assert sent.script == expected_script(login.aws)
    # The sync is level-triggered: both running login nodes are targets, the compute node is not.
    assert set(login.targets()) == {login.ip(first), login.ip(second)}
    assert login.ip(compute) not in login.targets()
    audit = login.audit()
    (record,) = audit["InstallLoginHostIdentity"]
    assert (record["instance_id"], record["command_id"], record["cluster_name"]) == (first, sent.command_id, CLUSTER)
    assert set(audit["UpdateLoginTargets"][0]["registered"]) == {login.ip(first), login.ip(second)}
    stored = Runtime.from_environment(login.environ).audit.history(CLUSTER, event_name="InstallLoginHostIdentity")
    assert stored == [record]

    # The same event delivered again, and another running event of the same launch: nothing is sent again.
    assert login.ingest(login.event(first, "running", "launch-1"))["status"] == "duplicate"
    login.ingest(login.event(first, "running"))
    assert len(login.received) == 1 and "InstallLoginHostIdentity" not in login.audit()

    # A state change of a compute node or of a login node that is not running sends nothing.
    login.ingest(login.event(compute, "running"))
    login.ingest(login.event(second, "pending"))
    assert len(login.received) == 1


def test_a_replacement_gets_the_installer_and_takes_the_departed_nodes_place(login: Ec2Login) -> None:
    (old,) = login.launch({LOGIN_TAG: CLUSTER})
    login.ingest(login.event(old, "running"))
    old_ip = login.ip(old)

    login.aws.client("ec2").terminate_instances(InstanceIds=[old])
    login.ingest(login.event(old, "shutting-down"))
    assert login.targets() == {}  # the departed node's target goes with its event
    (new,) = login.launch({LOGIN_TAG: CLUSTER})
    login.ingest(login.event(new, "running"))

    assert [r.instance_id for r in login.received] == [old, new]
    assert login.ip(new) != old_ip
    assert set(login.targets()) == {login.ip(new)}


def test_a_stopped_and_started_node_is_a_new_launch(login: Ec2Login) -> None:
    (node,) = login.launch({LOGIN_TAG: CLUSTER})
    login.ingest(login.event(node, "running"))
    ec2 = login.aws.client("ec2")
    ec2.stop_instances(InstanceIds=[node])
    login.aws.clock.advance(60)
    ec2.start_instances(InstanceIds=[node])

    login.ingest(login.event(node, "running"))

    assert [r.instance_id for r in login.received] == [node, node]


def test_the_stacks_iam_refuses_the_installer_to_any_instance_without_the_clusters_login_tag(login: Ec2Login) -> None:
    (tagged,) = login.launch({LOGIN_TAG: CLUSTER})
    (untagged,) = login.launch({CLUSTER_TAG: CLUSTER})
    (other,) = login.launch({LOGIN_TAG: "other"})  # the login tag of a cluster without an endpoint here
    installer = RunCommandInstaller(login.aws.client("ssm"), lambda _: None)

    with login.aws.iam.acting_as(login.role):
        for refused in (untagged, other):
            with pytest.raises(Permanent, match="AccessDeniedException.*not authorized to perform: ssm:SendCommand"):
                installer.send([refused], expected_script(login.aws), CLUSTER)
            with pytest.raises(Permanent, match="AccessDenied"):  # nor with a tagged one alongside
                installer.send([tagged, refused], expected_script(login.aws), CLUSTER)
        with pytest.raises(ClientError, match="document/AWS-RunPowerShellScript"):  # the document is pinned
            login.aws.client("ssm").send_command(InstanceIds=[tagged], DocumentName="AWS-RunPowerShellScript")
        assert login.received == []
        installer.send([tagged], expected_script(login.aws), CLUSTER)
    assert [r.instance_id for r in login.received] == [tagged]


def test_a_failed_send_raises_with_its_reason_and_the_retry_sends(login: Ec2Login) -> None:
    (node,) = login.launch({LOGIN_TAG: CLUSTER})
    role = login.aws.iam.role(login.role)
    policy, role.statements = role.statements, [ALL_BUT_SEND]  # the function's role lost its installer statements
    event = login.event(node, "running", "launch-fails")

    # Lambda retries a raising asynchronous invocation twice, then sends it to the event DLQ with this message.
    for _ in range(2):
        with pytest.raises(Permanent, match="AccessDeniedException.*not authorized to perform: ssm:SendCommand"):
            login.ingest(event)
    assert login.received == [] and "InstallLoginHostIdentity" not in login.audit()

    role.statements = policy
    login.ingest(event)  # a retry (or a redrive from the DLQ) after the fix: sent, once
    login.ingest(event)
    assert [r.instance_id for r in login.received] == [node]


def test_the_drift_sync_heals_missed_events(login: Ec2Login) -> None:
    nodes = login.launch({LOGIN_TAG: CLUSTER}, count=3)
    foreign = "172.31.200.9"
    ElbTargetGroup(login.aws.client("elbv2")).register(login.target_group, [foreign])
    runtime = Runtime.from_environment({**login.aws.env(), **login.environ}, clock=login.aws.clock)

    first = sync_login_endpoints(runtime, login.environ)  # every cluster, as the drift function does
    assert set(first.synced[CLUSTER]["registered"]) == {login.ip(n) for n in nodes}

    # Lost events: one node terminated, one replaced; then only the schedule's sync.
    gone = login.ip(nodes[0])
    login.aws.client("ec2").terminate_instances(InstanceIds=nodes[:1])
    (added,) = login.launch({LOGIN_TAG: CLUSTER})
    healed = sync_login_endpoints(runtime, login.environ)

    assert healed.synced[CLUSTER] == {"registered": [login.ip(added)], "deregistered": [gone]}
    assert set(login.targets()) == {login.ip(n) for n in (*nodes[1:], added)} | {foreign}  # a foreign target stays
    assert sync_login_endpoints(runtime, login.environ).synced[CLUSTER] == {"registered": [], "deregistered": []}


def test_a_delivery_that_finds_a_send_in_flight_retries_and_a_dead_claim_is_taken_over(login: Ec2Login) -> None:
    (node,) = login.launch({LOGIN_TAG: CLUSTER})
    instance = launched_instance(login.aws.client("ec2"), node)
    assert instance is not None
    ledger = DynamoLoginInstallLedger(login.aws.client("dynamodb"), "topokeeper-state", INSTALL_CLAIM_LEASE)
    # Another invocation claimed this launch and has not sent yet (or died before sending).
    assert ledger.claim(CLUSTER, node, instance.launch_time, login.aws.clock.now()) is InstallClaim.CLAIMED

    with pytest.raises(Retryable, match="another invocation is sending"):
        login.ingest(login.event(node, "running"))
    assert login.received == []

    login.aws.clock.advance(INSTALL_CLAIM_LEASE.total_seconds() + 1)  # its holder is gone: the claim is stale
    login.ingest(login.event(node, "running"))
    assert [r.instance_id for r in login.received] == [node]
    assert ledger.claim(CLUSTER, node, instance.launch_time, login.aws.clock.now()) is InstallClaim.SENT
