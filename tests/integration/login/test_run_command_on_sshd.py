"""The host identity installer as the stack sends it to an EC2 login node, run in a real sshd chroot.

The ingest function's own path (``install_login_host_identity``) sends the installer through the emulator's SSM;
the emulator hands each invocation to a stand-in SSM agent that does what the agent does with AWS-RunShellScript:
writes the document's ``commands`` to ``_script.sh`` in its orchestration directory and runs ``sh -c`` on it, as
root, on the node (a chroot with a running sshd and its own launch-time host keys). The node's ``aws`` CLI is a
stand-in that answers only the one Secrets Manager call the installer makes. Then an ssh client that trusts only
the cluster's ``known_hosts`` line connects with StrictHostKeyChecking=yes.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.login.test_host_identity_on_sshd import ENDPOINT, ssh
from topokeeper.adapters.aws import clear_clients
from topokeeper.contract.config import Settings
from topokeeper.contract.constants import (
    ENV_BUCKET,
    ENV_CONFIG,
    ENV_QUEUE,
    ENV_TABLE,
    LOGIN_TARGET_GROUPS_ENV,
    login_secret_names,
)
from topokeeper.contract.event_schemas import EC2_STATE_DETAIL_TYPE, TopokeeperEvent
from topokeeper.login.host_keys import generate
from topokeeper.sim.aws_emulator import AwsEmulator, CommandInvocationRequest, CommandOutcome, ManualClock
from topokeeper.sim.login_chroot import LoginNode, ensure_login_chroot
from topokeeper.sim.slurm_chroot import free_port
from topokeeper.sim.stack import create_state_table
from topokeeper.wiring.login_sync import install_login_host_identity
from topokeeper.wiring.runtime import Runtime

pytestmark = pytest.mark.slurm

CLUSTER = "cfd"
TABLE = "topokeeper-state"
# The ingest function's target group ARN names the stack's account and region, where the secret lives.
TARGET_GROUP = "arn:aws:elasticloadbalancing:us-east-1:123456789012:targetgroup/cfd-login/0123456789abcdef"
SECRET_ARN = f"arn:aws:secretsmanager:us-east-1:123456789012:secret:{login_secret_names(CLUSTER)[0]}"
STANDIN_AWS_CLI = """#!/bin/sh
# Stand-in for the AWS CLI: only the call the installer makes, with the login role's answer.
expected='secretsmanager get-secret-value --region us-east-1 --secret-id {secret} --query SecretString --output text'
if [ "$*" != "$expected" ]; then echo "aws stand-in: unexpected call: $*" >&2; exit 252; fi
cat /root/.secret-value
"""


def ssm_agent(node: LoginNode, invocation: CommandInvocationRequest) -> CommandOutcome:
    """What the SSM agent does with an AWS-RunShellScript invocation on a Linux instance."""
    orchestration = (
        f"var/lib/amazon/ssm/{invocation.instance_id}/document/orchestration/{invocation.command_id}"
        "/awsrunShellScript/0.awsrunShellScript"
    )
    script = node.root / orchestration / "_script.sh"
    script.parent.mkdir(parents=True)
    script.write_text("\n".join(invocation.commands))
    script.chmod(0o755)
    run = node.chroot("sh", "-c", f"/{orchestration}/_script.sh", check=False)
    return CommandOutcome("Success" if run.returncode == 0 else "Failed", run.returncode, run.stdout, run.stderr)


@pytest.fixture
def node(tmp_path: Path) -> Iterator[LoginNode]:
    login = LoginNode(base=ensure_login_chroot(), workdir=tmp_path / "ec2-login", port=free_port())
    login.mount()
    try:
        yield login
    finally:
        login.stop()


@pytest.fixture
def user_key(tmp_path: Path) -> Path:
    key = tmp_path / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    return key


def launched(node: LoginNode, user_key: Path, secret_value: str) -> None:
    """A fresh EC2 login node: its own host keys from first boot, sshd running, the stand-in CLI."""
    node.chroot("ssh-keygen", "-A")
    ssh_dir = node.root / "root/.ssh"
    ssh_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    (ssh_dir / "authorized_keys").write_text(user_key.with_suffix(".pub").read_text())
    (ssh_dir / "authorized_keys").chmod(0o600)
    (node.root / "etc/topokeeper-node").write_text("ec2-login\n")
    (node.root / "root/.secret-value").write_text(secret_value)
    cli = node.root / "usr/local/bin/aws"
    cli.write_text(STANDIN_AWS_CLI.format(secret=SECRET_ARN))
    cli.chmod(0o755)
    node.start_sshd()


def running_event(instance_id: str) -> TopokeeperEvent:
    return TopokeeperEvent.model_validate(
        {
            "version": "0",
            "id": f"running-{instance_id}",
            "detail-type": EC2_STATE_DETAIL_TYPE,
            "source": "aws.ec2",
            "account": "123456789012",
            "time": "2026-01-05T09:00:00Z",
            "region": "us-east-1",
            "resources": [],
            "detail": {"instance-id": instance_id, "state": "running"},
        }
    )


@pytest.fixture
def stack_function(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[AwsEmulator, Runtime, dict[str, str]]]:
    """The ingest function's runtime on the emulator: an EC2 cluster with a login endpoint."""
    with AwsEmulator(seed=7, clock=ManualClock()) as aws:
        for name, value in aws.env().items():
            monkeypatch.setenv(name, value)
        clear_clients()
        create_state_table(aws.client("dynamodb"), TABLE)
        login = {
            "enabled": True,
            "vpc_id": "vpc-0a1b2c3d4e5f60718",
            "vpc_config": {"security_group_ids": ["sg-0a1b2c3d4e5f60001"], "subnets": ["subnet-0a1b2c3d4e5f60001"]},
            "allowed_cidrs": ["10.0.0.0/8"],
        }
        cluster = {"name": CLUSTER, "orchestrator": "ec2", "head_node": "i-0a1b2c3d4e5f60718", "login": login}
        settings = Settings.model_validate({"clusters": [cluster]})
        environ = {
            ENV_CONFIG: settings.to_env(),
            ENV_TABLE: TABLE,
            ENV_BUCKET: "unused-by-ingest",
            ENV_QUEUE: "https://unused-by-the-installer",
            LOGIN_TARGET_GROUPS_ENV: json.dumps({CLUSTER: TARGET_GROUP}),
        }
        yield aws, Runtime.from_environment({**aws.env(), **environ}, clock=aws.clock), environ
        clear_clients()


