"""ClusterSnapshot -> Plan: which topology each partition gets, and the topology itself.

Resolution follows HyperPod's documented rule for ``kind: auto``: all UltraServer types -> block; all
topology-capable (UltraServer included) -> tree; any type without topology data -> flat, which leaves
the partition on the flat cluster default. A config file may force a kind and set block sizes.
Slurm < 25.05 has a single cluster-wide topology: the compatible one across partitions (all block ->
block, any tree -> tree, else flat), selected by ``TopologyPlugin``.
"""

from __future__ import annotations

from topokeeper.contract.errors import InputError
from topokeeper.domain.catalog import CATALOG, Capability, lookup
from topokeeper.domain.models import (
    FLAT_DEFAULT,
    NO_TOPOLOGY_SWITCH,
    NO_ULTRASERVER_BLOCK,
    BlockTopology,
    ClusterSnapshot,
    FlatTopology,
    Node,
    Partition,
    PartitionPlan,
    Plan,
    SlurmFormat,
    Topology,
    TopologyKind,
    TreeTopology,
)
from topokeeper.domain.names import check_slurm_name
from topokeeper.engine.block import build_blocks
from topokeeper.engine.tree import build_tree
from topokeeper.wire import compress

CLUSTER_TOPOLOGY = "cluster"
PLUGIN_NAMES = {TopologyKind.TREE: "topology/tree", TopologyKind.BLOCK: "topology/block"}
FLAT_PLUGIN_BEFORE_25_05 = "topology/default"  # renamed topology/flat in 25.05


def resolve_kind(partition: Partition) -> TopologyKind:
    if partition.settings.kind != "auto":
        return TopologyKind(partition.settings.kind)
    types = {node.instance_type for node in partition.nodes if node.instance_type} | set(partition.instance_types)
    if not types or not partition.nodes:
        return TopologyKind.FLAT
    capabilities = {lookup(instance_type).capability for instance_type in types}
    if Capability.NONE in capabilities:
        return TopologyKind.FLAT
    if capabilities == {Capability.ULTRASERVER}:
        return TopologyKind.BLOCK
    return TopologyKind.TREE


def _flat_reason(partition: Partition) -> str | None:
    """Why ``kind: auto`` made a partition flat, naming the nodes (or group types) responsible; None when
    nothing there is a surprise (every type is one without topology data, such as CPU instances)."""
    types = {node.instance_type for node in partition.nodes if node.instance_type} | set(partition.instance_types)
    without = sorted(t for t in types if lookup(t).capability is Capability.NONE)
    capable_families = {known.split(".")[0] for known in CATALOG}
    if len(without) == len(types) and not any(t.split(".")[0] in capable_families for t in without):
        return None
    nodes = sorted(n.name for n in partition.nodes if n.instance_type in without)
    named = ", ".join(nodes[:5]) + (f" and {len(nodes) - 5} more" if len(nodes) > 5 else "")
    return (
        f"flat: {', '.join(without)} ({named or 'instance group type'}) reports no network topology; "
        "rule (HyperPod, kind auto): any such type makes the partition flat (set kind in the config to override)"
    )


def block_sizes_for(partition: Partition) -> tuple[int, ...]:
    types = {node.instance_type for node in partition.nodes if node.instance_type} | set(partition.instance_types)
    sizes = {size for t in types if (size := lookup(t).ultraserver_size) is not None}
    if partition.settings.block_sizes:
        base = partition.settings.block_sizes[0]
        if sizes and base > min(sizes):
            # No block could ever hold a base-size job; Slurm < 25.05 refuses to start with such blocks.
            raise InputError(
                f"partitions.{partition.name}.block_sizes",
                f"base {base} is larger than an UltraServer ({min(sizes)} nodes of {', '.join(sorted(types))}); "
                f"use {min(sizes)} or less",
            )
        return partition.settings.block_sizes
    if len(sizes) != 1:
        found = ", ".join(sorted(types)) or "no instance type"
        raise InputError(
            f"partitions.{partition.name}.block_sizes",
            f"required: the UltraServer size cannot be taken from the instance types ({found})",
        )
    return (sizes.pop(),)


def _topology_name(kind: TopologyKind, partition: str) -> str:
    name = f"{kind.value}-{partition}"
    try:
        return check_slurm_name(name)
    except ValueError as error:
        raise InputError(f"partitions.{partition}", f"topology name {error}") from error


def plan_partition(partition: Partition) -> PartitionPlan:
    kind = resolve_kind(partition)
    names = tuple(node.name for node in partition.nodes)
    warnings: list[str] = []
    without: tuple[str, ...] = ()
    no_instance = tuple(sorted(node.name for node in partition.nodes if node.instance_id is None))
    if no_instance:  # the partition's own warning: the plan table and the report show it in its row
        warnings.append(
            f"{len(no_instance)} Slurm node(s) with no instance (powered down?) planned without topology:"
            f" {compress(no_instance)}"
        )
    topology: Topology
    if kind is TopologyKind.TREE:
        topology, without, tree_warnings = build_tree(_topology_name(kind, partition.name), partition.nodes)
        warnings.extend(tree_warnings)
        without = tuple(name for name in without if name not in no_instance)
        if without:
            warnings.append(f"{len(without)} node(s) without network topology data, placed under no-topology")
    elif kind is TopologyKind.BLOCK:
        topology, without = build_blocks(
            _topology_name(kind, partition.name), partition.nodes, block_sizes_for(partition)
        )
        without = tuple(name for name in without if name not in no_instance)
        if without:
            warnings.append(f"{len(without)} node(s) without an UltraServer id, placed in block no-ultraserver")
    else:
        topology = FlatTopology(name=FLAT_DEFAULT)
        if not partition.nodes:
            warnings.append("no nodes present; flat until nodes join")
        elif partition.settings.kind == "auto" and (reason := _flat_reason(partition)):
            warnings.append(reason)
    checked = PartitionPlan(
        partition=partition.name,
        kind=kind,
        topology=topology,
        assignment=None if kind is TopologyKind.FLAT else topology.name,
        nodes=(),
        nodes_without_topology=(),
        nodes_without_instance=(),
        warnings=tuple(warnings),
    )
    # The nodes' names were checked when the nodes were: not again, one by one.
    return checked.model_copy(
        update={"nodes": tuple(sorted(names)), "nodes_without_topology": without, "nodes_without_instance": no_instance}
    )


