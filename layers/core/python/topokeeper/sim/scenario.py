"""Scenario files for ``topokeeper simulate``: a cluster and a story of steps (YAML, strict schema)."""

from __future__ import annotations

import difflib
import functools
from copy import copy
from pathlib import Path
from typing import Annotated, Any, Literal

import botocore.session
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from topokeeper.contract.config import Mode, Settings
from topokeeper.contract.errors import InputError
from topokeeper.contract.operator_files import read_mapping
from topokeeper.contract.ports import Channel
from topokeeper.domain.catalog import CATALOG, HYPERPOD_PREFIX, hyperpod_offers
from topokeeper.domain.models import ClusterName, SlurmVersion
from topokeeper.domain.names import SlurmName

SIMULATED_SLURM_VERSIONS = ("24.11", "25.11", "26.05")

# Every number a scenario holds is finite and has a maximum: what the simulator can play on a small machine, not
# what a file can say (an unbounded wait ran until killed, a scale to 10^8 nodes ended in a MemoryError at 3.8 GB).
# HyperPod's InstanceCount limit per instance group.
MAX_GROUP_NODES = 6758
# The most nodes a cluster may hold at any point of its story: the benches' 20,000-node cluster (about 2.5 minutes
# here) and a quarter more.
MAX_CLUSTER_NODES = 25_000
# The longest any one duration may be (a wait, a spread, a step's timeout); a simulated day is about 80 s of a run
# here (with the drift schedule every 300 s).
MAX_STEP_SECONDS = 86_400
# What a story's waits and spreads may add up to: a simulated week (about 10 minutes here).
MAX_STORY_SECONDS = 7 * MAX_STEP_SECONDS
MAX_STEPS = 1000
# A latency the emulated services add (an API call, an SSM delivery, an agent's poll, HyperPod's rewrite).
MAX_LATENCY_SECONDS = 3600


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class NetworkLayout(_Strict):
    layers: Literal[3, 4] = 3
    nodes_per_leaf: int = Field(4, ge=1, le=MAX_GROUP_NODES)
    leaves_per_spine: int = Field(4, ge=1, le=MAX_GROUP_NODES)
    ultraserver_size: int | None = Field(None, ge=1, le=MAX_GROUP_NODES)


@functools.cache
def _instance_types(hyperpod: bool) -> tuple[str, tuple[str, ...]]:
    """The instance types AWS accepts (botocore's models, which the emulator checks too): HyperPod's ml. names,
    else EC2's."""
    session = botocore.session.get_session()
    if hyperpod:
        return "SageMaker HyperPod", tuple(session.get_service_model("sagemaker").shape_for("ClusterInstanceType").enum)
    return "EC2", tuple(session.get_service_model("ec2").shape_for("InstanceType").enum)


class InstanceGroup(_Strict):
    name: SlurmName
    type: str
    count: int = Field(ge=0, le=MAX_GROUP_NODES)
    role: Literal["controller", "login", "compute"] = "compute"
    partition: SlurmName | None = None
    network: NetworkLayout = NetworkLayout()
    # ParallelCluster: the compute resource's dynamic nodes (MaxCount - MinCount), powered down until scaled
    # up; ``count`` is its static nodes.
    dynamic: int = Field(0, ge=0, le=MAX_GROUP_NODES)

    @field_validator("type")
    @classmethod
    def _type_aws_accepts(cls, text: str) -> str:
        hyperpod = text.startswith(HYPERPOD_PREFIX)
        service, known = _instance_types(hyperpod)
        # The catalog may know a type the installed botocore does not yet list.
        if text not in known and not (hyperpod_offers(text) if hyperpod else text in CATALOG):
            nearest = difflib.get_close_matches(text, known, n=1, cutoff=0.8)
            hint = f"; did you mean {nearest[0]!r}?" if nearest else ""
            raise ValueError(f"{text!r} is not an instance type {service} accepts{hint}")
        return text

    @model_validator(mode="after")
    def _partition_for_compute(self) -> InstanceGroup:
        if self.role != "compute" and self.partition is not None:
            raise ValueError(f"{self.role} groups have no partition")
        return self


