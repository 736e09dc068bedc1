"""The host identity installer on EC2 login nodes (plain-EC2 Slurm clusters) through SSM Run Command.

The one exception to "SendCommand only to the configured head nodes": the installer (``topokeeper.login.install``,
validated values only) goes to instances that carry the login tag, by their i- ids: from the operator's CLI to every
running one, and from the ingest function to each one at launch (its IAM allows only instances with the tag).
Nothing from AWS reaches the script: the ids and the tag travel as API parameters.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from topokeeper.adapters.aws import aws_errors
from topokeeper.adapters.login_nodes import RUNNING_STATUS, Ec2LoginNodes
from topokeeper.adapters.ssm_channel import INLINE_LIMIT_BYTES, command_size
from topokeeper.contract.config import SSM_TARGET
from topokeeper.contract.constants import RUN_SHELL_DOCUMENT
from topokeeper.contract.errors import InputError, Permanent

# SendCommand takes at most 50 InstanceIds per call (its InstanceIds shape), which botocore does not check.
MAX_INSTANCES_PER_COMMAND = 50
INSTALL_TIMEOUT_SECONDS = 600
TERMINAL = frozenset({"Success", "Failed", "TimedOut", "Cancelled", "Undeliverable", "Terminated"})


def tagged_login_instances(ec2: Any, tag_key: str, tag_value: str) -> list[str]:
    """The running instances that carry the login tag (pages of DescribeInstances, one filter, no call per node)."""
    ids = [node.node_id for node in Ec2LoginNodes(ec2, tag_key).login_nodes(tag_value) if node.status == RUNNING_STATUS]
    for instance_id in ids:
        if not SSM_TARGET.fullmatch(instance_id):
            raise InputError("instance", f"SSM SendCommand takes i- ids only, not {instance_id!r}")
    return sorted(set(ids))


class RunCommandInstaller:
    def __init__(self, ssm: Any, sleep: Callable[[float], None]) -> None:
        self._ssm = ssm
        self._sleep = sleep

    def send(self, instance_ids: list[str], script: str, cluster: str) -> list[str]:
        """One command per 50 instances; returns the command ids."""
        commands = [script]
        if command_size(commands) > INLINE_LIMIT_BYTES:
            raise Permanent(f"the installer is {command_size(commands)} bytes, over SSM's inline limit")
        sent = []
        for start in range(0, len(instance_ids), MAX_INSTANCES_PER_COMMAND):
            with aws_errors():
                response = self._ssm.send_command(
                    InstanceIds=instance_ids[start : start + MAX_INSTANCES_PER_COMMAND],
                    DocumentName=RUN_SHELL_DOCUMENT,
                    Parameters={"commands": commands, "executionTimeout": [str(INSTALL_TIMEOUT_SECONDS)]},
                    TimeoutSeconds=INSTALL_TIMEOUT_SECONDS,
                    Comment=f"topokeeper login host identity {cluster}"[:100],
                )
            sent.append(str(response["Command"]["CommandId"]))
        return sent

    def statuses(self, command_ids: list[str]) -> dict[str, str]:
        """Instance id -> its invocation's status (pages of ListCommandInvocations)."""
        found: dict[str, str] = {}
        with aws_errors():
            for command_id in command_ids:
                pages = self._ssm.get_paginator("list_command_invocations").paginate(CommandId=command_id)
                for page in pages:
                    for invocation in page.get("CommandInvocations", []):
                        found[str(invocation["InstanceId"])] = str(invocation["Status"])
        return dict(sorted(found.items()))

    def wait(self, command_ids: list[str], expected: int, attempts: int = 120, interval: float = 5) -> dict[str, str]:
        """Until every invocation has ended (or ``attempts`` polls): instance id -> final status."""
        statuses = self.statuses(command_ids)
        for _ in range(attempts):
            if len(statuses) >= expected and all(status in TERMINAL for status in statuses.values()):
                break
            self._sleep(interval)
            statuses = self.statuses(command_ids)
        return statuses
