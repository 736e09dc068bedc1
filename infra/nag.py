"""cdk-nag (AwsSolutions) acknowledgments: each one at the construct that causes it, with its reason."""

from __future__ import annotations

from aws_cdk import Acknowledgment, CfnResource, Stack, Validations
from constructs import IConstruct

_PACK = "AwsSolutions"


def acknowledge(scope: IConstruct, finding: str, reason: str) -> None:
    """Accept ``finding`` (e.g. ``IAM5[Resource::*]``) for ``scope`` and its children only."""
    Validations.of(scope).acknowledge(Acknowledgment(id=f"{_PACK}::{_PACK}-{finding}", reason=reason))


def arn_of(resource: CfnResource) -> str:
    """How cdk-nag writes a resource's ``Fn::GetAtt Arn`` in a finding: ``<LogicalId.Arn>``."""
    return f"<{Stack.of(resource).get_logical_id(resource)}.Arn>"