def test_the_run_command_installer_gives_a_launched_ec2_login_node_the_clusters_identity(
    node: LoginNode, user_key: Path, tmp_path: Path, stack_function: tuple[AwsEmulator, Runtime, dict[str, str]]
) -> None:
    aws, runtime, environ = stack_function
    identity = generate(CLUSTER, [ENDPOINT])
    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text(identity.known_hosts_line + "\n")
    launched(node, user_key, identity.bundle)
    before = ssh(node.port, known_hosts, user_key)
    assert before.returncode != 0 and "Host key verification failed" in before.stderr  # its own launch keys

    tags = [{"ResourceType": "instance", "Tags": [{"Key": "topokeeper:login", "Value": CLUSTER}]}]
    (instance,) = aws.client("ec2").run_instances(
        ImageId="ami-12345678", MinCount=1, MaxCount=1, TagSpecifications=tags
    )["Instances"]
    outcomes: list[tuple[CommandInvocationRequest, CommandOutcome]] = []

    def agent(invocation: CommandInvocationRequest) -> CommandOutcome:
        outcome = ssm_agent(node, invocation)
        outcomes.append((invocation, outcome))
        return outcome

    aws.ssm.on_command = agent
    installed = install_login_host_identity(runtime, environ, running_event(instance["InstanceId"]))

    assert installed is not None and installed.status == "sent"
    ((invocation, outcome),) = outcomes
    assert outcome.status == "Success", outcome.stderr
    assert "topokeeper-host-identity: installed" in outcome.stdout
    listed: Any = aws.client("ssm").list_command_invocations(CommandId=invocation.command_id)["CommandInvocations"]
    assert [i["Status"] for i in listed] == ["Success"]
    answer = ssh(node.port, known_hosts, user_key)  # sshd was reloaded by the installer: no restart here
    assert answer.returncode == 0, answer.stderr
    assert answer.stdout.strip() == "ec2-login"
    assert not ("WARNING" in answer.stderr or "host key" in answer.stderr.lower())
    assert known_hosts.read_text() == identity.known_hosts_line + "\n"


def test_an_installer_the_node_cannot_complete_fails_the_invocation_and_changes_nothing(
    node: LoginNode, user_key: Path, tmp_path: Path, stack_function: tuple[AwsEmulator, Runtime, dict[str, str]]
) -> None:
    aws, runtime, environ = stack_function
    launched(node, user_key, "not a host identity bundle\n")
    config = (node.root / "etc/ssh/sshd_config").read_bytes()
    tags = [{"ResourceType": "instance", "Tags": [{"Key": "topokeeper:login", "Value": CLUSTER}]}]
    (instance,) = aws.client("ec2").run_instances(
        ImageId="ami-12345678", MinCount=1, MaxCount=1, TagSpecifications=tags
    )["Instances"]
    outcomes: list[CommandOutcome] = []
    aws.ssm.on_command = lambda invocation: outcomes.append(ssm_agent(node, invocation)) or outcomes[-1]

    install_login_host_identity(runtime, environ, running_event(instance["InstanceId"]))

    (outcome,) = outcomes
    assert outcome.status == "Failed" and "not a topokeeper host identity bundle" in outcome.stderr
    assert (node.root / "etc/ssh/sshd_config").read_bytes() == config
    assert not (node.root / "etc/ssh/topokeeper").exists()
