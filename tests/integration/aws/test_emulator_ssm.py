"""SSM Run Command: AWS's id checks, exact targets, the simulator's hook, and status-change events."""

from __future__ import annotations

from typing import Any

import pytest
from botocore.exceptions import ClientError

from tests.integration.aws.support import drain, subscribe
from topokeeper.sim.aws_emulator import AwsEmulator, CommandInvocationRequest, CommandOutcome

HYPERPOD_TARGET = "sagemaker-cluster:h4k2x9q7m1ab_controller-i-0123456789abcdef0"


def _instances(aws: AwsEmulator, count: int) -> list[str]:
    reservation = aws.client("ec2").run_instances(ImageId="ami-12345678", MinCount=count, MaxCount=count)
    return [i["InstanceId"] for i in reservation["Instances"]]


def _send(aws: AwsEmulator, instance_ids: list[str], *commands: str) -> dict[str, Any]:
    response = aws.client("ssm").send_command(
        InstanceIds=instance_ids,
        DocumentName="AWS-RunShellScript",
        Parameters={"commands": list(commands or ["echo hello"])},
        Comment="topokeeper apply",
    )
    return dict(response["Command"])


def test_send_command_refuses_ids_that_are_not_instance_ids(aws: AwsEmulator) -> None:
    ssm = aws.client("ssm")
    with pytest.raises(ClientError) as info:
        ssm.send_command(InstanceIds=[HYPERPOD_TARGET], DocumentName="AWS-RunShellScript")
    assert info.value.response["Error"]["Code"] == "InvalidInstanceId"
    assert HYPERPOD_TARGET in info.value.response["Error"]["Message"]
    with pytest.raises(ClientError) as info:
        ssm.send_command(InstanceIds=["i-0123456789abcdef0"] * 2, DocumentName="AWS-RunShellScript")
    assert info.value.response["Error"]["Code"] == "DuplicateInstanceId"
    assert ssm.list_commands()["Commands"] == []


def test_send_command_targets_exactly_the_ids_given(aws: AwsEmulator) -> None:
    first, *others = _instances(aws, 3)
    command = _send(aws, [first])
    assert command["InstanceIds"] == [first]
    assert command["TargetCount"] == 1
    assert command["Status"] == "Pending"  # as SendCommand answers; the invocation runs afterwards
    assert others


def test_on_command_result_shows_in_get_and_list_command_invocations(aws: AwsEmulator) -> None:
    seen: list[CommandInvocationRequest] = []

    def run(invocation: CommandInvocationRequest) -> CommandOutcome:
        seen.append(invocation)
        if invocation.instance_id == failing:
            return CommandOutcome("Failed", 2, "partial", "scontrol: error")
        return CommandOutcome("Success", 0, '{"outcome": "applied"}', "")

    aws.ssm.on_command = run
    ok, failing = _instances(aws, 2)
    command = _send(aws, [ok, failing], "set -e", "python3 /opt/topokeeper/applier.py --apply")
    command_id = command["CommandId"]
    ssm = aws.client("ssm")

    assert [s.instance_id for s in seen] == [ok, failing]
    assert seen[0].script == "set -e\npython3 /opt/topokeeper/applier.py --apply"
    good = ssm.get_command_invocation(CommandId=command_id, InstanceId=ok)
    assert (good["Status"], good["ResponseCode"], good["StandardOutputContent"]) == (
        "Success",
        0,
        '{"outcome": "applied"}',
    )
    bad = ssm.get_command_invocation(CommandId=command_id, InstanceId=failing)
    assert (bad["Status"], bad["ResponseCode"], bad["StandardErrorContent"]) == ("Failed", 2, "scontrol: error")

    listed = ssm.list_command_invocations(CommandId=command_id, Details=True)["CommandInvocations"]
    by_instance = {i["InstanceId"]: i for i in listed}
    assert set(by_instance) == {ok, failing}
    assert by_instance[ok]["Status"] == "Success"
    assert by_instance[ok]["CommandPlugins"][0]["Output"] == '{"outcome": "applied"}'
    assert by_instance[failing]["CommandPlugins"][0]["ResponseCode"] == 2
    assert "----------ERROR-------" in by_instance[failing]["CommandPlugins"][0]["Output"]
    assert ssm.list_commands(CommandId=command_id)["Commands"][0]["Status"] == "Failed"
    only_failed = ssm.list_command_invocations(Filters=[{"key": "Status", "value": "Failed"}])
    assert [i["InstanceId"] for i in only_failed["CommandInvocations"]] == [failing]


def test_a_deferred_invocation_is_completed_later(aws: AwsEmulator) -> None:
    aws.ssm.on_command = lambda invocation: None
    (instance,) = _instances(aws, 1)
    command_id = _send(aws, [instance])["CommandId"]
    ssm = aws.client("ssm")
    assert ssm.get_command_invocation(CommandId=command_id, InstanceId=instance)["Status"] == "InProgress"
    assert [p.command_id for p in aws.ssm.pending()] == [command_id]

    aws.ssm.complete(command_id, status="TimedOut", response_code=124, stderr="timeout")

    invocation = ssm.get_command_invocation(CommandId=command_id, InstanceId=instance)
    assert (invocation["Status"], invocation["ResponseCode"]) == ("TimedOut", 124)
    assert aws.ssm.pending() == []


def test_a_broken_hook_fails_the_invocation_visibly(aws: AwsEmulator) -> None:
    def broken(invocation: CommandInvocationRequest) -> None:
        raise RuntimeError("chroot missing")

    aws.ssm.on_command = broken
    (instance,) = _instances(aws, 1)
    command_id = _send(aws, [instance])["CommandId"]
    invocation = aws.ssm.invocation(command_id, instance)
    assert invocation["Status"] == "Failed"
    assert "chroot missing" in invocation["StandardErrorContent"]
    assert len(aws.ssm.errors) == 1


def test_invocation_status_change_reaches_sqs_through_a_rule(aws: AwsEmulator) -> None:
    queue = subscribe(
        aws,
        "ssm-status",
        {
            "source": ["aws.ssm"],
            "detail-type": ["EC2 Command Invocation Status-change Notification"],
            "detail": {"status": ["Success", "Failed"]},
        },
    )
    (instance,) = _instances(aws, 1)
    command_id = _send(aws, [instance])["CommandId"]

    (event,) = drain(aws, queue)

    assert event["source"] == "aws.ssm"
    assert event["account"] == aws.account_id
    assert event["resources"] == [f"arn:aws:ec2:us-east-1:{aws.account_id}:instance/{instance}"]
    detail = event["detail"]
    assert detail["command-id"] == command_id
    assert detail["instance-id"] == instance
    assert detail["document-name"] == "AWS-RunShellScript"
    assert detail["status"] == "Success"
    assert detail["requested-date-time"].endswith("Z")
    statuses = [e["detail"]["status"] for e in aws.events.emitted("EC2 Command Invocation Status-change Notification")]
    assert statuses == ["InProgress", "Success"]
