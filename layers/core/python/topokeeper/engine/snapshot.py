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

import difflib
from operator import attrgetter
from typing import Any, NamedTuple

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from topokeeper.contract.errors import InputError
from topokeeper.domain.catalog import ec2_instance_type
from topokeeper.domain.models import (
    PRESENT_STATUSES,
    ClusterSnapshot,
    Node,
    Partition,
    PartitionSettings,
    PlannerConfig,
    SlurmNodeRecord,
    SlurmVersion,
    empty_dict,
    empty_list,
)

DEFAULT_SLURM_VERSION = "25.11"
_NO_PARTITION_NODE_TYPES = frozenset({"Controller", "Login"})


class _Aws(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)


class AwsSlurmConfig(_Aws):
    NodeType: str | None = None
    PartitionNames: list[str] = Field(default_factory=empty_list)


class AwsInstanceGroup(_Aws):
    InstanceGroupName: str
    InstanceType: str | None = None
    SlurmConfig: AwsSlurmConfig | None = None


class AwsDescribeCluster(_Aws):
    ClusterArn: str | None = None
    ClusterName: str
    InstanceGroups: list[AwsInstanceGroup] = Field(default_factory=empty_list)
    Orchestrator: dict[str, Any] | None = None


RUNNING = "Running"


class AwsInstanceStatus(_Aws):
    Status: str = RUNNING


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


class SnapshotSlurm(_Aws):
    version: str | None = None
    partitions: dict[str, str] = Field(default_factory=empty_dict)  # legacy: instance group -> partition
    nodes: list[SlurmNodeRecord] | None = None  # name nodes as slurmctld does (ParallelCluster)


class AwsSnapshot(_Aws):
    describe_cluster: AwsDescribeCluster
    nodes: list[AwsClusterNode] = Field(default_factory=empty_list)
    instance_topology: list[AwsInstanceTopology] = Field(default_factory=empty_list)
    slurm: SnapshotSlurm = SnapshotSlurm()
    warnings: list[str] = Field(default_factory=empty_list)  # what reading the facts found (plan and audit carry them)
    # Instances whose topology discovery has not reached yet (its time ran out): the next read continues.
    undescribed: int = Field(0, ge=0)


class _ScontrolVersion(_Aws):
    major: int | str
    minor: int | str


class _ScontrolSlurm(_Aws):
    version: _ScontrolVersion | None = None


class _ScontrolMeta(_Aws):
    slurm: _ScontrolSlurm = _ScontrolSlurm()


class ScontrolNodes(_Aws):
    """``scontrol show nodes --json`` as the head node prints it: its ``nodes`` (and the Slurm version)."""

    nodes: list[SlurmNodeRecord]
    meta: _ScontrolMeta = _ScontrolMeta()

    @property
    def version(self) -> str | None:
        found = self.meta.slurm.version
        return f"{found.major}.{int(found.minor):02d}" if found is not None else None


def with_node_table(raw: AwsSnapshot, nodes: list[SlurmNodeRecord], version: str | None = None) -> AwsSnapshot:
    """``raw`` with the head node's node table, which names its nodes as slurmctld does (ParallelCluster);
    ``version``, the head node's Slurm, where ``raw`` has none."""
    slurm = raw.slurm.model_copy(update={"nodes": nodes, "version": raw.slurm.version or version})
    return raw.model_copy(update={"slurm": slurm})


def parse_scontrol_nodes(document: Any, source: str) -> ScontrolNodes:
    """The output of ``scontrol show nodes --json``; an error names ``source`` and the field."""
    try:
        return ScontrolNodes.model_validate(document)
    except ValidationError as error:
        raise InputError.from_validation(error, prefix=source) from error


def parse_snapshot_document(document: Any) -> AwsSnapshot:
    try:
        return AwsSnapshot.model_validate(document)
    except ValidationError as error:
        raise InputError.from_validation(error, model=AwsSnapshot) from error


