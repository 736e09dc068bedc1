"""The customer-managed KMS keys: one for everything topokeeper keeps at rest, one that signs bundles."""

from __future__ import annotations

from aws_cdk import Aws, RemovalPolicy
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from constructs import Construct

from infra.nag import acknowledge
from topokeeper.wire import SIGNATURE_ALGORITHM


class DataKey(Construct):
    """Encrypts the table, the bucket, the queues and the alarm topic; rotated yearly.

    Retained on ``cdk destroy`` like the table and the bucket: without it they could not be read.
    """

    def __init__(self, scope: Construct, construct_id: str) -> None:
        super().__init__(scope, construct_id)
        self.key = kms.Key(
            self,
            "Key",
            description="topokeeper: state table, plan bucket, queues and alarm topic",
            enable_key_rotation=True,
            removal_policy=RemovalPolicy.RETAIN,
        )
        # EventBridge rules and the Scheduler write undeliverable events into the encrypted DLQ.
        self.key.add_to_resource_policy(
            iam.PolicyStatement(
                sid="EventBridgeDeadLetters",
                principals=[iam.ServicePrincipal("events.amazonaws.com")],
                actions=["kms:Decrypt", "kms:GenerateDataKey"],
                resources=["*"],
                conditions={"StringEquals": {"aws:SourceAccount": Aws.ACCOUNT_ID}},
            )
        )
        # CloudWatch alarms publish to the encrypted SNS topic (as the SNS developer guide requires).
        self.key.add_to_resource_policy(
            iam.PolicyStatement(
                sid="CloudWatchAlarms",
                principals=[iam.ServicePrincipal("cloudwatch.amazonaws.com")],
                actions=["kms:Decrypt", "kms:GenerateDataKey"],
                resources=["*"],
                # Only this account's alarms: the service principal alone would let any account's alarms use it.
                conditions={
                    "StringEquals": {"aws:SourceAccount": Aws.ACCOUNT_ID},
                    "ArnLike": {
                        "aws:SourceArn": f"arn:{Aws.PARTITION}:cloudwatch:{Aws.REGION}:{Aws.ACCOUNT_ID}:alarm:*"
                    },
                },
            )
        )

    def grant_use(self, role: iam.IRole, service: str, *, write: bool) -> None:
        """Let ``role`` use the key through one AWS service (dynamodb, s3, sqs), never directly."""
        actions = ["kms:Decrypt", "kms:DescribeKey"]
        if write:
            actions += ["kms:Encrypt", "kms:GenerateDataKey"]
        role.add_to_principal_policy(
            iam.PolicyStatement(
                actions=actions,
                resources=[self.key.key_arn],
                conditions={"StringEquals": {"kms:ViaService": f"{service}.{Aws.REGION}.amazonaws.com"}},
            )
        )


class SigningKey(Construct):
    """The asymmetric key every delivered bundle is signed with (RSA_3072, SIGN_VERIFY): head nodes trust its
    public key, so only reconcile and drift (and the operator role, by its own policy) may sign.

    Retained on ``cdk destroy``: a new key means installing its public key on every head node again.
    """

    def __init__(self, scope: Construct, construct_id: str) -> None:
        super().__init__(scope, construct_id)
        self.key = kms.Key(
            self,
            "Key",
            description=f"topokeeper: signs the bundles head nodes apply ({SIGNATURE_ALGORITHM})",
            key_spec=kms.KeySpec.RSA_3072,
            key_usage=kms.KeyUsage.SIGN_VERIFY,
            removal_policy=RemovalPolicy.RETAIN,
        )
        acknowledge(
            self.key,
            "KMS5",
            "KMS cannot rotate asymmetric keys automatically; rotating means a new key and its public key "
            "installed on every head node (README: Security).",
        )

    def grant_sign(self, role: iam.IRole) -> None:
        """Sign (a digest; called directly, through no other service) and read the public key."""
        role.add_to_principal_policy(
            iam.PolicyStatement(actions=["kms:Sign", "kms:GetPublicKey"], resources=[self.key.key_arn])
        )
