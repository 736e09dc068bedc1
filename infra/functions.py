"""The four Lambdas, each with its own role that holds only what its adapters call."""

from __future__ import annotations

from typing import cast

from aws_cdk import Aws, Duration, RemovalPolicy
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from constructs import Construct

from infra import constants as c
from infra.agent import agent_facts_keys
from infra.encryption import SigningKey
from infra.layers import Layers
from infra.nag import acknowledge
from infra.queue import Queues
from infra.state import StateTable
from infra.storage import PlanBucket
from topokeeper.contract import constants as env
from topokeeper.contract import stack_spec as spec
from topokeeper.contract.config import Mode, Orchestrator, Settings
from topokeeper.contract.constants import (
    AUDIT_SOURCE,
    RUN_SHELL_DOCUMENT,
    ssm_payload_key,
    ssm_program_key,
    ssm_result_key,
)
from topokeeper.contract.ports import METRICS_NAMESPACE, Channel
from topokeeper.wire import agent_verify_key

# (timeout, memory MB) per function. Reconcile plans a whole cluster; drift plans every cluster and
# waits up to two minutes for each SSM verify; ingest and result handle one event, but result may read an
# applier's whole document back (up to 32 MiB: validating one that size takes ~160 MB more than the handler).
_SIZING = {
    c.INGEST: (Duration.seconds(spec.FUNCTION_TIMEOUT_SECONDS[c.INGEST]), 256),
    c.RECONCILE: (Duration.seconds(spec.FUNCTION_TIMEOUT_SECONDS[c.RECONCILE]), 1024),
    c.RESULT: (Duration.seconds(spec.FUNCTION_TIMEOUT_SECONDS[c.RESULT]), 1024),
    c.DRIFT: (Duration.seconds(spec.FUNCTION_TIMEOUT_SECONDS[c.DRIFT]), 1024),
}
# Lambda's own retries of an asynchronous invocation (EventBridge, Scheduler) before the event DLQ.
_ASYNC_RETRIES = 2
_ASYNC_MAX_AGE = Duration.hours(6)
_ESM_BATCH_SIZE = 10


def head_nodes(settings: Settings) -> list[str]:
    """The SSM ids of the head nodes that receive their topology through Run Command."""
    return [
        cluster.head_node
        for cluster in settings.clusters
        if cluster.effective_channel is Channel.SSM and cluster.head_node is not None
    ]


def drift_writes(settings: Settings) -> list[str]:
    """The only keys drift writes: verify-mode agents' verify requests, SSM payloads too large for a command, and
    (by the URL it presigns for the head node) results too large for the command's stdout."""
    keys = []
    for cluster in settings.clusters:
        if cluster.effective_channel is Channel.AGENT:
            if cluster.effective_mode is Mode.VERIFY:
                keys.append(agent_verify_key(cluster.name))
        elif cluster.head_node is not None:
            keys.extend(key(cluster.name, "*") for key in (ssm_payload_key, ssm_program_key, ssm_result_key))
    return keys


def _arn(service: str, resource: str, *, region: str = Aws.REGION, account: str = Aws.ACCOUNT_ID) -> str:
    return f"arn:{Aws.PARTITION}:{service}:{region}:{account}:{resource}"


def head_node_arn(target: str) -> str:
    """A head node registered as an SSM managed instance (mi-) is an SSM resource, an EC2 instance an EC2 one."""
    if target.startswith("mi-"):
        return _arn("ssm", f"managed-instance/{target}")
    return _arn("ec2", f"instance/{target}")


def _allow_on_clusters(role: iam.IRole, actions: list[str]) -> None:
    role.add_to_principal_policy(iam.PolicyStatement(actions=actions, resources=[_arn("sagemaker", "cluster/*")]))
    acknowledge(
        role,
        "IAM5[Resource::arn:<AWS::Partition>:sagemaker:<AWS::Region>:<AWS::AccountId>:cluster/*]",
        "HyperPod cluster ARNs end in a generated id, not the configured name, so clusters configured by name "
        "cannot be listed at synth; the actions only describe clusters and their nodes in this account and region.",
    )