class ClusterSpec(_Strict):
    name: ClusterName
    # slurm: a HyperPod Slurm cluster with a head node; eks: HyperPod on EKS, whose Kueue objects and node
    # labels topokeeper writes to the plan bucket (no head node, no partitions, no controller group);
    # parallelcluster: Slurm on EC2 instances tagged as ParallelCluster tags them, its node names and bindings
    # (see topokeeper.sim.parallelcluster).
    orchestrator: Literal["slurm", "eks", "parallelcluster"] = "slurm"
    slurm_version: str = "26.05"
    mode: Mode = Mode.ENFORCE
    channel: Channel = Channel.SSM
    # The real head node's layout: debian (Slurm on PATH), hyperpod (/opt/slurm, partitions Included) or
    # parallelcluster (/opt/slurm, queues in pcluster/*.conf: the only one, and the default, for that
    # orchestrator).
    head_node_style: Literal["debian", "hyperpod", "parallelcluster"] = "debian"
    # HyperPod writes the topology itself after node changes (emulated, see sim/aws/hyperpod/managed_topology)
    # and records each change in CloudTrail: what verify mode watches.
    managed_topology: bool = False
    # The drift check reads the head node's placement facts and emits the per-partition placement metrics.
    placement_metrics: bool = False
    instance_groups: list[InstanceGroup] = Field(min_length=1, max_length=100)
    seed: int = Field(7, ge=0, le=2**64 - 1)
    # An NLB's IP target group the functions keep equal to the running login nodes (the login group's).
    login_endpoint: bool = False
    # A HyperPod Slurm cluster created before API-driven Slurm: no SlurmConfig; its partitions and login group are
    # in provisioning_parameters.json in its lifecycle bucket (sagemaker-<name>-lcs), which topokeeper reads.
    legacy: bool = False
    # ParallelCluster only: a real slurmd for each dynamic node that boots, started as the node-side step would
    # (with the topology of its registration entry, if the backend published one in time; see sim/booting_nodes).
    slurmd: bool = False

    @field_validator("slurm_version")
    @classmethod
    def _runnable_version(cls, text: str) -> str:
        version = str(SlurmVersion.parse(text))
        if version not in SIMULATED_SLURM_VERSIONS:
            # The head node is a real slurmctld from Debian (trixie 24.11, sid 26.05) or built from source
            # (25.11, sim/slurm_source); another version would silently run on one of these.
            raise ValueError(
                f"{text} is not a Slurm version the simulator runs; use {' or '.join(SIMULATED_SLURM_VERSIONS)}"
            )
        return text

    @model_validator(mode="before")
    @classmethod
    def _parallelcluster_head_node(cls, data: object) -> object:
        if isinstance(data, dict) and data.get("orchestrator") == "parallelcluster":
            return {"head_node_style": "parallelcluster", **data}
        return data

    def _parallelcluster_groups(self) -> None:
        parallelcluster = self.orchestrator == "parallelcluster"
        if parallelcluster != (self.head_node_style == "parallelcluster"):
            raise ValueError("head_node_style parallelcluster goes with orchestrator parallelcluster, and only it")
        if self.slurmd and not parallelcluster:
            raise ValueError("slurmd: real slurmd for booting nodes is modelled for orchestrator parallelcluster only")
        for index, group in enumerate(self.instance_groups):
            if group.dynamic and not (parallelcluster and group.role == "compute"):
                raise ValueError(f"instance_groups[{index}] ({group.name}): dynamic nodes are ParallelCluster's")
            if parallelcluster and group.role == "login":
                raise ValueError(f"instance_groups[{index}] ({group.name}): no login nodes in a parallelcluster world")
            if parallelcluster and group.role == "controller" and group.count != 1:
                raise ValueError(f"instance_groups[{index}] ({group.name}): ParallelCluster has one head node")
        # HyperPod takes only its ml. names and EC2 (ParallelCluster) only its own: AWS would refuse the other.
        for index, group in enumerate(self.instance_groups):
            if group.type.startswith(HYPERPOD_PREFIX) == parallelcluster:
                wanted = group.type.removeprefix(HYPERPOD_PREFIX) if parallelcluster else HYPERPOD_PREFIX + group.type
                service = "EC2 (ParallelCluster)" if parallelcluster else "SageMaker HyperPod"
                raise ValueError(
                    f"instance_groups[{index}].type: {group.type!r} is not a type {service} accepts; "
                    f"did you mean {wanted!r}?"
                )

    @model_validator(mode="after")
    def _valid(self) -> ClusterSpec:
        self._parallelcluster_groups()
        if self.legacy and self.orchestrator != "slurm":
            raise ValueError("legacy (no SlurmConfig) is a HyperPod Slurm cluster's: orchestrator slurm")
        if self.login_endpoint and not any(g.role == "login" for g in self.instance_groups):
            raise ValueError("login_endpoint needs an instance group with role: login")
        if self.orchestrator == "eks":
            if any(g.role != "compute" or g.partition is not None for g in self.instance_groups):
                raise ValueError("an eks cluster's instance groups are compute groups without a partition")
        elif sum(1 for g in self.instance_groups if g.role == "controller") != 1:
            raise ValueError("exactly one instance group must have role: controller")
        else:
            for index, group in enumerate(self.instance_groups):
                if group.role == "compute" and group.partition is None:
                    raise ValueError(f"instance_groups[{index}] ({group.name}): compute groups need a partition")
        names = [g.name for g in self.instance_groups]
        if len(set(names)) != len(names):
            raise ValueError("instance group names must be unique")
        nodes = sum(g.count + g.dynamic for g in self.instance_groups)
        if nodes > MAX_CLUSTER_NODES:
            raise ValueError(f"instance_groups: {nodes} nodes; the simulator runs at most {MAX_CLUSTER_NODES}")
        return self


