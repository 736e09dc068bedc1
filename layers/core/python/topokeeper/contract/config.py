"""Deployment configuration: the clusters topokeeper manages and how it behaves.

One pydantic model serves ``cdk.json`` context (validated at synth time, with errors naming the key)
and the Lambdas (the same JSON, in the ``TOPOKEEPER_CONFIG`` environment variable).
"""

from __future__ import annotations

import ipaddress
import re
from enum import StrEnum
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StrictBool, model_validator

from topokeeper.contract.constants import INSTANCE_ID_PATTERN
from topokeeper.contract.ports import Channel
from topokeeper.domain.models import (
    ClusterName,
    PartitionSettings,
    PlannerConfig,
    SlurmVersion,
    empty_dict,
    empty_list,
)
from topokeeper.domain.names import SlurmName

# SSM SendCommand accepts only these ids (its InstanceId shape); botocore does not check the pattern.
SSM_TARGET = re.compile(rf"{INSTANCE_ID_PATTERN}|mi-[0-9a-f]{{17}}")
_CLUSTER_ARN = re.compile(r"arn:aws[a-z-]*:sagemaker:[a-z0-9-]+:\d{12}:cluster/[a-z0-9]{12}")
_TAG_KEY = re.compile(r"[\w.:/=+@ -]{1,128}")
_ROLE_ARN = re.compile(r"arn:aws[a-z-]*:iam::[0-9]{12}:role/[A-Za-z0-9_+=,.@/-]{1,512}")
# One address for SNS's email subscription: no space, control character, comma or second @; 254 characters at most
# (RFC 5321's path limit).
_EMAIL = re.compile(r"[^\s\x00-\x1f\x7f,;<>@]{1,64}@[^\s\x00-\x1f\x7f,;<>@]+\.[^\s\x00-\x1f\x7f,;<>@]+")
_EMAIL_MAX = 254
# Lambda allows 4 KB of environment variables in all; leave room for the others.
MAX_CONFIG_BYTES = 3072


_ID_SHAPE = re.compile(r"(i|mi)-([0-9a-fA-F]+)")
_ID_DIGITS = {"i": ("an EC2 instance id", "8 or 17"), "mi": ("a managed node id", "17")}


def _ssm_target(value: str) -> str:
    if SSM_TARGET.fullmatch(value):
        return value
    shape = _ID_SHAPE.fullmatch(value)
    if shape and SSM_TARGET.fullmatch(value.lower()):
        raise ValueError(f"{value!r}: hex digits are lower case: did you mean {value.lower()!r}?")
    if shape:
        prefix, digits = shape.groups()
        what, counts = _ID_DIGITS[prefix]
        raise ValueError(
            f"{value!r} has {len(digits)} hex digits after {prefix}-: {what} has {counts}; copy it from the EC2 or"
            " Systems Manager console (SSM SendCommand takes i-/mi- ids only)"
        )
    if SSM_TARGET.fullmatch(f"i-{value.lower()}"):
        raise ValueError(f"{value!r} is no instance id: did you mean {f'i-{value.lower()}'!r}?")
    raise ValueError(f"SSM SendCommand takes i-/mi- ids only (HyperPod nodes need channel: agent): {value!r}")
    return value


def _cluster_arn(value: str) -> str:
    if not _CLUSTER_ARN.fullmatch(value):
        raise ValueError(f"not a HyperPod cluster ARN: {value!r}")
    return value


def _role_arn(value: str) -> str:
    if not _ROLE_ARN.fullmatch(value):
        raise ValueError(f"not an IAM role ARN: {value!r}")
    return value


def _email(value: str) -> str:
    if len(value) > _EMAIL_MAX or not _EMAIL.fullmatch(value):
        raise ValueError(f"not one email address (SNS mails one per subscription): {value!r}")
    return value


def _tag_key(value: str) -> str:
    if not _TAG_KEY.fullmatch(value):
        raise ValueError(f"not an EC2 tag key: {value!r}")
    return value


def _aws_id(prefix: str) -> AfterValidator:
    pattern = re.compile(rf"{prefix}-(?:[0-9a-f]{{8}}|[0-9a-f]{{17}})")

    def check(value: str) -> str:
        if not pattern.fullmatch(value):
            raise ValueError(f"not a {prefix}- id: {value!r}")
        return value

    return AfterValidator(check)


def _ipv4_cidr(value: str) -> str:
    try:
        network = ipaddress.IPv4Network(value, strict=True)
    except ValueError as error:
        raise ValueError(f"not an IPv4 CIDR block: {value!r} ({error})") from None
    return str(network)


SsmTarget = Annotated[str, AfterValidator(_ssm_target)]
VpcId = Annotated[str, _aws_id("vpc")]
SubnetId = Annotated[str, _aws_id("subnet")]
SecurityGroupId = Annotated[str, _aws_id("sg")]
Ipv4Cidr = Annotated[str, AfterValidator(_ipv4_cidr)]
TagKey = Annotated[str, AfterValidator(_tag_key)]