class Instance(NamedTuple):
    """What the join reads of one ``nodes`` item (AwsClusterNode)."""

    group: str
    instance_id: str
    instance_type: str
    status: str
    host_name: str | None  # PrivateDnsHostname
    ip: str | None  # PrivatePrimaryIp
    ultraserver_id: str | None
    availability_zone: str | None

    @classmethod
    def of(cls, node: AwsClusterNode) -> Instance:
        return cls(
            node.InstanceGroupName,
            node.InstanceId,
            node.InstanceType,
            node.InstanceStatus.Status,
            node.PrivateDnsHostname,
            node.PrivatePrimaryIp,
            node.UltraServerInfo.Id if node.UltraServerInfo else None,
            node.Placement.AvailabilityZone if node.Placement else None,
        )


class InstanceTopology(NamedTuple):
    """What the join reads of one ``instance_topology`` item (AwsInstanceTopology)."""

    network_nodes: list[str] | None
    availability_zone: str | None
    capacity_block_id: str | None

    @classmethod
    def of(cls, item: AwsInstanceTopology) -> InstanceTopology:
        return cls(item.NetworkNodes, item.AvailabilityZone, item.CapacityBlockId)


class SnapshotFacts(NamedTuple):
    """A snapshot document read: ``raw`` holds all but its nodes and instance topology, read into these two."""

    raw: AwsSnapshot
    instances: list[Instance]
    topology_by_id: dict[str, InstanceTopology]

    @classmethod
    def of(cls, raw: AwsSnapshot) -> SnapshotFacts:
        instances = [Instance.of(node) for node in raw.nodes]
        return cls(raw, instances, {item.InstanceId: InstanceTopology.of(item) for item in raw.instance_topology})


def read_snapshot(document: Any) -> SnapshotFacts:
    """``parse_snapshot_document``: the same facts and the same errors, with the two lists that grow with the
    cluster read without pydantic when every item is plainly valid (10x faster, 100,000 nodes); one item that is
    not sends the whole document through the models, so it fails as it always did."""
    plain = _plain_lists(document)
    if plain is None:
        return SnapshotFacts.of(parse_snapshot_document(document))
    rest = parse_snapshot_document({**document, "nodes": [], "instance_topology": []})
    return SnapshotFacts(rest, *plain)


def _plain_lists(document: Any) -> tuple[list[Instance], dict[str, InstanceTopology]] | None:
    """``nodes`` and ``instance_topology`` when each value has exactly the type the models would take unchanged;
    None when anything else is found, for the models to read (and to name what is wrong)."""
    if type(document) is not dict:
        return None
    nodes, topology = document.get("nodes", []), document.get("instance_topology", [])
    if type(nodes) is not list or type(topology) is not list:
        return None
    instances: list[Instance] = []
    for item in nodes:
        instance = _plain_instance(item)
        if instance is None:
            return None
        instances.append(instance)
    topology_by_id: dict[str, InstanceTopology] = {}
    for item in topology:
        found = _plain_topology(item)
        if found is None:
            return None
        topology_by_id[found[0]] = found[1]
    return instances, topology_by_id


_TEXT = frozenset({str, type(None)})  # the types a ``str | None`` field takes unchanged
_STR = frozenset({str})
_new_tuple = tuple.__new__


def _plain_instance(item: Any) -> Instance | None:
    if type(item) is not dict:
        return None
    get = item.get
    group, instance_id, instance_type = get("InstanceGroupName"), get("InstanceId"), get("InstanceType")
    host_name, ip = get("PrivateDnsHostname"), get("PrivatePrimaryIp")
    status, ultraserver, placement = get("InstanceStatus", {}), get("UltraServerInfo"), get("Placement")
    if not (
        type(group) is str
        and type(instance_id) is str
        and type(instance_type) is str
        and type(host_name) in _TEXT
        and type(ip) in _TEXT
        and type(status) is dict
        and type(status.get("Status", "")) is str
    ):
        return None
    ultraserver_id = zone = None
    if ultraserver is not None:
        if type(ultraserver) is not dict or type(ultraserver.get("Type")) not in _TEXT:
            return None
        ultraserver_id = ultraserver.get("Id")
        if type(ultraserver_id) not in _TEXT:
            return None
    if placement is not None:
        if type(placement) is not dict:
            return None
        zone = placement.get("AvailabilityZone")
        if type(zone) not in _TEXT:
            return None
    status_text: str = status.get("Status", RUNNING)
    # tuple.__new__: Instance(...) is the same tuple through a Python-level __new__ (100,000 calls).
    return _new_tuple(Instance, (group, instance_id, instance_type, status_text, host_name, ip, ultraserver_id, zone))


