"""Planning from files (``plan``, ``show`` and ``verify`` without AWS): a snapshot and a config -> the rendered
plan, and the table that shows it."""

from __future__ import annotations

from pathlib import Path

from pydantic import ValidationError

from topokeeper.contract.errors import InputError
from topokeeper.contract.operator_files import read_mapping
from topokeeper.domain.models import (
    PLACEHOLDER_UNITS,
    BlockTopology,
    PartitionPlan,
    PlannerConfig,
    Topology,
    TreeTopology,
)
from topokeeper.engine.planner import plan
from topokeeper.engine.snapshot import check_config_partitions, join_snapshot, read_snapshot
from topokeeper.render.bundle import RenderedPlan, render
from topokeeper.render.narrate import columns


def load_config(path: Path | None) -> PlannerConfig:
    if path is None:
        return PlannerConfig()
    document = read_mapping(path, "--config")
    try:
        return PlannerConfig.model_validate(document)
    except ValidationError as error:
        raise InputError.from_validation(error, prefix="config", model=PlannerConfig) from error


def plan_from_files(snapshot_path: Path, config_path: Path | None, slurm_version: str | None) -> RenderedPlan:
    facts, config = read_snapshot(read_mapping(snapshot_path, "--snapshot")), load_config(config_path)
    check_config_partitions(facts.raw, config, prefix="config.")
    return render(plan(join_snapshot(facts, config, slurm_version)))


def leaf_units(topology: Topology) -> list[tuple[str, tuple[str, ...]]]:
    """(name, nodes) of a topology's leaf switches or blocks; none for a flat one."""
    if isinstance(topology, TreeTopology):
        return [(switch.name, switch.nodes) for switch in topology.switches if not switch.switches]
    if isinstance(topology, BlockTopology):
        return [(block.name, block.nodes) for block in topology.blocks]
    return []


def _largest_unit(partition: PartitionPlan, folded_into: Topology | None) -> int:
    """The most of the partition's nodes one leaf or block holds; folded (before 25.05), in the cluster-wide
    topology Slurm actually reads. A placeholder (no-topology, no-ultraserver) is no leaf a job could use."""
    if folded_into is None:
        units = leaf_units(partition.topology)
        return max((len(nodes) for name, nodes in units if name not in PLACEHOLDER_UNITS), default=0)
    members = set(partition.nodes)
    units = leaf_units(folded_into)
    return max((len(members.intersection(nodes)) for name, nodes in units if name not in PLACEHOLDER_UNITS), default=0)


def plan_table(rendered: RenderedPlan) -> str:
    rows: list[tuple[str, ...]] = [("PARTITION", "KIND", "NODES", "SWITCHES/BLOCKS", "LARGEST LEAF/BLOCK", "WARNINGS")]
    for partition in sorted(rendered.plan.partitions, key=lambda p: p.partition):
        topology = partition.topology
        if isinstance(topology, TreeTopology):
            units = f"{len(topology.switches)} switches"
        elif isinstance(topology, BlockTopology):
            units = f"{len(topology.blocks)} blocks"
        else:
            units = "-"
        kind, written = partition.kind, rendered.plan.cluster_topology  # before 25.05: one cluster-wide topology
        largest = _largest_unit(partition, written if written is not None and written.kind is not kind else None)
        rows.append(
            (
                partition.partition,
                kind.value
                if written is None or written.kind is kind
                else f"{kind.value}, folded into {written.kind.value}",
                str(len(partition.nodes)),
                units,
                str(largest or "-"),
                str(len(partition.warnings)),
            )
        )
    lines = columns(rows)
    plan_ = rendered.plan
    lines.append(
        f"{plan_.cluster_name}: Slurm {plan_.slurm_version} -> {plan_.slurm_format.value}"
        + (f" ({plan_.topology_plugin})" if plan_.topology_plugin else "")
        + f", sha256 {rendered.sha256[:12]}"
    )
    lines.append(slurm_conf_edit(rendered))
    lines += [f"warning: {warning}" for warning in plan_.warnings]
    for partition in sorted(plan_.partitions, key=lambda p: p.partition):
        lines += [f"warning: {partition.partition}: {warning}" for warning in partition.warnings]
    return "\n".join(lines)


def slurm_conf_edit(rendered: RenderedPlan) -> str:
    """What the applier sets in slurm.conf: the plugin (before 25.05) and each partition's ``Topology=``."""
    edits = [f"TopologyPlugin={rendered.bundle.topology_plugin}"] if rendered.bundle.topology_plugin else []
    edits += [
        f"PartitionName={name} Topology={value}"
        if value
        else f"PartitionName={name} without Topology= (the cluster default)"
        for name, value in sorted(rendered.bundle.partitions.items())
    ]
    return "slurm.conf: " + ", ".join(edits)
