"""The plan bucket: rendered plans, bundles for the head-node agents, and payloads too large for events."""

from __future__ import annotations

from typing import Any, cast

from aws_cdk import CfnResource, Duration, RemovalPolicy
from aws_cdk import aws_iam as iam
from aws_cdk import aws_s3 as s3
from constructs import Construct

from infra.encryption import DataKey
from infra.nag import acknowledge, arn_of
from topokeeper.contract.constants import RESULT_KEY_PREFIX

_READ_OBJECTS = ["s3:GetObject"]  # the current version only
# Everything that changes which object version is current: a write, a copy, a multipart upload or a
# replication puts a new one; deleting the current version brings back an older one.
_CHANGE_OBJECTS = [
    "s3:PutObject",
    "s3:DeleteObject",
    "s3:DeleteObjectVersion",
    "s3:ReplicateObject",
    "s3:ReplicateDelete",
]

_SSE = "s3:x-amz-server-side-encryption"
_SSE_KEY = "s3:x-amz-server-side-encryption-aws-kms-key-id"


def _asked_for_another(header: str, value: str) -> dict[str, Any]:
    """The write names ``header`` with another value than ``value`` (a write without it is not matched)."""
    return {"StringNotEquals": {header: value}, "Null": {header: "false"}}


class PlanBucket(Construct):
    def __init__(self, scope: Construct, construct_id: str, *, key: DataKey, noncurrent_days: int) -> None:
        super().__init__(scope, construct_id)
        self._key = key
        self.bucket = s3.Bucket(
            self,
            "Bucket",
            encryption=s3.BucketEncryption.KMS,
            encryption_key=key.key,
            bucket_key_enabled=True,  # one KMS call per bucket key, not per object
            enforce_ssl=True,
            block_public_access=s3.BlockPublicAccess.BLOCK_ALL,
            object_ownership=s3.ObjectOwnership.BUCKET_OWNER_ENFORCED,
            versioned=True,
            lifecycle_rules=[
                # Earlier plans are the evidence behind the audit trail: keep them as long as the audit.
                s3.LifecycleRule(
                    noncurrent_version_expiration=Duration.days(noncurrent_days),
                    abort_incomplete_multipart_upload_after=Duration.days(7),
                ),
                # What the SSM channel stages for one command (the applier, a large bundle) is fetched within
                # the command's timeout by a presigned URL: nothing to keep once that has passed.
                s3.LifecycleRule(
                    prefix="payloads/",
                    expiration=Duration.days(1),
                    noncurrent_version_expiration=Duration.days(1),
                ),
                # What a head node PUT (by a URL presigned for one key) because SSM's stdout could not carry it:
                # read when the command's result is recorded, minutes later.
                s3.LifecycleRule(
                    prefix=f"{RESULT_KEY_PREFIX}/",
                    expiration=Duration.days(1),
                    noncurrent_version_expiration=Duration.days(1),
                ),
            ],
            removal_policy=RemovalPolicy.RETAIN,
        )
        acknowledge(
            self.bucket,
            "S1",
            "Access logs would need a second bucket with SSE-S3 (log delivery cannot use a KMS key) for little "
            "gain: only topokeeper's roles and the agent policy can reach these objects, every plan written is "
            "in the audit trail, and S3 data events in the account's CloudTrail record object access if required.",
        )

    def restrict_writes(
        self, writers: list[iam.IRole], operator_role_arn: str | None, facts_keys: list[str] | None = None
    ) -> None:
        """Deny, whatever identity policies allow: changing objects to every principal but ``writers`` and the
        operator role (any s3:PutObject in the account could otherwise put a bundle on a head node), and
        writes that ask for another encryption than the stack's key. The agents' placement facts
        (``facts_keys``) are left out of the first: the agent's role is the operator's, unknown at synth; its
        policy grants it that one key, and what is there is only read as a view (metrics, the placement table),
        never delivered to a head node. Writes that ask for none get the
        bucket's default, this key: so each denial holds only when its header is present (Null false), as
        ...IfExists would not do: IAM evaluates an absent key as true there, denying every write without the
        headers (the functions' and the head node's presigned ones). TLS only is enforce_ssl's statement."""
        allowed = [role.role_arn for role in writers] + ([operator_role_arn] if operator_role_arn else [])
        denials: dict[str, tuple[list[str], dict[str, Any]]] = {
            "OnlyTopokeeperChangesObjects": (_CHANGE_OBJECTS, {"ArnNotEquals": {"aws:PrincipalArn": allowed}}),
            "OnlySseKms": (["s3:PutObject"], _asked_for_another(_SSE, "aws:kms")),
            "OnlyTheStackKey": (["s3:PutObject"], _asked_for_another(_SSE_KEY, self._key.key.key_arn)),
            "NoCustomerProvidedKeys": (
                ["s3:PutObject"],
                {"Null": {"s3:x-amz-server-side-encryption-customer-algorithm": "false"}},
            ),
        }
        for sid, (actions, condition) in denials.items():
            everything = [self.bucket.arn_for_objects("*")]
            exempt = sid == "OnlyTopokeeperChangesObjects" and facts_keys
            self.bucket.add_to_resource_policy(
                iam.PolicyStatement(
                    sid=sid,
                    effect=iam.Effect.DENY,
                    principals=[iam.AnyPrincipal()],
                    actions=actions,
                    resources=[] if exempt else everything,
                    not_resources=[self.bucket.arn_for_objects(key) for key in facts_keys or []] if exempt else [],
                    conditions=condition,
                )
            )

    def _grant(self, role: iam.IRole, object_actions: list[str], *, write: bool) -> None:
        # ListBucket lets a missing key read as 404 rather than 403.
        role.add_to_principal_policy(iam.PolicyStatement(actions=["s3:ListBucket"], resources=[self.bucket.bucket_arn]))
        role.add_to_principal_policy(
            iam.PolicyStatement(actions=object_actions, resources=[self.bucket.arn_for_objects("*")])
        )
        self._key.grant_use(role, "s3", write=write)
        acknowledge(
            role,
            f"IAM5[Resource::{arn_of(cast(CfnResource, self.bucket.node.default_child))}/*]",
            "Objects of this stack's own plan bucket: keys are per cluster and per plan hash, unknown at synth.",
        )

    def grant_read(self, role: iam.IRole) -> None:
        self._grant(role, _READ_OBJECTS, write=False)

    def grant_read_write(self, role: iam.IRole) -> None:
        self._grant(role, [*_READ_OBJECTS, "s3:PutObject"], write=True)

    def grant_read_and_writes_to(self, role: iam.IRole, keys: list[str]) -> None:
        """Read any object; write only ``keys`` (a key may end in ``*``)."""
        self._grant(role, _READ_OBJECTS, write=bool(keys))
        if not keys:
            return
        role.add_to_principal_policy(
            iam.PolicyStatement(actions=["s3:PutObject"], resources=[self.bucket.arn_for_objects(k) for k in keys])
        )
        bucket = arn_of(cast(CfnResource, self.bucket.node.default_child))
        for key in keys:
            if "*" in key:
                acknowledge(
                    role,
                    f"IAM5[Resource::{bucket}/{key}]",
                    "One cluster's SSM payloads and results in this stack's bucket: each is named by its hash or "
                    "a per-command token, unknown at synth.",
                )