class ScaleStep(_Strict):
    group: SlurmName
    to: int = Field(ge=0, le=MAX_GROUP_NODES)
    over_seconds: float = Field(0, ge=0, le=MAX_STEP_SECONDS)


class GroupCountStep(_Strict):
    group: SlurmName
    count: int = Field(1, ge=1, le=MAX_GROUP_NODES)


class ReplaceStep(GroupCountStep):
    new_ip: bool = False  # the new instance gets another private IP (else HyperPod keeps the node's IP)


class DuplicateStep(_Strict):
    factor: int = Field(2, ge=2, le=10)


class LoseStep(_Strict):
    fraction: float = Field(gt=0, lt=1)


class TamperStep(_Strict):
    pass


class WaitStep(_Strict):
    seconds: float = Field(gt=0, le=MAX_STEP_SECONDS)


MAX_JOBS = 20  # jobs one submit step asks for: a few, to show placement, not to load slurmctld


class JobRequest(_Strict):
    """One ``sbatch --exclusive`` a cluster user submits; the name is theirs (hostile data: argv only, escaped)."""

    partition: SlurmName
    nodes: int = Field(ge=1, le=MAX_GROUP_NODES)
    switches: int | None = Field(None, ge=1, le=MAX_GROUP_NODES)  # --switches=N (tree): N leaves at most
    segment: int | None = Field(None, ge=1, le=MAX_GROUP_NODES)  # --segment=N (block)
    # Slurm takes any text; a control character would break the timeline's one line per job.
    name: str = Field("job", min_length=1, max_length=64, pattern=r"^[^\x00-\x1f\x7f]+$")


class SubmitStep(_Strict):
    jobs: list[JobRequest] = Field(min_length=1, max_length=MAX_JOBS)


class Step(_Strict):
    """One story step: exactly one of the keys below."""

    scale: ScaleStep | None = None
    replace: ReplaceStep | None = None
    reboot: GroupCountStep | None = None
    delete: GroupCountStep | None = None
    fail_node: GroupCountStep | None = None
    duplicate_events: DuplicateStep | None = None
    lose_events: LoseStep | None = None
    tamper: TamperStep | None = None
    # The emulated HyperPod's bug: its next topology puts these nodes under another leaf or block.
    hyperpod_misplace: GroupCountStep | None = None
    # Jobs submitted to the real slurmctld (the file-only head node has none to take them).
    submit: SubmitStep | None = None
    wait: WaitStep | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> Step:
        chosen = [name for name in type(self).model_fields if getattr(self, name) is not None]
        if len(chosen) != 1:
            raise ValueError(f"a step has exactly one action, got {chosen or 'none'}")
        return self

    @property
    def action(self) -> str:
        return next(name for name in type(self).model_fields if getattr(self, name) is not None)


class Timing(_Strict):
    """Simulated latencies and schedules (seconds of simulated time)."""

    api_call_seconds: float = Field(0.02, ge=0, le=MAX_LATENCY_SECONDS)
    ssm_delivery_seconds: float = Field(2.0, ge=0, le=MAX_LATENCY_SECONDS)
    agent_poll_seconds: float = Field(30.0, gt=0, le=MAX_LATENCY_SECONDS)
    # The stack's drift schedule runs at this rate, so it is whole minutes (EventBridge Scheduler's finest unit).
    drift_interval_seconds: float = Field(300.0, ge=60, le=MAX_STEP_SECONDS, multiple_of=60)
    step_timeout_seconds: float = Field(1800.0, gt=0, le=MAX_STEP_SECONDS)
    # How long after a node change the emulated HyperPod rewrites a managed topology (an assumption).
    hyperpod_topology_seconds: float = Field(90.0, ge=0, le=MAX_LATENCY_SECONDS)
    # EC2's DescribeInstanceTopology answers a new instance without network nodes for this long after launch
    # ("not yet available"); it shapes every node-to-topology latency, so reports state it beside them.
    topology_report_delay_seconds: float = Field(0.0, ge=0, le=MAX_LATENCY_SECONDS)
    # ParallelCluster with slurmd: from the resume program's launch to the node-side step running on the instance,
    # and how long that step waits for the node's registration entry before starting slurmd without one.
    node_boot_seconds: float = Field(60.0, ge=0, le=MAX_LATENCY_SECONDS)
    registration_wait_seconds: float = Field(60.0, ge=0, le=MAX_LATENCY_SECONDS)


