"""From AWS responses (as boto3 or the AWS CLI return them) to the canonical ClusterSnapshot.

A snapshot file holds ``describe_cluster`` (DescribeCluster), ``nodes`` (ListClusterNodes summaries or
DescribeClusterNode details), ``instance_topology`` (DescribeInstanceTopology ``Instances``) and an
optional ``slurm`` section (``version``; legacy ``partitions`` {instance group: partition}; ``nodes``,
the ``nodes`` list of the head node's ``scontrol show nodes --json``). The AWS shapes are parsed
leniently (unknown keys ignored); everything that reaches Slurm is validated strictly when the Node is
built.

Without ``slurm.nodes`` a node is named by its host name, as HyperPod names Slurm nodes. With it,
an instance takes the name of the Slurm node whose NodeAddr is its private IP (else whose name is its
host name), as slurmctld and the aws-samples generator bind them: ParallelCluster calls nodes
``<queue>-st|dy-<compute resource>-<n>``. An instance that matches no Slurm node is left out with a
warning; a Slurm node with no instance (a powered-down dynamic node) is still planned, without
topology, in the first planned partition it lists.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from topokeeper.domain.catalog import ec2_instance_type
from topokeeper.domain.hostlist import compress
from topokeeper.domain.models import (
    PRESENT_STATUSES,
    ClusterSnapshot,
    Node,
    Partition,
    PartitionSettings,
    PlannerConfig,
    SlurmVersion,
)
from topokeeper.errors import InputError

DEFAULT_SLURM_VERSION = "25.11"
_NO_PARTITION_NODE_TYPES = frozenset({"Controller", "Login"})


class _Aws(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)


class AwsSlurmConfig(_Aws):
    NodeType: str | None = None
    PartitionNames: list[str] = Field(default_factory=list)


class AwsInstanceGroup(_Aws):
    InstanceGroupName: str
    InstanceType: str | None = None
    SlurmConfig: AwsSlurmConfig | None = None


class AwsDescribeCluster(_Aws):
    ClusterArn: str | None = None
    ClusterName: str
    InstanceGroups: list[AwsInstanceGroup] = Field(default_factory=list)
    Orchestrator: dict[str, Any] | None = None


class AwsInstanceStatus(_Aws):
    Status: str = "Running"


class AwsUltraServerInfo(_Aws):
    Id: str | None = None
    Type: str | None = None


class AwsPlacement(_Aws):
    AvailabilityZone: str | None = None


class AwsClusterNode(_Aws):
    InstanceGroupName: str
    InstanceId: str
    InstanceType: str
    InstanceStatus: AwsInstanceStatus = AwsInstanceStatus()
    PrivateDnsHostname: str | None = None
    PrivatePrimaryIp: str | None = None
    UltraServerInfo: AwsUltraServerInfo | None = None
    Placement: AwsPlacement | None = None


class AwsInstanceTopology(_Aws):
    InstanceId: str
    InstanceType: str | None = None
    NetworkNodes: list[str] | None = None
    AvailabilityZone: str | None = None
    CapacityBlockId: str | None = None


class SlurmNodeRecord(_Aws):
    """One item of ``scontrol show nodes --json``'s ``nodes``: what binds a Slurm node to an instance."""

    name: str
    address: str | None = None  # NodeAddr: the private IP once bound; the node's own name while powered down
    hostname: str | None = None
    partitions: list[str] = Field(default_factory=list)


class SnapshotSlurm(_Aws):
    version: str | None = None
    partitions: dict[str, str] = Field(default_factory=dict)  # legacy: instance group -> partition
    nodes: list[SlurmNodeRecord] | None = None  # name nodes as slurmctld does (ParallelCluster)


class AwsSnapshot(_Aws):
    describe_cluster: AwsDescribeCluster
    nodes: list[AwsClusterNode] = Field(default_factory=list)
    instance_topology: list[AwsInstanceTopology] = Field(default_factory=list)
    slurm: SnapshotSlurm = SnapshotSlurm()
    warnings: list[str] = Field(default_factory=list)  # what reading the facts found (plan and audit carry them)
    # Instances whose topology discovery has not reached yet (its time ran out): the next read continues.
    undescribed: int = Field(0, ge=0)


