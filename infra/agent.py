"""The managed policy operators attach to a HyperPod instance group's ExecutionRole (channel agent)."""

from __future__ import annotations

from aws_cdk import Aws
from aws_cdk import aws_iam as iam
from constructs import Construct

from infra.constants import EVENT_BUS_NAME
from infra.encryption import DataKey
from infra.storage import PlanBucket
from topokeeper.config import Settings
from topokeeper.constants import agent_bundle_key, agent_verify_key
from topokeeper.events import AGENT_SOURCE
from topokeeper.ports import Channel


def agent_clusters(settings: Settings) -> list[str]:
    return [cluster.name for cluster in settings.clusters if cluster.effective_channel is Channel.AGENT]


class AgentPolicy(Construct):
    """Fetch the cluster's bundle and verify request; report results as topokeeper.agent events."""

    def __init__(
        self, scope: Construct, construct_id: str, *, clusters: list[str], plans: PlanBucket, key: DataKey
    ) -> None:
        super().__init__(scope, construct_id)
        self.policy = iam.ManagedPolicy(
            self,
            "Policy",
            description="topokeeper head-node agent: attach to the HyperPod controller group's ExecutionRole",
            statements=[
                iam.PolicyStatement(
                    sid="FetchBundles",
                    actions=["s3:GetObject"],  # also HeadObject, which the agent polls
                    resources=[
                        plans.bucket.arn_for_objects(key(cluster))
                        for cluster in clusters
                        for key in (agent_bundle_key, agent_verify_key)
                    ],
                ),
                iam.PolicyStatement(
                    sid="DecryptBundles",
                    actions=["kms:Decrypt"],
                    resources=[key.key.key_arn],
                    conditions={"StringEquals": {"kms:ViaService": f"s3.{Aws.REGION}.amazonaws.com"}},
                ),
                iam.PolicyStatement(
                    sid="ReportResults",
                    actions=["events:PutEvents"],
                    resources=[f"arn:{Aws.PARTITION}:events:{Aws.REGION}:{Aws.ACCOUNT_ID}:event-bus/{EVENT_BUS_NAME}"],
                    conditions={"StringEquals": {"events:source": AGENT_SOURCE}},
                ),
            ],
        )
