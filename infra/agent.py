"""One managed policy per agent cluster, for the ExecutionRole of that cluster's controller group.

Each policy reaches its own cluster's objects only and may send only its own cluster's event source,
which is what the result function takes the cluster from. That isolates clusters only if each cluster's
controller group has a role of its own: two clusters sharing one role share both policies.
"""

from __future__ import annotations

from aws_cdk import Aws
from aws_cdk import aws_iam as iam
from constructs import Construct

from infra.config import ConfigError
from infra.constants import CONTEXT_KEY, EVENT_BUS_NAME
from infra.encryption import DataKey
from infra.storage import PlanBucket
from topokeeper.contract.config import Settings
from topokeeper.contract.ports import Channel
from topokeeper.wire import (
    AGENT_SOURCE,
    agent_bundle_key,
    agent_placement_facts_key,
    agent_source,
    agent_verify_key,
    agent_verify_request_key,
)


def agent_clusters(settings: Settings) -> list[str]:
    return [cluster.name for cluster in settings.clusters if cluster.effective_channel is Channel.AGENT]


def agent_facts_keys(settings: Settings) -> list[str]:
    """The one key each agent cluster with placement_metrics puts (its placement facts): the only agent write."""
    return [
        agent_placement_facts_key(cluster.name)
        for cluster in settings.clusters
        if cluster.effective_channel is Channel.AGENT and cluster.placement_metrics
    ]


def agent_policy_output(cluster: str) -> str:
    """The stack output with ``cluster``'s policy ARN: CloudFormation output ids are alphanumeric."""
    return "AgentPolicyArn" + "".join(part.capitalize() for part in cluster.split("-"))


class AgentPolicies(Construct):
    """``policies[cluster]``: fetch that cluster's bundle and verify request; report as its own source; put its
    placement facts if ``facts_keys`` holds its key."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        clusters: list[str],
        plans: PlanBucket,
        key: DataKey,
        facts_keys: list[str] | None = None,
    ) -> None:
        super().__init__(scope, construct_id)
        outputs = [agent_policy_output(cluster) for cluster in clusters]
        clashes = sorted({output for output in outputs if outputs.count(output) > 1})
        if clashes:
            raise ConfigError(
                f"{CONTEXT_KEY}.clusters: agent clusters whose names differ only in hyphens or case would share "
                f"the stack output {', '.join(clashes)}; rename one"
            )
        facts = set(facts_keys or [])
        self.policies = {
            cluster: self._policy(cluster, plans, key, agent_placement_facts_key(cluster) in facts)
            for cluster in clusters
        }

    def _policy(self, cluster: str, plans: PlanBucket, key: DataKey, puts_facts: bool) -> iam.ManagedPolicy:
        return iam.ManagedPolicy(
            self,
            cluster,
            description=f"topokeeper agent of {cluster}: attach to the ExecutionRole of its controller group only",
            statements=[
                *(_facts_statements(cluster, plans, key) if puts_facts else []),
                iam.PolicyStatement(
                    sid="FetchBundles",
                    actions=["s3:GetObject"],  # also HeadObject, which the agent polls
                    resources=[
                        plans.bucket.arn_for_objects(path(cluster))
                        for path in (agent_bundle_key, agent_verify_key, agent_verify_request_key)
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
                    # Agents installed before per-cluster sources send the shared one; the result function
                    # only counts those as outdated agents and records nothing they say.
                    conditions={"StringEquals": {"events:source": [agent_source(cluster), AGENT_SOURCE]}},
                ),
            ],
        )


def _facts_statements(cluster: str, plans: PlanBucket, key: DataKey) -> list[iam.PolicyStatement]:
    """placement_metrics: put the one facts object, encrypted with the bucket's key (SSE-KMS asks for a data key)."""
    return [
        iam.PolicyStatement(
            sid="PutPlacementFacts",
            actions=["s3:PutObject"],
            resources=[plans.bucket.arn_for_objects(agent_placement_facts_key(cluster))],
        ),
        iam.PolicyStatement(
            sid="EncryptPlacementFacts",
            actions=["kms:GenerateDataKey"],
            resources=[key.key.key_arn],
            conditions={"StringEquals": {"kms:ViaService": f"s3.{Aws.REGION}.amazonaws.com"}},
        ),
    ]