def parse_snapshot_document(document: Any) -> AwsSnapshot:
    try:
        return AwsSnapshot.model_validate(document)
    except ValidationError as error:
        raise InputError.from_validation(error, model=AwsSnapshot) from error


def slurm_node_name(node: AwsClusterNode) -> str | None:
    """Slurm calls a HyperPod node by its short private host name (``ip-10-1-2-3``)."""
    if node.PrivateDnsHostname:
        return node.PrivateDnsHostname.split(".", 1)[0]
    if node.PrivatePrimaryIp:
        return "ip-" + node.PrivatePrimaryIp.replace(".", "-")
    return None


class SlurmNaming:
    """Instances -> Slurm node names from the head node's node table (NodeAddr = private IP)."""

    NO_INSTANCE = "NoInstance"  # the status of a Slurm node that no instance backs

    def __init__(self, records: list[SlurmNodeRecord]) -> None:
        self.records = sorted(enumerate(records), key=lambda item: item[1].name)  # index: where in slurm.nodes
        self._by_address: dict[str, str] = {}
        self._names = {record.name for record in records}
        self.warnings: list[str] = []
        for _, record in self.records:
            if record.address and record.address != record.name:
                previous = self._by_address.setdefault(record.address, record.name)
                if previous != record.name:
                    self.warnings.append(f"Slurm nodes {previous} and {record.name} share NodeAddr {record.address}")

    def name_of(self, node: AwsClusterNode) -> str | None:
        if node.PrivatePrimaryIp and node.PrivatePrimaryIp in self._by_address:
            return self._by_address[node.PrivatePrimaryIp]
        host_name = slurm_node_name(node)  # HyperPod: NodeName is the host name
        return host_name if host_name in self._names else None

    def unbound(self, bound: set[str], planned: set[str]) -> list[tuple[int, SlurmNodeRecord, str]]:
        """(index, record, partition) of each Slurm node no instance took that is in a planned partition."""
        found = []
        for index, record in self.records:
            partition = next((p for p in record.partitions if p in planned), None)
            if record.name not in bound and partition is not None:
                found.append((index, record, partition))
        return found


def _unbound_nodes(naming: SlurmNaming, bound: set[str], planned: set[str], warnings: list[str]) -> list[Node]:
    nodes: list[Node] = []
    for index, record, partition in naming.unbound(bound, planned):
        try:
            nodes.append(Node(name=record.name, partition=partition, status=SlurmNaming.NO_INSTANCE))
        except ValidationError as error:
            raise InputError(f"slurm.nodes[{index}].name", InputError.from_validation(error).message) from error
    for partition in sorted({node.partition or "" for node in nodes}):
        names = [node.name for node in nodes if node.partition == partition]
        warnings.append(
            f"partition {partition}: {len(names)} Slurm node(s) with no instance (powered down?) planned without"
            f" topology: {compress(names)}"
        )
    return nodes


def _instance_name(
    raw_node: AwsClusterNode, naming: SlurmNaming | None, in_partition: bool, warnings: list[str]
) -> str | None:
    """The Slurm name of an instance's node, or None (with a warning when it matters) to leave it out."""
    if naming is None:
        name = slurm_node_name(raw_node)
        if name is None:
            warnings.append(f"node {raw_node.InstanceId} has no host name yet; left out until it has one")
        return name
    name = naming.name_of(raw_node)
    if name is None and in_partition and raw_node.InstanceStatus.Status in PRESENT_STATUSES:
        address = raw_node.PrivatePrimaryIp or "no private IP"
        warnings.append(f"instance {raw_node.InstanceId} ({address}) is no Slurm node's NodeAddr; left out")
    return name


