"""Wiring: environment -> adapters -> the dependencies each service takes.

The Lambdas build one ``Runtime`` per cold start from their environment; the simulator builds the same
one against the emulated AWS with a simulated clock, so both run identical code.
"""

from __future__ import annotations

import importlib
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import cached_property
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from topokeeper.adapters.aws import SEND_COMMAND_CONFIG, aws_errors, client, presigning_s3
from topokeeper.adapters.dynamodb import DynamoNodeFactsCache, DynamoRateLimiter, DynamoStateStore
from topokeeper.adapters.metrics import EmfMetrics
from topokeeper.adapters.plans import S3PlanStore
from topokeeper.adapters.queue import SqsWorkQueue
from topokeeper.contract.config import ClusterConfig, Mode, Orchestrator, Settings
from topokeeper.contract.constants import (
    ENV_AUDIT_RETENTION,
    ENV_BUCKET,
    ENV_CLOUDTRAIL_CHANNEL,
    ENV_CONFIG,
    ENV_DEAD_LETTER_QUEUE,
    ENV_EVENT_BUS,
    ENV_QUEUE,
    ENV_SIGNING_KEY,
    ENV_TABLE,
)
from topokeeper.contract.errors import InputError
from topokeeper.contract.ports import ApplyResult, Channel, Clock, DeliveryChannel, FactsSource, Metrics, WorkQueue

if TYPE_CHECKING:  # each function loads only its own use case and adapters (its handler, at init: load_adapters)
    from topokeeper.adapters.agent_channel import AgentChannel
    from topokeeper.adapters.audit_trail import AuditTrail
    from topokeeper.adapters.ec2 import InstanceTopologyReader
    from topokeeper.adapters.kms import KmsBundleSigner
    from topokeeper.adapters.ssm_channel import SsmChannel
    from topokeeper.service.ingest import IngestDeps
    from topokeeper.service.reconcile import ControllerDeps
    from topokeeper.service.result import ResultDeps

# What a reconcile needs after discovery: planning 20,000 nodes, the plan to S3, the claim, SendCommand, the
# state; and one last batch of DescribeInstanceTopology (5 pages) started just before the deadline.
AFTER_DISCOVERY_SECONDS = 40
# The drift function (10 minutes) gives each cluster's discovery this long; what is left, reconcile continues.
DRIFT_DISCOVERY_SECONDS = 120
# How long the drift check waits for the head node's placement facts (placement_metrics), per cluster.
PLACEMENT_FACTS_SECONDS = 60
# What a reconcile needs after it read the head node's node table (ParallelCluster): planning again, the plan to
# S3, the claim, SendCommand, the state. The read stops waiting for an answer this long before the invocation ends.
AFTER_READ_SECONDS = 20
# The adapters each function's deps make (beyond the state, plans, queue and metrics every one makes), imported
# by its handler at init (load_adapters), where Lambda's init phase pays for them, not by the first invocation.
# No function makes them all (ingest makes ec2 only, result no ec2), so Runtime imports each where it makes it.
FUNCTION_ADAPTERS = {
    "ingest": ("ec2",),
    "reconcile": ("ec2", "hyperpod", "ssm_channel", "agent_channel", "kms", "audit_trail"),
    "result": ("ssm_channel", "kms", "audit_trail"),
    "drift": ("ec2", "hyperpod", "ssm_channel", "agent_channel", "kms", "audit_trail"),
}


def load_adapters(function: str) -> None:
    """Import the adapters ``function``'s deps make (its handler calls this at init)."""
    for adapter in FUNCTION_ADAPTERS[function]:
        importlib.import_module(f"topokeeper.adapters.{adapter}")


class SystemClock:
    def now(self) -> datetime:
        return datetime.now(UTC)