def _cluster_topology(snapshot: ClusterSnapshot, plans: list[PartitionPlan]) -> tuple[Topology, str, list[str]]:
    """The one topology a Slurm < 25.05 cluster can have, covering every managed node."""
    kinds = {plan.kind for plan in plans} - {TopologyKind.FLAT}
    all_nodes: list[Node] = [node for partition in snapshot.partitions for node in partition.nodes]
    if not kinds:
        return FlatTopology(name=FLAT_DEFAULT), FLAT_PLUGIN_BEFORE_25_05, []
    if kinds == {TopologyKind.BLOCK}:
        block_plans = sorted((p for p in plans if p.kind is TopologyKind.BLOCK), key=lambda p: p.partition)
        sizes = {p.topology.block_sizes for p in block_plans if isinstance(p.topology, BlockTopology)}
        chosen = next(p.topology.block_sizes for p in block_plans if isinstance(p.topology, BlockTopology))
        warnings = []
        if len(sizes) > 1:
            warnings.append(f"partitions disagree on block_sizes; topology.conf uses {list(chosen)}")
        blocks, _ = build_blocks(CLUSTER_TOPOLOGY, all_nodes, chosen)
        short = [block.name for block in blocks.blocks if len(block.nodes) < chosen[0]]
        if not short:
            return blocks, PLUGIN_NAMES[TopologyKind.BLOCK], warnings
        # Slurm 24.11 refuses to start with a block below the base size ("children count lower than
        # bblock_node_cnt"), so an incomplete UltraServer or other nodes make the cluster a tree.
        warnings.append(
            f"blocks below the base size {chosen[0]} ({', '.join(short)}) are fatal before Slurm 25.05; "
            "topology.conf uses topology/tree instead"
        )
    else:
        warnings = []
    tree, _, tree_warnings = build_tree(CLUSTER_TOPOLOGY, all_nodes)
    return tree, PLUGIN_NAMES[TopologyKind.TREE], warnings + list(tree_warnings)


FOLDED = "is folded into the cluster"  # in a plan warning: "... partition NAME is folded into the cluster ..."


def _folds(version: str, topology: Topology, plans: list[PartitionPlan]) -> list[str]:
    """What one cluster-wide topology does to the partitions whose own kind differs from it."""
    if isinstance(topology, FlatTopology):
        return []
    if isinstance(topology, TreeTopology):
        unit, where = "tree", {n for s in topology.switches if s.name == NO_TOPOLOGY_SWITCH for n in s.nodes}
        where_name, placed = NO_TOPOLOGY_SWITCH, "under their switches"
    else:
        unit, where = "block topology", {n for b in topology.blocks if b.name == NO_ULTRASERVER_BLOCK for n in b.nodes}
        where_name, placed = f"block {NO_ULTRASERVER_BLOCK}", "in their UltraServer's block"
    folds = []
    for partition in sorted(plans, key=lambda p: p.partition):
        if partition.kind is topology.kind or not partition.nodes:
            continue
        stray = [name for name in partition.nodes if name in where]
        parts = [f"{compress(stray)} in {where_name}"] if stray else []
        if len(stray) < len(partition.nodes):
            parts.append(f"{len(partition.nodes) - len(stray)} node(s) {placed}")
        folds.append(
            f"Slurm {version} has one cluster-wide topology: {partition.kind.value} partition {partition.partition} "
            f"{FOLDED} {unit} ({'; '.join(parts)}); Slurm >= 25.05 keeps it {partition.kind.value}"
        )
    return folds


def plan(snapshot: ClusterSnapshot) -> Plan:
    partition_plans = [plan_partition(partition) for partition in snapshot.partitions]
    slurm_format = snapshot.slurm_version.format
    warnings = list(snapshot.warnings)
    cluster_topology: TreeTopology | BlockTopology | FlatTopology | None = None
    plugin = None
    if slurm_format is SlurmFormat.CONF:
        cluster_topology, plugin, cluster_warnings = _cluster_topology(snapshot, partition_plans)
        warnings.extend(cluster_warnings)
        warnings.extend(_folds(str(snapshot.slurm_version), cluster_topology, partition_plans))
        partition_plans = [p.model_copy(update={"assignment": None}) for p in partition_plans]
    return Plan(
        cluster_name=snapshot.cluster_name,
        cluster_arn=snapshot.cluster_arn,
        slurm_version=snapshot.slurm_version,
        slurm_format=slurm_format,
        partitions=tuple(partition_plans),
        cluster_topology=cluster_topology,
        topology_plugin=plugin,
        warnings=tuple(warnings),
        bindings=snapshot.bindings,
    )