def _partition_of_groups(raw: AwsSnapshot, config: PlannerConfig) -> dict[str, str | None]:
    """Instance group -> partition; precedence: config file > SlurmConfig.PartitionNames > legacy mapping."""
    mapping: dict[str, str | None] = {}
    for group in raw.describe_cluster.InstanceGroups:
        slurm_config = group.SlurmConfig
        if slurm_config and slurm_config.NodeType in _NO_PARTITION_NODE_TYPES:
            mapping[group.InstanceGroupName] = None
        elif slurm_config and slurm_config.PartitionNames:
            mapping[group.InstanceGroupName] = slurm_config.PartitionNames[0]
        else:
            mapping[group.InstanceGroupName] = raw.slurm.partitions.get(group.InstanceGroupName)
    for group_name, partition in raw.slurm.partitions.items():
        mapping.setdefault(group_name, partition)
    for partition, settings in sorted(config.partitions.items()):
        for group_name in settings.instance_groups:
            mapping[group_name] = partition
    return mapping


def unnamed_instances(raw: AwsSnapshot, config: PlannerConfig) -> list[str]:
    """Present instances of a planned partition that no Slurm node of ``raw.slurm.nodes`` binds (each of them
    when there is no node table): the ones a fresher node table from the head node may name."""
    group_partition = _partition_of_groups(raw, config)
    naming = SlurmNaming(raw.slurm.nodes) if raw.slurm.nodes is not None else None
    return sorted(
        node.InstanceId
        for node in raw.nodes
        if group_partition.get(node.InstanceGroupName)
        and node.InstanceStatus.Status in PRESENT_STATUSES
        and (naming is None or naming.name_of(node) is None)
    )


def _build_node(
    index: int, raw_node: AwsClusterNode, name: str, partition: str | None, topology: AwsInstanceTopology | None
) -> Node:
    ultraserver = raw_node.UltraServerInfo.Id if raw_node.UltraServerInfo else None
    if not ultraserver and topology is not None:
        ultraserver = topology.CapacityBlockId
    availability_zone = raw_node.Placement.AvailabilityZone if raw_node.Placement else None
    fields = {
        "name": name,
        "instance_id": raw_node.InstanceId,
        "instance_type": raw_node.InstanceType,
        "instance_group": raw_node.InstanceGroupName,
        "partition": partition,
        "status": raw_node.InstanceStatus.Status,
        "network_nodes": tuple(topology.NetworkNodes or ()) if topology else (),
        "ultraserver_id": ultraserver or None,
        "availability_zone": availability_zone or (topology.AvailabilityZone if topology else None),
    }
    source_field = {
        "name": "PrivateDnsHostname",
        "instance_id": "InstanceId",
        "instance_type": "InstanceType",
        "partition": "partition",
        "network_nodes": "NetworkNodes",
        "ultraserver_id": "UltraServerInfo.Id",
    }
    try:
        return Node.model_validate(fields)
    except ValidationError as error:
        loc = error.errors()[0]["loc"]
        where = source_field.get(str(loc[0]), str(loc[0])) if loc else "node"
        detail = InputError.from_validation(error).message
        raise InputError(f"nodes[{index}].{where}", detail) from error