def _as_in_settings(name: str) -> Any:
    """The deployment setting's field (its default and bounds) for a scenario's field of the same name."""
    return copy(Settings.model_fields[name])


class Scenario(_Strict):
    cluster: ClusterSpec
    steps: list[Annotated[Step, Field()]] = Field(default_factory=list, max_length=MAX_STEPS)
    timing: Timing = Timing()
    # The deployment's settings (and their bounds) unless the scenario says otherwise.
    debounce_seconds: int = _as_in_settings("debounce_seconds")
    min_write_interval_seconds: int = _as_in_settings("min_write_interval_seconds")
    max_wait_seconds: int = _as_in_settings("max_wait_seconds")
    drift_alarm_periods: int = _as_in_settings("drift_alarm_periods")
    # false: HyperPod nodes live in SageMaker's service account, DescribeInstanceTopology does not know them
    expose_hyperpod_nodes: bool = True

    @model_validator(mode="after")
    def _groups_exist(self) -> Scenario:
        groups = {g.name for g in self.cluster.instance_groups}
        for index, step in enumerate(self.steps):
            target = getattr(step, step.action)
            group = getattr(target, "group", None)
            if group is not None and group not in groups:
                raise ValueError(f"steps[{index}].{step.action}.group: no instance group {group!r}")
            if step.hyperpod_misplace is not None and not self.cluster.managed_topology:
                raise ValueError(f"steps[{index}].hyperpod_misplace needs cluster.managed_topology: true")
            partitions = {g.partition for g in self.cluster.instance_groups}
            for number, job in enumerate(step.submit.jobs if step.submit else ()):
                if job.partition not in partitions:
                    raise ValueError(f"steps[{index}].submit.jobs[{number}].partition: no partition {job.partition!r}")
        if self.cluster.orchestrator == "parallelcluster":
            self._parallelcluster_steps()
        self._within_what_the_simulator_runs()
        return self

    def _within_what_the_simulator_runs(self) -> None:
        """The story's peak node count (each group at the largest size a step scales it to) and its waits and
        spreads together stay within MAX_CLUSTER_NODES and MAX_STORY_SECONDS; the error names the step that
        goes over."""
        largest = {g.name: g.count + g.dynamic for g in self.cluster.instance_groups}
        seconds = 0.0
        for index, step in enumerate(self.steps):
            if step.scale is not None:
                largest[step.scale.group] = max(largest[step.scale.group], step.scale.to)
                nodes = sum(largest.values())
                if nodes > MAX_CLUSTER_NODES:
                    raise ValueError(
                        f"steps[{index}].scale.to: the cluster would reach {nodes} nodes; the simulator runs at most"
                        f" {MAX_CLUSTER_NODES}"
                    )
            duration = ("scale.over_seconds", step.scale.over_seconds) if step.scale is not None else None
            if step.wait is not None:
                duration = ("wait.seconds", step.wait.seconds)
            if duration is not None:
                seconds += duration[1]
                if seconds > MAX_STORY_SECONDS:
                    raise ValueError(
                        f"steps[{index}].{duration[0]}: the story's waits and spreads add up to {seconds:g} s; at"
                        f" most {MAX_STORY_SECONDS} (a simulated week)"
                    )

    def _parallelcluster_steps(self) -> None:
        """ParallelCluster scales a compute resource by powering its dynamic nodes up or down; its static nodes
        stay (replaced when unhealthy). What HyperPod alone does is refused here rather than half-played."""
        if self.cluster.managed_topology or self.cluster.login_endpoint:
            raise ValueError("managed_topology and login_endpoint are HyperPod's, not a parallelcluster world's")
        groups = {g.name: g for g in self.cluster.instance_groups}
        for index, step in enumerate(self.steps):
            if step.action in ("reboot", "fail_node", "hyperpod_misplace"):
                raise ValueError(f"steps[{index}].{step.action}: not simulated for orchestrator parallelcluster")
            if step.scale is not None:
                group = groups[step.scale.group]
                if not group.count <= step.scale.to <= group.count + group.dynamic:
                    raise ValueError(
                        f"steps[{index}].scale.to: {group.name} runs {group.count} static and up to {group.dynamic}"
                        f" dynamic nodes, so between {group.count} and {group.count + group.dynamic}"
                    )


def load_scenario(path: Path) -> Scenario:
    document = read_mapping(path, "--scenario", always_yaml=True)
    try:
        return Scenario.model_validate(document)
    except ValidationError as error:
        raise InputError.from_validation(error, prefix="scenario", model=Scenario) from error
