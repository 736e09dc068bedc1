"""A login endpoint's IP target group (Elastic Load Balancing v2): its targets' states, register, deregister."""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from typing import Any

from topokeeper.adapters.aws import aws_errors
from topokeeper.contract.errors import InputError


def _targets(ips: Sequence[str], port: int) -> list[dict[str, Any]]:
    for ip in ips:
        # IP targets must be IPv4 addresses in the target group's VPC; botocore takes any string.
        try:
            ipaddress.IPv4Address(ip)
        except ValueError:
            raise InputError("login target", f"not an IPv4 address: {ip!r}") from None
    return [{"Id": ip, "Port": port} for ip in ips]


class ElbTargetGroup:
    def __init__(self, elbv2: Any, port: int = 22) -> None:
        self._elbv2 = elbv2
        self._port = port

    def states(self, target_group_arn: str) -> dict[str, str]:
        with aws_errors():
            descriptions = self._elbv2.describe_target_health(TargetGroupArn=target_group_arn)
        return {
            str(item["Target"]["Id"]): str(item["TargetHealth"]["State"])
            for item in descriptions.get("TargetHealthDescriptions", [])
            if item["Target"].get("Port", self._port) == self._port
        }

    def register(self, target_group_arn: str, ips: Sequence[str]) -> None:
        with aws_errors():
            self._elbv2.register_targets(TargetGroupArn=target_group_arn, Targets=_targets(ips, self._port))

    def deregister(self, target_group_arn: str, ips: Sequence[str]) -> None:
        with aws_errors():
            self._elbv2.deregister_targets(TargetGroupArn=target_group_arn, Targets=_targets(ips, self._port))
