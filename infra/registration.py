"""One managed policy per ParallelCluster (EC2) cluster topokeeper writes, for its queues' instance role: a compute
node's start action (``topokeeper-head-node.pyz node-start``) reads its registration entry with it.

Each policy reads its own cluster's registration prefix only, lists that prefix (so a missing entry answers 404,
which the node waits for, rather than 403, which ends its wait), and decrypts through S3 only. Clusters are kept
apart only if their queues' instance roles are their own: two clusters sharing a role share both policies.
"""

from __future__ import annotations

from typing import cast

from aws_cdk import Aws, CfnResource
from aws_cdk import aws_iam as iam
from constructs import Construct

from infra.config import ConfigError
from infra.constants import CONTEXT_KEY
from infra.encryption import DataKey
from infra.nag import acknowledge, arn_of
from infra.storage import PlanBucket
from topokeeper.contract.config import Mode, Orchestrator, Settings
from topokeeper.wire import registration_prefix


def registration_clusters(settings: Settings) -> list[str]:
    """The clusters whose reconcile publishes entries (service/registration.py): EC2, enforce mode."""
    return [
        cluster.name
        for cluster in settings.clusters
        if cluster.orchestrator is Orchestrator.EC2 and cluster.effective_mode is Mode.ENFORCE
    ]


def registration_policy_output(cluster: str) -> str:
    """The stack output with ``cluster``'s policy ARN: CloudFormation output ids are alphanumeric."""
    return "RegistrationPolicyArn" + "".join(part.capitalize() for part in cluster.split("-"))


class RegistrationPolicies(Construct):
    """``policies[cluster]``: read that cluster's registration entries, nothing else."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        clusters: list[str],
        plans: PlanBucket,
        key: DataKey,
        deleter: iam.IRole,
    ) -> None:
        super().__init__(scope, construct_id)
        outputs = [registration_policy_output(cluster) for cluster in clusters]
        clashes = sorted({output for output in outputs if outputs.count(output) > 1})
        if clashes:
            raise ConfigError(
                f"{CONTEXT_KEY}.clusters: EC2 clusters whose names differ only in hyphens or case would share "
                f"the stack output {', '.join(clashes)}; rename one"
            )
        self.policies = {cluster: self._policy(cluster, plans, key) for cluster in clusters}
        if clusters:
            self._grant_deletes(deleter, clusters, plans)

    @staticmethod
    def _grant_deletes(role: iam.IRole, clusters: list[str], plans: PlanBucket) -> None:
        """The reconcile deletes a terminated instance's entry (service/registration.py): those prefixes only."""
        prefixes = [registration_prefix(cluster) for cluster in clusters]
        role.add_to_principal_policy(
            iam.PolicyStatement(
                actions=["s3:DeleteObject"], resources=[plans.bucket.arn_for_objects(p + "*") for p in prefixes]
            )
        )
        bucket = arn_of(cast(CfnResource, plans.bucket.node.default_child))
        for prefix in prefixes:
            acknowledge(
                role,
                f"IAM5[Resource::{bucket}/{prefix}*]",
                "A terminated instance's registration entry, named by its instance id, unknown at synth.",
            )

    def _policy(self, cluster: str, plans: PlanBucket, key: DataKey) -> iam.ManagedPolicy:
        prefix = registration_prefix(cluster)
        policy = iam.ManagedPolicy(
            self,
            cluster,
            description=f"topokeeper registration entries of {cluster}: attach to its queues' instance role only",
            statements=[
                iam.PolicyStatement(
                    sid="ReadRegistration",
                    actions=["s3:GetObject"],
                    resources=[plans.bucket.arn_for_objects(prefix + "*")],
                ),
                iam.PolicyStatement(
                    sid="ListRegistration",  # a missing entry reads as 404 (wait for it), not 403 (give up)
                    actions=["s3:ListBucket"],
                    resources=[plans.bucket.bucket_arn],
                    conditions={"StringLike": {"s3:prefix": [prefix + "*"]}},
                ),
                iam.PolicyStatement(
                    sid="DecryptRegistration",
                    actions=["kms:Decrypt"],
                    resources=[key.key.key_arn],
                    conditions={"StringEquals": {"kms:ViaService": f"s3.{Aws.REGION}.amazonaws.com"}},
                ),
            ],
        )
        bucket = arn_of(cast(CfnResource, plans.bucket.node.default_child))
        acknowledge(
            policy,
            f"IAM5[Resource::{bucket}/{prefix}*]",
            "One object per instance of this cluster, named by its instance id, unknown at synth.",
        )
        return policy