class Mode(StrEnum):
    ENFORCE = "enforce"  # write the topology to the head node
    VERIFY = "verify"  # audit and report drift only; never write


class Orchestrator(StrEnum):
    HYPERPOD = "hyperpod"
    EC2 = "ec2"  # Slurm on plain EC2: ParallelCluster or self-managed
    EKS = "eks"  # HyperPod on EKS: Kueue objects and node labels go to the plan bucket, no head node


class Ec2Discovery(BaseModel):
    """How to find a plain-EC2 cluster's nodes by their tags."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    cluster_tag: TagKey = "topokeeper:cluster"
    partition_tag: TagKey = "topokeeper:partition"
    node_name_tag: TagKey | None = None  # else the short PrivateDnsName
    # The cluster's login nodes carry this tag with the cluster's name as its value (login endpoint).
    login_tag: TagKey = "topokeeper:login"


# ParallelCluster 3 tags every instance with its cluster and each compute instance with its queue (its Slurm
# partition): ``ec2`` set to these finds a ParallelCluster cluster without tagging it again.
PARALLELCLUSTER_DISCOVERY = Ec2Discovery(
    cluster_tag="parallelcluster:cluster-name", partition_tag="parallelcluster:queue-name"
)


class ClusterVpcConfig(BaseModel):
    """The cluster's own ``VpcConfig`` (DescribeCluster): its nodes' IPs live in these subnets."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    security_group_ids: list[SecurityGroupId] = Field(min_length=1, max_length=5)
    subnets: list[SubnetId] = Field(min_length=1, max_length=16)


class LoginEndpointConfig(BaseModel):
    """An internal NLB spreading SSH across the cluster's login nodes (infra/login_endpoint.py)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    enabled: bool = False
    vpc_id: VpcId | None = None
    # Without VpcConfig a HyperPod cluster's node IPs live in a service VPC no balancer of yours can reach.
    vpc_config: ClusterVpcConfig | None = None
    allowed_cidrs: list[Ipv4Cidr] = Field(default_factory=empty_list, max_length=50)
    allowed_security_group_ids: list[SecurityGroupId] = Field(default_factory=empty_list, max_length=50)
    client_vpn_security_group_id: SecurityGroupId | None = None
    deletion_protection: bool = False
    # ELBv2's maximum: an SSH session on a departing login node gets an hour to finish.
    deregistration_delay_seconds: int = Field(3600, ge=0, le=3600)

    @model_validator(mode="after")
    def _complete_when_enabled(self) -> LoginEndpointConfig:
        if not self.enabled:
            return self
        if self.vpc_config is None:
            raise ValueError(
                "vpc_config is required: give the cluster's VpcConfig (security_group_ids, subnets); a cluster "
                "created without VpcConfig has node IPs outside your VPC and cannot sit behind a login endpoint"
            )
        if self.vpc_id is None:
            raise ValueError("vpc_id is required: the VPC of the cluster's VpcConfig subnets")
        if not (self.allowed_cidrs or self.allowed_security_group_ids or self.client_vpn_security_group_id):
            raise ValueError(
                "name who may connect: allowed_cidrs, allowed_security_group_ids or client_vpn_security_group_id"
            )
        return self


class PlacementAlarm(BaseModel):
    """Alarms on one partition's placement metrics (docs/placement.md); each threshold optional."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    largest_placeable_below: int | None = Field(None, ge=1)  # LargestPlaceableJobNodes under this: alarm
    topology_pending_seconds_above: int | None = Field(None, ge=0)  # TopologyPendingSeconds over this: alarm

    @model_validator(mode="after")
    def _some_threshold(self) -> PlacementAlarm:
        if self.largest_placeable_below is None and self.topology_pending_seconds_above is None:
            raise ValueError("give largest_placeable_below, topology_pending_seconds_above or both")
        return self


class ClusterConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    name: ClusterName
    arn: Annotated[str, AfterValidator(_cluster_arn)] | None = None
    orchestrator: Orchestrator = Orchestrator.HYPERPOD
    # HyperPod can maintain the topology itself, so it defaults to verify: we never fight it.
    mode: Mode | None = None
    channel: Channel | None = None
    head_node: SsmTarget | None = None
    slurm_version: str | None = None  # until the head node reports its own
    partitions: dict[SlurmName, PartitionSettings] = Field(default_factory=empty_dict)
    ec2: Ec2Discovery = Ec2Discovery()
    # Alarm on HyperPod's own topology changes (metric ManagedTopologyUpdates), as AWS advises SREs to.
    alarm_on_managed_topology_updates: bool = False
    # Enforce over ParallelCluster's own generated topology.conf: replace it, and repair its regeneration as drift.
    replace_parallelcluster_topology: StrictBool = False
    login: LoginEndpointConfig = LoginEndpointConfig()
    # Per-partition placement metrics from the head node's placement facts, read at each drift check: over SSM, or
    # the newest the agent put (agent channel).
    placement_metrics: StrictBool = False
    placement_alarms: dict[SlurmName, PlacementAlarm] = Field(default_factory=empty_dict)

    @model_validator(mode="after")
    def _consistent(self) -> ClusterConfig:
        self._placement_consistent()
        if self.replace_parallelcluster_topology and (
            self.orchestrator is not Orchestrator.EC2 or self.effective_mode is not Mode.ENFORCE
        ):
            raise ValueError(
                "replace_parallelcluster_topology: only for orchestrator ec2 in mode enforce (it lets topokeeper "
                "replace the topology.conf ParallelCluster generates)"
            )
        if self.login.enabled and self.orchestrator is Orchestrator.EKS:
            raise ValueError(
                "login.enabled: the login endpoint finds login nodes by HyperPod's SlurmConfig NodeType or, on EC2, "
                "by ec2.login_tag; an EKS cluster has no Slurm login nodes"
            )
        if self.orchestrator is Orchestrator.EKS:
            given = [key for key in ("mode", "channel", "head_node", "slurm_version") if getattr(self, key) is not None]
            if given or self.partitions:
                raise ValueError(
                    f"orchestrator eks: {', '.join(given or ['partitions'])} apply to Slurm clusters only (an EKS "
                    "cluster's Kueue objects go to the plan bucket; nothing is written to the cluster)"
                )
            return self
        if self.slurm_version is not None:
            SlurmVersion.parse(self.slurm_version)
        if self.effective_channel is Channel.SSM and self.head_node is None:
            raise ValueError("channel ssm needs head_node (the head node's SSM id, i-... or mi-...)")
        # SendCommand cannot reach HyperPod's sagemaker-cluster: targets, only a head node registered
        # with SSM as a hybrid managed node (mi-...).
        if (
            self.orchestrator is Orchestrator.HYPERPOD
            and self.effective_channel is Channel.SSM
            and not (self.head_node or "").startswith("mi-")
        ):
            raise ValueError(
                "HyperPod nodes cannot receive SSM Run Command; use channel agent, or register the head node "
                "as an SSM hybrid managed node and give its mi- id"
            )
        return self

    def _placement_consistent(self) -> None:
        if self.placement_alarms and not self.placement_metrics:
            raise ValueError("placement_alarms: set placement_metrics true too (the alarms watch its metrics)")
        if self.placement_metrics and self.orchestrator is Orchestrator.EKS:
            raise ValueError("placement_metrics: only for Slurm clusters (an EKS cluster has no slurmctld)")

    @property
    def effective_mode(self) -> Mode:
        if self.mode is not None:
            return self.mode
        return Mode.VERIFY if self.orchestrator is Orchestrator.HYPERPOD else Mode.ENFORCE

    @property
    def effective_channel(self) -> Channel:
        if self.channel is not None:
            return self.channel
        return Channel.AGENT if self.orchestrator is Orchestrator.HYPERPOD else Channel.SSM

    @property
    def planner_config(self) -> PlannerConfig:
        return PlannerConfig(partitions=self.partitions)

    def matches(self, name_or_arn: str) -> bool:
        return name_or_arn in {self.name, self.arn}


class Settings(BaseModel):
    """Everything configurable per deployment (account and region)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    clusters: list[ClusterConfig] = Field(min_length=1)
    debounce_seconds: int = Field(10, ge=0, le=900)
    min_write_interval_seconds: int = Field(60, ge=0, le=3600)
    max_wait_seconds: int = Field(30, ge=0, le=3600)
    drift_schedule: str = "rate(15 minutes)"
    drift_alarm_periods: int = Field(2, ge=1, le=100)
    alarm_email: Annotated[str, AfterValidator(_email)] | None = None
    alarm_topic_arn: str | None = None
    cloudtrail_lake_channel_arn: str | None = None
    log_retention_days: Literal[1, 3, 5, 7, 14, 30, 60, 90, 120, 150, 180, 365, 400, 545, 731, 1827, 3653] = 30
    audit_retention_days: int = Field(365, ge=1, le=3650)
    agent_verify_max_age_seconds: int = Field(1800, ge=60)
    # Besides the reconcile and drift functions, the only principal the bucket lets write (topokeeper apply).
    operator_role_arn: Annotated[str, AfterValidator(_role_arn)] | None = None

    @model_validator(mode="after")
    def _unique_clusters(self) -> Settings:
        names = [cluster.name for cluster in self.clusters]
        duplicates = sorted({name for name in names if names.count(name) > 1})
        if duplicates:
            raise ValueError(f"clusters listed twice: {', '.join(duplicates)}")
        return self

    def cluster(self, name_or_arn: str) -> ClusterConfig | None:
        """The managed cluster a name or ARN refers to, if any."""
        for cluster in self.clusters:
            if cluster.matches(name_or_arn):
                return cluster
        return None

    def to_env(self) -> str:
        """``TOPOKEEPER_CONFIG`` as the functions read it. The login endpoints' settings stay out: only the stack
        uses them (the functions get each endpoint's target group in ``LOGIN_TARGET_GROUPS``), and with 50 CIDRs
        and 50 security groups one cluster's alone would take most of Lambda's 4 KB of environment."""
        return self.model_dump_json(exclude_defaults=True, exclude={"clusters": {"__all__": {"login"}}})