def build_snapshot(raw: AwsSnapshot, config: PlannerConfig, slurm_version: str | None = None) -> ClusterSnapshot:
    """Join the three AWS responses on instance id and group the nodes into partitions."""
    warnings: list[str] = list(raw.warnings)
    version_text = slurm_version or raw.slurm.version or DEFAULT_SLURM_VERSION
    try:
        version = SlurmVersion.parse(version_text)
    except ValueError as error:
        raise InputError("slurm.version", str(error)) from error

    group_partition = _partition_of_groups(raw, config)
    group_types = {g.InstanceGroupName: g.InstanceType for g in raw.describe_cluster.InstanceGroups}
    topology_by_id = {item.InstanceId: item for item in raw.instance_topology}

    naming = SlurmNaming(raw.slurm.nodes) if raw.slurm.nodes is not None else None
    warnings.extend(naming.warnings if naming else ())
    chosen: dict[str, Node] = {}
    for index, raw_node in enumerate(raw.nodes):
        name = _instance_name(raw_node, naming, bool(group_partition.get(raw_node.InstanceGroupName)), warnings)
        if name is None:
            continue
        if raw_node.InstanceGroupName not in group_partition:
            warnings.append(f"node {name}: instance group {raw_node.InstanceGroupName!r} is not in DescribeCluster")
        group_of_node = group_partition.get(raw_node.InstanceGroupName)
        node = _build_node(index, raw_node, name, group_of_node, topology_by_id.get(raw_node.InstanceId))
        if not node.present:
            continue
        # A replaced node keeps its host name; prefer the running instance, then a stable tie-break.
        previous = chosen.get(name)
        if previous is None or _rank(node) > _rank(previous):
            chosen[name] = node

    partition_names = sorted({p for p in group_partition.values() if p} | set(config.partitions))
    planned = list(chosen.values())
    if naming is not None:
        planned += _unbound_nodes(naming, set(chosen), set(partition_names), warnings)
    partitions: list[Partition] = []
    for partition_name in partition_names:
        nodes = tuple(sorted((n for n in planned if n.partition == partition_name), key=lambda n: n.name))
        types = sorted(
            {ec2_instance_type(t) for g, t in group_types.items() if t and group_partition.get(g) == partition_name}
        )
        try:
            partition = Partition(
                name=partition_name,
                nodes=nodes,
                settings=config.partitions.get(partition_name, PartitionSettings()),
                instance_types=tuple(types),
            )
        except ValidationError as error:
            raise InputError.from_validation(error, prefix=f"partitions.{partition_name}") from error
        partitions.append(partition)

    unmapped = sorted({n.instance_group or "" for n in chosen.values() if n.partition is None})
    for group_name in unmapped:
        if group_name and group_name in group_partition and _is_compute(raw, group_name):
            warnings.append(f"instance group {group_name!r} has no partition mapping; its nodes are not planned")

    try:
        return ClusterSnapshot(
            cluster_name=raw.describe_cluster.ClusterName,
            cluster_arn=raw.describe_cluster.ClusterArn,
            slurm_version=version,
            partitions=tuple(partitions),
            warnings=tuple(warnings),
            bindings=_bindings(naming, partitions),
        )
    except ValidationError as error:
        raise InputError("describe_cluster.ClusterName", InputError.from_validation(error).message) from error


def _bindings(naming: SlurmNaming | None, partitions: list[Partition]) -> dict[str, str]:
    if naming is None:
        return {}
    addresses = {record.name: record.address or record.name for _, record in naming.records}
    return {node.name: addresses[node.name] for p in partitions for node in p.nodes if node.name in addresses}


def _rank(node: Node) -> tuple[bool, str]:
    return (node.status == "Running", node.instance_id or "")


def _is_compute(raw: AwsSnapshot, group_name: str) -> bool:
    for group in raw.describe_cluster.InstanceGroups:
        if group.InstanceGroupName == group_name:
            return not (group.SlurmConfig and group.SlurmConfig.NodeType in _NO_PARTITION_NODE_TYPES)
    return True


def eks_node_name(instance_id: str) -> str:
    """HyperPod names an EKS cluster's Kubernetes node after its instance (``hyperpod-i-0123...``)."""
    return f"hyperpod-{instance_id}"


def eks_nodes(raw: AwsSnapshot) -> tuple[Node, ...]:
    """An EKS-orchestrated cluster's present nodes, joined with their topology; EKS has no partitions."""
    topology_by_id = {item.InstanceId: item for item in raw.instance_topology}
    nodes = (
        _build_node(index, raw_node, eks_node_name(raw_node.InstanceId), None, topology_by_id.get(raw_node.InstanceId))
        for index, raw_node in enumerate(raw.nodes)
    )
    return tuple(sorted((node for node in nodes if node.present), key=lambda node: node.name))
