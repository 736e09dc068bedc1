"""The host identity installer on EC2 login nodes through SSM Run Command, on the emulator: only the running
instances with the login tag, by i- id, 50 per command, the shipped installer as the script, one status each."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from topokeeper.adapters.aws import clear_clients
from topokeeper.cli.main import main
from topokeeper.login.install import install_script
from topokeeper.sim.aws_emulator import AwsEmulator, CommandInvocationRequest, CommandOutcome

IDENTITY_ARN = "arn:aws:secretsmanager:us-east-1:123456789012:secret:topokeeper/cfd/login-host-identity-AbCdEf"
TAG = "topokeeper:login"


def _instances(aws: AwsEmulator, count: int, tags: dict[str, str]) -> list[str]:
    spec = [{"ResourceType": "instance", "Tags": [{"Key": k, "Value": v} for k, v in tags.items()]}] if tags else []
    reservation = aws.client("ec2").run_instances(
        ImageId="ami-12345678", MinCount=count, MaxCount=count, TagSpecifications=spec
    )
    return sorted(i["InstanceId"] for i in reservation["Instances"])


@pytest.fixture
def cli(aws: AwsEmulator, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[CommandInvocationRequest]]:
    for name, value in aws.env().items():
        monkeypatch.setenv(name, value)
    clear_clients()
    received: list[CommandInvocationRequest] = []

    def run(invocation: CommandInvocationRequest) -> CommandOutcome:
        received.append(invocation)
        return CommandOutcome("Success", 0, "host identity installed", "")

    aws.ssm.on_command = run
    yield received
    clear_clients()


def _install(tag: str = f"{TAG}=cfd") -> int:
    secret = ["--secret-arn", IDENTITY_ARN, "--secret-region", "us-east-1"]
    return main(["login", "install-run-command", "--cluster", "cfd", "--tag", tag, *secret])


def test_only_running_tagged_login_nodes_get_the_shipped_installer(
    aws: AwsEmulator, cli: list[CommandInvocationRequest], capsys: pytest.CaptureFixture[str]
) -> None:
    login = _instances(aws, 2, {TAG: "cfd"})
    other_cluster = _instances(aws, 1, {TAG: "other"})
    _instances(aws, 2, {})  # compute nodes: no tag
    stopped = _instances(aws, 1, {TAG: "cfd"})
    aws.client("ec2").stop_instances(InstanceIds=stopped)

    assert _install() == 0

    assert sorted(invocation.instance_id for invocation in cli) == login
    assert {invocation.script for invocation in cli} == {install_script(IDENTITY_ARN, "us-east-1")}
    assert {invocation.document_name for invocation in cli} == {"AWS-RunShellScript"}
    printed = capsys.readouterr().out
    assert all(f"{instance}: Success" in printed for instance in login)
    assert other_cluster[0] not in printed and stopped[0] not in printed


def test_more_than_fifty_login_nodes_take_one_command_per_fifty(
    aws: AwsEmulator, cli: list[CommandInvocationRequest]
) -> None:
    login = _instances(aws, 60, {TAG: "cfd"})

    assert _install() == 0

    assert sorted(invocation.instance_id for invocation in cli) == login
    assert sorted(len([i for i in cli if i.command_id == c]) for c in {i.command_id for i in cli}) == [10, 50]


def test_a_failed_install_fails_the_command_and_names_the_node(
    aws: AwsEmulator, cli: list[CommandInvocationRequest], capsys: pytest.CaptureFixture[str]
) -> None:
    good, bad = _instances(aws, 2, {TAG: "cfd"})
    aws.ssm.on_command = lambda invocation: CommandOutcome(
        "Failed" if invocation.instance_id == bad else "Success", 1, "", "sshd -t refused the new config"
    )

    assert _install() == 1

    printed = capsys.readouterr().out
    assert f"{good}: Success" in printed and f"{bad}: Failed" in printed


def test_no_tagged_node_sends_nothing_and_a_bad_tag_names_the_option(
    aws: AwsEmulator, cli: list[CommandInvocationRequest], capsys: pytest.CaptureFixture[str]
) -> None:
    assert _install() == 0 and cli == []
    assert aws.client("ssm").list_commands()["Commands"] == []
    assert _install("no-value") != 0
    assert "--tag" in capsys.readouterr().err


@pytest.mark.parametrize("value", ["*", "cf?", "c*"])
def test_a_tag_value_with_an_ec2_filter_wildcard_is_refused_before_anything_is_sent(
    aws: AwsEmulator, cli: list[CommandInvocationRequest], capsys: pytest.CaptureFixture[str], value: str
) -> None:
    # EC2 filter values treat * and ? as wildcards: "*" would send the installer to every tagged instance.
    _instances(aws, 1, {TAG: "cfd"})
    _instances(aws, 1, {TAG: "other"})

    assert _install(f"{TAG}={value}") != 0

    assert cli == [] and "--tag" in capsys.readouterr().err