class LambdaEnvironment(BaseModel):
    """The environment variables the stack sets (validated at cold start)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    config: str = Field(alias=ENV_CONFIG)
    table: str = Field(alias=ENV_TABLE, min_length=3)
    bucket: str = Field(alias=ENV_BUCKET, min_length=3)
    queue_url: str = Field(alias=ENV_QUEUE, min_length=8)
    dead_letter_queue_url: str | None = Field(None, alias=ENV_DEAD_LETTER_QUEUE)
    event_bus: str = Field("default", alias=ENV_EVENT_BUS)
    cloudtrail_channel_arn: str | None = Field(None, alias=ENV_CLOUDTRAIL_CHANNEL)
    audit_retention_days: int = Field(365, alias=ENV_AUDIT_RETENTION)
    signing_key_id: str | None = Field(None, alias=ENV_SIGNING_KEY, min_length=1)
    region: str | None = Field(None, alias="AWS_REGION")  # set by Lambda itself
    function_name: str = Field("topokeeper", alias="AWS_LAMBDA_FUNCTION_NAME")


def load_environment(environ: dict[str, str]) -> tuple[LambdaEnvironment, Settings]:
    try:
        env = LambdaEnvironment.model_validate(environ)
    except ValidationError as error:
        raise InputError.from_validation(error, prefix="environment") from error
    try:
        settings = Settings.model_validate_json(env.config)
    except ValidationError as error:
        raise InputError.from_validation(error, prefix=ENV_CONFIG) from error
    return env, settings


@dataclass
class Runtime:
    env: LambdaEnvironment
    settings: Settings
    clock: Clock = field(default_factory=SystemClock)
    metrics: Metrics = field(default_factory=EmfMetrics)
    sleep: Any = time.sleep
    logger: Any = field(default_factory=lambda: logging.getLogger("topokeeper"))
    work_queue: WorkQueue | None = None  # the simulator's, which also keeps simulated time

    @classmethod
    def from_environment(cls, environ: dict[str, str], **overrides: Any) -> Runtime:
        env, settings = load_environment(environ)
        return cls(env=env, settings=settings, **overrides)

    @cached_property
    def state(self) -> DynamoStateStore:
        return DynamoStateStore(client("dynamodb"), self.env.table)

    @cached_property
    def plans(self) -> S3PlanStore:
        return S3PlanStore(client("s3"), self.env.bucket)

    @cached_property
    def queue(self) -> WorkQueue:
        if self.work_queue is not None:
            return self.work_queue
        return SqsWorkQueue(client("sqs"), self.env.queue_url, self.env.dead_letter_queue_url)

    def topology_reader(self, deadline: datetime | None = None) -> InstanceTopologyReader:
        from topokeeper.adapters.ec2 import InstanceTopologyReader  # noqa: PLC0415 - see FUNCTION_ADAPTERS

        limiter = DynamoRateLimiter(
            client("dynamodb"), self.env.table, now=lambda: self.clock.now().timestamp(), sleep=self.sleep
        )
        cache = DynamoNodeFactsCache(client("dynamodb"), self.env.table)
        return InstanceTopologyReader(client("ec2"), cache, limiter, self.clock.now, deadline)

    def facts(self, cluster: ClusterConfig, deadline: datetime | None = None) -> FactsSource:
        """``deadline``: no DescribeInstanceTopology batch starts after it (the read continues next time)."""
        from topokeeper.adapters.ec2 import Ec2ClusterFacts  # noqa: PLC0415 - see FUNCTION_ADAPTERS
        from topokeeper.adapters.hyperpod import HyperPodFacts  # noqa: PLC0415 - see FUNCTION_ADAPTERS

        if cluster.orchestrator is Orchestrator.EC2:
            return Ec2ClusterFacts(client("ec2"), self.topology_reader(deadline), cluster.ec2)
        return HyperPodFacts(client("sagemaker"), client("s3"), self.topology_reader(deadline))

    def channel(self, cluster: ClusterConfig, deadline: datetime | None = None) -> DeliveryChannel:
        """``deadline``: an SSM verify stops waiting for the head node's answer then (PENDING)."""
        if cluster.effective_channel is Channel.SSM:
            return self.ssm_channel(cluster, deadline)
        return self.agent_channel(cluster)

    def agent_channel(self, cluster: ClusterConfig) -> AgentChannel:
        from topokeeper.adapters.agent_channel import AgentChannel  # noqa: PLC0415 - see FUNCTION_ADAPTERS

        return AgentChannel(
            client("s3"),
            self.env.bucket,
            self.state,
            now=self.clock.now,
            max_report_age=timedelta(seconds=self.settings.agent_verify_max_age_seconds),
            verify_only=cluster.effective_mode is Mode.VERIFY,
        )

    @cached_property
    def signer(self) -> KmsBundleSigner | None:
        from topokeeper.adapters.kms import KmsBundleSigner  # noqa: PLC0415 - see FUNCTION_ADAPTERS

        return None if self.env.signing_key_id is None else KmsBundleSigner(client("kms"), self.env.signing_key_id)

    def ssm_channel(self, cluster: ClusterConfig, deadline: datetime | None = None) -> SsmChannel:
        if cluster.head_node is None:
            raise InputError(f"clusters.{cluster.name}.head_node", "required for channel ssm")
        from topokeeper.adapters.ssm_channel import SsmChannel  # noqa: PLC0415 - see FUNCTION_ADAPTERS
        from topokeeper.service.signing import trusted_key_document  # noqa: PLC0415 - ingest never signs

        signer = self.signer
        return SsmChannel(
            client("ssm"),
            presigning_s3(),
            self.env.bucket,
            cluster.head_node,
            cluster=cluster.name,
            now=self.clock.now,
            sleep=self.sleep,
            sender=client("ssm", None, SEND_COMMAND_CONFIG),
            trusted_key=None if signer is None else lambda: trusted_key_document(cluster.name, signer),
            deadline=deadline,
        )

    def ssm_result(self, cluster: ClusterConfig, command_id: str) -> ApplyResult:
        return self.ssm_channel(cluster).result(command_id)

    @cached_property
    def audit(self) -> AuditTrail:
        from topokeeper.adapters.audit_trail import AuditTrail  # noqa: PLC0415 - see FUNCTION_ADAPTERS

        lake = client("cloudtrail-data") if self.env.cloudtrail_channel_arn else None
        account = client("sts").get_caller_identity()["Account"] if lake is not None else ""
        function_arn = (
            f"arn:aws:lambda:{self.env.region}:{account}:function:{self.env.function_name}" if lake is not None else ""
        )
        return AuditTrail(
            dynamodb=client("dynamodb"),
            table=self.env.table,
            events=client("events"),
            event_bus=self.env.event_bus,
            retention=timedelta(days=self.env.audit_retention_days),
            logger=self.logger,
            cloudtrail_data=lake,
            channel_arn=self.env.cloudtrail_channel_arn,
            account=account,
            function_arn=function_arn,
        )

    @aws_errors()
    def cluster_name_of_arn(self, arn: str) -> str | None:
        try:
            name: str = client("sagemaker").describe_cluster(ClusterName=arn)["ClusterName"]
        except client("sagemaker").exceptions.ResourceNotFound:
            return None
        return name

    def instance_tags(self, instance_id: str) -> dict[str, str]:
        from topokeeper.adapters.ec2 import instance_tags  # noqa: PLC0415 - see FUNCTION_ADAPTERS

        return instance_tags(client("ec2"), instance_id)

    def ingest_deps(self) -> IngestDeps:
        from topokeeper.service.ingest import IngestDeps  # noqa: PLC0415 - see TYPE_CHECKING above

        return IngestDeps(
            settings=self.settings,
            state=self.state,
            queue=self.queue,
            metrics=self.metrics,
            clock=self.clock,
            cluster_name_of_arn=self.cluster_name_of_arn,
            instance_tags=self.instance_tags,
        )

    def reconcile_deps(self, remaining_seconds: float | None = None) -> ControllerDeps:
        """``remaining_seconds``: the invocation's time left; discovery stops in time to plan and deliver, and so
        does the wait for the node table the reconcile reads after it."""
        ends = None if remaining_seconds is None else self.clock.now() + timedelta(seconds=remaining_seconds)
        deadline = None if ends is None else ends - timedelta(seconds=AFTER_DISCOVERY_SECONDS)
        read_deadline = None if ends is None else ends - timedelta(seconds=AFTER_READ_SECONDS)
        return self._controller_deps(
            lambda cluster: self.facts(cluster, deadline), lambda cluster: self.channel(cluster, read_deadline)
        )

    def _controller_deps(
        self,
        facts: Callable[[ClusterConfig], FactsSource],
        channel: Callable[[ClusterConfig], DeliveryChannel] | None = None,
    ) -> ControllerDeps:
        from topokeeper.service.reconcile import ControllerDeps  # noqa: PLC0415 - see TYPE_CHECKING above

        return ControllerDeps(
            settings=self.settings,
            state=self.state,
            plans=self.plans,
            queue=self.queue,
            metrics=self.metrics,
            clock=self.clock,
            facts=facts,
            channel=self.channel if channel is None else channel,
            signer=self.signer,
            kueue=self.plans,
            audit=self.audit,
        )

    def result_deps(self) -> ResultDeps:
        from topokeeper.service.result import ResultDeps  # noqa: PLC0415 - see TYPE_CHECKING above

        return ResultDeps(
            settings=self.settings,
            state=self.state,
            plans=self.plans,
            audit=self.audit,
            queue=self.queue,
            metrics=self.metrics,
            clock=self.clock,
            ssm_result=self.ssm_result,
        )

    def drift_deps(self) -> ControllerDeps:
        # One ``<function>_deps`` per Lambda; drift reads what reconcile reads, each cluster's discovery
        # bounded on its own (the function checks every cluster, and waits for each verify).
        deps = self._controller_deps(
            lambda cluster: self.facts(cluster, self.clock.now() + timedelta(seconds=DRIFT_DISCOVERY_SECONDS))
        )
        deps.placement_facts = self.placement_facts
        return deps

    def placement_facts(self, cluster: ClusterConfig) -> dict[str, Any]:
        """The head node's placement facts as the drift check reads them: over SSM, or the newest the agent put
        (stale ones refused)."""
        if cluster.effective_channel is Channel.AGENT:
            return self.agent_channel(cluster).current_placement_facts(cluster.name)
        return self.ssm_channel(cluster).placement_facts(timeout=PLACEMENT_FACTS_SECONDS)


_installed: Runtime | None = None


def lambda_runtime() -> Runtime:
    """The runtime of this Lambda execution environment, built from the environment on first use."""
    global _installed  # noqa: PLW0603 - one runtime per execution environment, as Lambda reuses it
    if _installed is None:
        _installed = Runtime.from_environment(dict(os.environ))
    return _installed


def install_runtime(runtime: Runtime | None) -> None:
    """Make the handlers use ``runtime`` (the simulator's, with simulated time); None forgets it."""
    global _installed  # noqa: PLW0603
    _installed = runtime