def _plain_topology(item: Any) -> tuple[str, InstanceTopology] | None:
    if type(item) is not dict:
        return None
    get = item.get
    instance_id, network_nodes = get("InstanceId"), get("NetworkNodes")
    zone, capacity_block = get("AvailabilityZone"), get("CapacityBlockId")
    if not (
        type(instance_id) is str
        and type(get("InstanceType")) in _TEXT
        and (network_nodes is None or (type(network_nodes) is list and {*map(type, network_nodes)} <= _STR))
        and type(zone) in _TEXT
        and type(capacity_block) in _TEXT
    ):
        return None
    return instance_id, _new_tuple(InstanceTopology, (network_nodes, zone, capacity_block))


def slurm_node_name(node: AwsClusterNode | Instance) -> str | None:
    """Slurm calls a HyperPod node by its short private host name (``ip-10-1-2-3``)."""
    if not isinstance(node, Instance):  # (pydantic's isinstance, for AwsClusterNode, is a slow one)
        node = Instance.of(node)
    if node.host_name:
        return node.host_name.split(".", 1)[0]
    if node.ip:
        return "ip-" + node.ip.replace(".", "-")
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

    def name_of(self, node: Instance) -> str | None:
        if node.ip and node.ip in self._by_address:
            return self._by_address[node.ip]
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


def _unbound_nodes(naming: SlurmNaming, bound: set[str], planned: set[str]) -> list[Node]:
    """The Slurm nodes no instance backs, each in the first planned partition it lists (the planner warns)."""
    nodes: list[Node] = []
    for index, record, partition in naming.unbound(bound, planned):
        try:
            nodes.append(Node(name=record.name, partition=partition, status=SlurmNaming.NO_INSTANCE))
        except ValidationError as error:
            raise InputError(f"slurm.nodes[{index}].name", InputError.from_validation(error).message) from error
    return nodes


def _instance_name(
    instance: Instance, naming: SlurmNaming | None, in_partition: bool, warnings: list[str]
) -> str | None:
    """The Slurm name of an instance's node, or None (with a warning when it matters) to leave it out."""
    if naming is None:
        name = slurm_node_name(instance)
        if name is None:
            warnings.append(f"node {instance.instance_id} has no host name yet; left out until it has one")
        return name
    name = naming.name_of(instance)
    if name is None and in_partition and instance.status in PRESENT_STATUSES:
        address = instance.ip or "no private IP"
        warnings.append(f"instance {instance.instance_id} ({address}) is no Slurm node's NodeAddr; left out")
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


def check_config_partitions(raw: AwsSnapshot, config: PlannerConfig, prefix: str = "") -> None:
    """Refuse a config naming a partition the cluster does not have (its instance groups', its node table's, or
    one the config makes of instance groups): a misspelt name would plan an empty partition of its own."""
    known = {p for p in _partition_of_groups(raw, PlannerConfig()).values() if p}
    known |= {p for record in raw.slurm.nodes or () for p in record.partitions}
    known |= {name for name, settings in config.partitions.items() if settings.instance_groups}
    for name in sorted(set(config.partitions) - known):
        nearest = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.6)
        hint = f": did you mean {nearest[0]!r}?" if nearest else f" (its partitions: {', '.join(sorted(known))})"
        cluster = raw.describe_cluster.ClusterName
        raise InputError(f"{prefix}partitions.{name}", f"{cluster} has no partition {name}{hint}")


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
        and (naming is None or naming.name_of(Instance.of(node)) is None)
    )


_SOURCE_FIELD = {
    "name": "PrivateDnsHostname",
    "instance_id": "InstanceId",
    "instance_type": "InstanceType",
    "partition": "partition",
    "network_nodes": "NetworkNodes",
    "ultraserver_id": "UltraServerInfo.Id",
}


