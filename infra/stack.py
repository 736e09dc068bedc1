"""The topokeeper stack: one per account and region."""

from __future__ import annotations

from typing import Any, cast

from aws_cdk import CfnOutput, Stack
from aws_cdk import aws_iam as iam
from constructs import Construct

from infra.agent import AgentPolicies, agent_clusters, agent_facts_keys, agent_policy_output
from infra.alarms import Monitoring
from infra.encryption import DataKey, SigningKey
from infra.events import Triggers
from infra.functions import Functions
from infra.layers import Layers
from infra.login_endpoint import (
    LoginEndpoint,
    LoginHostIdentityInstaller,
    LoginTargetSync,
    ec2_login_clusters,
    login_clusters,
)
from infra.queue import Queues
from infra.registration import RegistrationPolicies, registration_clusters, registration_policy_output
from infra.state import StateTable
from infra.storage import PlanBucket
from topokeeper.contract.config import Settings
from topokeeper.contract.deployment import (
    OUTPUT_BUCKET,
    OUTPUT_DEAD_LETTER_QUEUE,
    OUTPUT_QUEUE,
    OUTPUT_RECONCILE_FUNCTION,
    OUTPUT_TABLE,
)
from topokeeper.contract.head_node_program import PROGRAM_NAME, program_sha256


class TopokeeperStack(Stack):
    def __init__(self, scope: Construct, construct_id: str, *, settings: Settings, **kwargs: Any) -> None:
        super().__init__(scope, construct_id, description="topokeeper: keeps Slurm network topology right", **kwargs)
        self.key = DataKey(self, "DataKey")
        self.signing_key = SigningKey(self, "SigningKey")
        self.state = StateTable(self, "State", key=self.key)
        self.plans = PlanBucket(self, "Plans", key=self.key, noncurrent_days=settings.audit_retention_days)
        self.queues = Queues(self, "Queues", key=self.key)
        self.layers = Layers(self, "Layers")
        self.functions = Functions(
            self,
            "Functions",
            settings=settings,
            layers=self.layers,
            state=self.state,
            plans=self.plans,
            queues=self.queues,
            signing_key=self.signing_key,
        )
        self.triggers = Triggers(self, "Triggers", settings=settings, functions=self.functions, queues=self.queues)
        self.monitoring = Monitoring(
            self,
            "Monitoring",
            settings=settings,
            key=self.key,
            functions=self.functions,
            dead_letter_queues=self.queues.dead_letter_queues,
        )

        # The operator CLI finds a deployment by these outputs (topokeeper.contract.deployment).
        outputs = {
            OUTPUT_TABLE: (self.state.table.table_name, "The state table"),
            OUTPUT_BUCKET: (self.plans.bucket.bucket_name, "The plan bucket"),
            OUTPUT_QUEUE: (self.queues.work.queue_url, "The FIFO work queue"),
            OUTPUT_DEAD_LETTER_QUEUE: (self.queues.work_dlq.queue_url, "The work queue's dead-letter queue"),
            OUTPUT_RECONCILE_FUNCTION: (self.functions.reconcile.function_name, "The reconcile function"),
            "EventDeadLetterQueueUrl": (self.queues.event_dlq.queue_url, "Events the functions could not take"),
            "AlarmTopicArn": (self.monitoring.topic.topic_arn, "Alarms are published here"),
            "SigningKeyArn": (self.signing_key.key.key_arn, "Signs bundles; head nodes trust its public key"),
            # What the SSM channel sends and the agent install ships: check a copy with sha256sum before running it.
            "HeadNodeProgramSha256": (program_sha256(), f"sha256 of {PROGRAM_NAME}, the program head nodes run"),
        }
        self.agent = AgentPolicies(
            self,
            "Agent",
            clusters=agent_clusters(settings),
            plans=self.plans,
            key=self.key,
            facts_keys=agent_facts_keys(settings),
        )
        for cluster, policy in self.agent.policies.items():
            outputs[agent_policy_output(cluster)] = (
                policy.managed_policy_arn,
                f"Attach to the ExecutionRole of {cluster}'s controller group only (a role no other cluster uses)",
            )
        self.registration = RegistrationPolicies(
            self,
            "Registration",
            clusters=registration_clusters(settings),
            plans=self.plans,
            key=self.key,
            deleter=cast(iam.IRole, self.functions.reconcile.role),
        )
        for cluster, policy in self.registration.policies.items():
            outputs[registration_policy_output(cluster)] = (
                policy.managed_policy_arn,
                f"Attach to the instance role of {cluster}'s queues only: node-start reads its topology with it",
            )
        self.login_endpoints = {
            cluster.name: LoginEndpoint(
                self,
                f"Login-{cluster.name}",
                cluster=cluster,
                topic=self.monitoring.topic,
                dashboard=self.monitoring.dashboard,
                key=self.key,
                log_retention_days=settings.log_retention_days,
            )
            for cluster in login_clusters(settings.clusters)
        }
        for cluster_name, endpoint in self.login_endpoints.items():
            suffix = "".join(ch for ch in cluster_name if ch.isalnum())
            outputs[f"LoginEndpoint{suffix}"] = (
                endpoint.load_balancer.attr_dns_name,
                f"SSH endpoint of {cluster_name}'s login nodes",
            )
            outputs[f"LoginHostIdentityPolicy{suffix}"] = (
                endpoint.host_identity_policy.managed_policy_arn,
                f"Attach to the ExecutionRole of {cluster_name}'s login group only",
            )
        if self.login_endpoints:
            LoginTargetSync(
                self,
                "LoginTargetSync",
                endpoints=self.login_endpoints,
                functions=[self.functions.ingest, self.functions.drift],
                node_readers=[self.functions.ingest],
            )
            outputs["DataKeyArn"] = (self.key.key.key_arn, "topokeeper login rotate-host-keys --kms-key-id")
        if ec2_login_clusters(settings.clusters) and self.functions.ingest.role is not None:
            LoginHostIdentityInstaller(
                self,
                "LoginHostIdentityInstaller",
                clusters=ec2_login_clusters(settings.clusters),
                role=self.functions.ingest.role,
            )
        for name, (value, description) in outputs.items():
            CfnOutput(self, name, value=value, description=description)
