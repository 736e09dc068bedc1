"""The host identity installer on EC2 login nodes (plain-EC2 Slurm clusters) through SSM Run Command.

The one exception to "SendCommand only to the configured head nodes": the operator's CLI sends the installer
(``topokeeper.login.install``, validated values only) to the running instances that carry the login tag, by their
i- ids. Nothing from AWS reaches the script: the ids and the tag travel as API parameters.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from topokeeper.adapters.aws import aws_errors
from topokeeper.adapters.ssm_channel import INLINE_LIMIT_BYTES, command_size
from topokeeper.config import SSM_TARGET
from topokeeper.errors import InputError, Permanent
from topokeeper.events import RUN_SHELL_DOCUMENT

# SendCommand takes at most 50 InstanceIds per call (its InstanceIds shape), which botocore does not check.
MAX_INSTANCES_PER_COMMAND = 50
INSTALL_TIMEOUT_SECONDS = 600
TERMINAL = frozenset({"Success", "Failed", "TimedOut", "Cancelled", "Undeliverable", "Terminated"})


@aws_errors()
def tagged_login_instances(ec2: Any, tag_key: str, tag_value: str) -> list[str]:
    """The running instances that carry the login tag (pages of DescribeInstances, one filter, no call per node)."""
    ids: list[str] = []
    pages = ec2.get_paginator("describe_instances").paginate(
        Filters=[
            {"Name": f"tag:{tag_key}", "Values": [tag_value]},
            {"Name": "instance-state-name", "Values": ["running"]},
        ]
    )
    for page in pages:
        ids += [instance["InstanceId"] for r in page.get("Reservations", []) for instance in r.get("Instances", [])]
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