def _nodes(
    instances: list[Instance],
    topology_by_id: dict[str, InstanceTopology],
    group_partition: dict[str, str | None],
    naming: SlurmNaming | None,
    warnings: list[str],
) -> list[Node]:
    """A node for each instance that has a Slurm name: checked all at once, else one by one (for the errors)."""
    indexes: list[int] = []
    rows: list[dict[str, Any]] = []
    for index, instance in enumerate(instances):
        group = instance.group
        partition = group_partition.get(group)
        name = _instance_name(instance, naming, bool(partition), warnings)
        if name is None:
            continue
        if partition is None and group not in group_partition:
            warnings.append(f"node {name}: instance group {group!r} is not in DescribeCluster")
        indexes.append(index)
        rows.append(_node_fields(instance, name, partition, topology_by_id.get(instance.instance_id)))
    built = Node.from_plain_rows(rows)
    if built is None:
        built = [_checked_node(index, fields) for index, fields in zip(indexes, rows, strict=True)]
    return built


def _build_node(
    index: int, instance: Instance, name: str, partition: str | None, topology: InstanceTopology | None
) -> Node:
    return _checked_node(index, _node_fields(instance, name, partition, topology))


_NO_TOPOLOGY = InstanceTopology(None, None, None)  # an instance DescribeInstanceTopology has not described


def _node_fields(
    instance: Instance, name: str, partition: str | None, topology: InstanceTopology | None
) -> dict[str, Any]:
    # Unpacked once: a cluster of 100,000 nodes makes as many.
    group, instance_id, instance_type, status, _, _, ultraserver, zone = instance
    network_nodes, topology_zone, capacity_block = topology or _NO_TOPOLOGY
    return {
        "name": name,
        "instance_id": instance_id,
        "instance_type": instance_type,
        "instance_group": group,
        "partition": partition,
        "status": status,
        "network_nodes": tuple(network_nodes) if network_nodes else (),
        "ultraserver_id": ultraserver or capacity_block or None,
        "availability_zone": zone or topology_zone,
    }


def _checked_node(index: int, fields: dict[str, Any]) -> Node:
    """The node, or one InputError naming the snapshot field (``nodes[3].InstanceId``) of its first bad value."""
    try:
        return Node.from_fields(fields)
    except ValidationError as error:
        loc = error.errors()[0]["loc"]
        where = _SOURCE_FIELD.get(str(loc[0]), str(loc[0])) if loc else "node"
        detail = InputError.from_validation(error).message
        raise InputError(f"nodes[{index}].{where}", detail) from error


def build_snapshot(raw: AwsSnapshot, config: PlannerConfig, slurm_version: str | None = None) -> ClusterSnapshot:
    """Join the three AWS responses on instance id and group the nodes into partitions."""
    return join_snapshot(SnapshotFacts.of(raw), config, slurm_version)


def join_snapshot(facts: SnapshotFacts, config: PlannerConfig, slurm_version: str | None = None) -> ClusterSnapshot:
    """build_snapshot from facts read already (``read_snapshot``)."""
    raw, instances, topology_by_id = facts
    warnings: list[str] = list(raw.warnings)
    version_text = slurm_version or raw.slurm.version or DEFAULT_SLURM_VERSION
    try:
        version = SlurmVersion.parse(version_text)
    except ValueError as error:
        raise InputError("slurm.version", str(error)) from error

    group_partition = _partition_of_groups(raw, config)
    group_types = {g.InstanceGroupName: g.InstanceType for g in raw.describe_cluster.InstanceGroups}

    naming = SlurmNaming(raw.slurm.nodes) if raw.slurm.nodes is not None else None
    warnings.extend(naming.warnings if naming else ())
    chosen: dict[str, Node] = {}
    for node in _nodes(instances, topology_by_id, group_partition, naming, warnings):
        name = node.name
        if not node.present:
            continue
        # A replaced node keeps its host name; prefer the running instance, then a stable tie-break.
        previous = chosen.get(name)
        if previous is None or _rank(node) > _rank(previous):
            chosen[name] = node

    partition_names = sorted({p for p in group_partition.values() if p} | set(config.partitions))
    planned = list(chosen.values())
    if naming is not None:
        planned += _unbound_nodes(naming, set(chosen), set(partition_names))
    partitions: list[Partition] = []
    for partition_name in partition_names:
        nodes = tuple(sorted((n for n in planned if n.partition == partition_name), key=attrgetter("name")))
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
    _, instances, topology_by_id = SnapshotFacts.of(raw)
    nodes = (
        _build_node(index, item, eks_node_name(item.instance_id), None, topology_by_id.get(item.instance_id))
        for index, item in enumerate(instances)
    )
    return tuple(sorted((node for node in nodes if node.present), key=lambda node: node.name))