class Functions(Construct):
    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        settings: Settings,
        layers: Layers,
        state: StateTable,
        plans: PlanBucket,
        queues: Queues,
        signing_key: SigningKey,
    ) -> None:
        super().__init__(scope, construct_id)
        self._settings = settings
        self._unscoped: dict[iam.IRole, list[str]] = {}
        environment = {
            env.ENV_CONFIG: settings.to_env(),
            env.ENV_TABLE: state.table.table_name,
            env.ENV_BUCKET: plans.bucket.bucket_name,
            env.ENV_QUEUE: queues.work.queue_url,
            env.ENV_EVENT_BUS: c.EVENT_BUS_NAME,
            "POWERTOOLS_SERVICE_NAME": c.SERVICE_NAME,
            "POWERTOOLS_METRICS_NAMESPACE": METRICS_NAMESPACE,
            "LOG_LEVEL": "INFO",
        }
        own_environment: dict[str, dict[str, str]] = {
            # Reconcile parks a message that can never succeed in the work DLQ, with the reason.
            c.RECONCILE: {
                env.ENV_DEAD_LETTER_QUEUE: queues.work_dlq.queue_url,
                env.ENV_SIGNING_KEY: signing_key.key.key_arn,
            },
            c.DRIFT: {env.ENV_SIGNING_KEY: signing_key.key.key_arn},  # reconcile and drift sign what they send
            c.RESULT: {env.ENV_AUDIT_RETENTION: str(settings.audit_retention_days)},
        }
        if settings.cloudtrail_lake_channel_arn:
            own_environment[c.RESULT][env.ENV_CLOUDTRAIL_CHANNEL] = settings.cloudtrail_lake_channel_arn

        self.by_name: dict[str, lambda_.Function] = {}
        for name in c.FUNCTION_NAMES:
            self.by_name[name] = self._function(name, layers, {**environment, **own_environment.get(name, {})})
        self.ingest, self.reconcile = self.by_name[c.INGEST], self.by_name[c.RECONCILE]
        self.result, self.drift = self.by_name[c.RESULT], self.by_name[c.DRIFT]

        for function in self.by_name.values():
            state.grant_read_write(self._role(function))
        # Delivering writes plans, bundles and payloads; verifying only verify requests and payloads.
        plans.grant_read_write(self._role(self.reconcile))
        plans.grant_read_and_writes_to(self._role(self.drift), drift_writes(settings))
        plans.grant_read(self._role(self.result))
        # Only these two (and the operator) may change objects: every other principal is denied by the bucket.
        plans.restrict_writes(
            [self._role(self.reconcile), self._role(self.drift)], settings.operator_role_arn, agent_facts_keys(settings)
        )
        for function in self.by_name.values():
            queues.grant_send_work(self._role(function))
        queues.grant_send_work_dead_letters(self._role(self.reconcile))

        self._grant_ingest_reads(self._role(self.ingest))
        for function in (self.reconcile, self.drift):
            self._grant_facts_reads(self._role(function))
            self._grant_head_node_commands(self._role(function))
            signing_key.grant_sign(self._role(function))
        self._grant_result_writes(self._role(self.result))
        if any(cluster.orchestrator is Orchestrator.EKS for cluster in settings.clusters):
            self._grant_audit_events(self._role(self.reconcile))  # EKS reconciles audit their own changes

        # A mapping without CDK's SqsEventSource grant, whose kms:Decrypt names no service.
        self.reconcile.add_event_source_mapping(
            "WorkQueue",
            event_source_arn=queues.work.queue_arn,
            batch_size=_ESM_BATCH_SIZE,
            report_batch_item_failures=True,
            max_concurrency=spec.RECONCILE_MAX_CONCURRENCY,
        )
        queues.grant_consume_work(self._role(self.reconcile))
        queues.grant_resume_work(self._role(self.result))
        for function in (self.ingest, self.result):
            self._dead_letter_async_failures(function, queues, _ASYNC_RETRIES)
        # The schedule runs drift again soon anyway; a retry would check every cluster a second time.
        self._dead_letter_async_failures(self.drift, queues, 0)
        # One acknowledgment per role that lists all its unscoped actions (a later one would replace it).
        for role, actions in self._unscoped.items():
            acknowledge(
                role,
                "IAM5[Resource::*]",
                f"No resource-level permissions exist for {', '.join(actions)} (Service Authorization "
                "Reference); all are read-only.",
            )

    def _allow_unscoped(self, role: iam.IRole, actions: list[str]) -> None:
        role.add_to_principal_policy(iam.PolicyStatement(actions=actions, resources=["*"]))
        self._unscoped.setdefault(role, []).extend(actions)

    def _function(self, name: str, layers: Layers, environment: dict[str, str]) -> lambda_.Function:
        code_dir = c.FUNCTIONS_DIR / name
        if not (code_dir / "handler.py").is_file():
            raise FileNotFoundError(f"{code_dir / 'handler.py'} is missing: the {name} function's code asset")
        title = name.capitalize()
        log_group = logs.LogGroup(self, f"{title}Logs", removal_policy=RemovalPolicy.DESTROY)
        # RetentionDays is an enum of names; the settings hold the number of days CloudFormation takes.
        cast(logs.CfnLogGroup, log_group.node.default_child).retention_in_days = self._settings.log_retention_days
        role = iam.Role(
            self,
            f"{title}Role",
            assumed_by=iam.ServicePrincipal("lambda.amazonaws.com"),
            description=f"topokeeper {name} function",
        )
        log_group.grant_write(role)  # instead of AWSLambdaBasicExecutionRole's logs:* on every group
        timeout, memory = _SIZING[name]
        return lambda_.Function(
            self,
            title,
            description=f"topokeeper {name}",
            runtime=c.RUNTIME,
            architecture=c.ARCHITECTURE,
            handler=c.HANDLER,
            code=lambda_.Code.from_asset(str(code_dir), exclude=list(c.FUNCTION_ASSET_EXCLUDE)),
            layers=layers.all,
            environment=environment,
            timeout=timeout,
            memory_size=memory,
            role=role,
            log_group=log_group,
        )

    @staticmethod
    def _role(function: lambda_.Function) -> iam.IRole:
        return cast(iam.IRole, function.role)

    def _grant_ingest_reads(self, role: iam.IRole) -> None:
        _allow_on_clusters(role, ["sagemaker:DescribeCluster"])
        self._allow_unscoped(role, ["ec2:DescribeInstances"])

    def _grant_facts_reads(self, role: iam.IRole) -> None:
        """What the HyperPod and EC2 topology adapters read to plan a cluster."""
        _allow_on_clusters(
            role, ["sagemaker:DescribeCluster", "sagemaker:ListClusterNodes", "sagemaker:DescribeClusterNode"]
        )
        self._allow_unscoped(role, ["ec2:DescribeInstanceTopology", "ec2:DescribeInstances"])
        provisioning_parameters = _arn("s3", c.PROVISIONING_PARAMETERS_OBJECTS, region="", account="")
        role.add_to_principal_policy(
            iam.PolicyStatement(
                actions=["s3:GetObject"],
                resources=[provisioning_parameters],
                # Bucket ARNs name no account: without this, any account's sagemaker-* bucket would do.
                conditions={"StringEquals": {"s3:ResourceAccount": Aws.ACCOUNT_ID}},
            )
        )
        acknowledge(
            role,
            "IAM5[Resource::arn:<AWS::Partition>:s3:::sagemaker-*/*provisioning_parameters.json]",
            "Legacy HyperPod clusters keep their partition mapping in provisioning_parameters.json in their "
            "lifecycle-script bucket, which HyperPod requires to be named sagemaker-*; bucket and prefix are "
            "only known from DescribeCluster at run time. Read-only, only that file name, only in this account "
            "(s3:ResourceAccount).",
        )

    def _ssm_clusters(self) -> bool:
        return bool(head_nodes(self._settings))

    def _grant_head_node_commands(self, role: iam.IRole) -> None:
        """Run Command: only AWS-RunShellScript, and only on the configured head nodes, while they carry the tag."""
        targets = head_nodes(self._settings)
        if not targets:
            return
        role.add_to_principal_policy(
            iam.PolicyStatement(
                actions=["ssm:SendCommand"],
                resources=[_arn("ssm", f"document/{RUN_SHELL_DOCUMENT}", account="")],
            )
        )
        role.add_to_principal_policy(
            iam.PolicyStatement(
                actions=["ssm:SendCommand"],
                resources=[head_node_arn(target) for target in sorted(targets)],
                conditions={"StringEquals": {f"ssm:resourceTag/{c.HEAD_NODE_TAG}": "true"}},
            )
        )
        self._grant_command_results(role)

    def _grant_command_results(self, role: iam.IRole) -> None:
        self._allow_unscoped(role, ["ssm:GetCommandInvocation"])

    def _grant_audit_events(self, role: iam.IRole) -> None:
        role.add_to_principal_policy(
            iam.PolicyStatement(
                actions=["events:PutEvents"],
                resources=[_arn("events", f"event-bus/{c.EVENT_BUS_NAME}")],
                conditions={"StringEquals": {"events:source": AUDIT_SOURCE}},
            )
        )

    def _grant_result_writes(self, role: iam.IRole) -> None:
        self._grant_audit_events(role)
        if self._ssm_clusters():
            self._grant_command_results(role)
        if self._settings.cloudtrail_lake_channel_arn:
            role.add_to_principal_policy(
                iam.PolicyStatement(
                    actions=["cloudtrail-data:PutAuditEvents"],
                    resources=[self._settings.cloudtrail_lake_channel_arn],
                )
            )

    def _dead_letter_async_failures(self, function: lambda_.Function, queues: Queues, retries: int) -> None:
        """Keep an event that still fails after Lambda's retries, so it can be inspected and redriven.

        Written as the L1 with an explicit grant: the L2 destination's SQS grant adds kms:ReEncrypt*
        and kms:GenerateDataKey* that sending does not need.
        """
        queues.grant_send_event_dead_letters(self._role(function))
        lambda_.CfnEventInvokeConfig(
            self,
            f"{function.node.id}AsyncFailures",
            function_name=function.function_name,
            qualifier="$LATEST",
            maximum_retry_attempts=retries,
            maximum_event_age_in_seconds=int(_ASYNC_MAX_AGE.to_seconds()),
            destination_config=lambda_.CfnEventInvokeConfig.DestinationConfigProperty(
                on_failure=lambda_.CfnEventInvokeConfig.OnFailureProperty(destination=queues.event_dlq.queue_arn)
            ),
        )
