"""Read-back: the live topologies compared with the bundle by name and by grouping, whatever the names."""

from __future__ import annotations

import re
from typing import (
    Any,
    Dict,
    FrozenSet,
    Iterable,
    List,
    Mapping,
    Optional,
    Sequence,
    Set,
    Tuple,
)

from topokeeper.headnode.bundle import Bundle, ExpectedUnit
from topokeeper.headnode.failures import shown_value
from topokeeper.headnode.scontrol import LiveTopologies
from topokeeper.wire import CONF_FORMAT, YAML_FORMAT, sample
from topokeeper.wire_updates import parse_topology_yaml


def _difference(expected: Sequence[str], live: Sequence[str]) -> str:
    missing, extra = sorted(set(expected) - set(live)), sorted(set(live) - set(expected))
    parts = []
    if missing:
        parts.append("%d missing (%s)" % (len(missing), sample(missing)))
    if extra:
        parts.append("%d not in the plan (%s)" % (len(extra), sample(extra)))
    return ", ".join(parts)


def emptied_switches(expected: Mapping[str, ExpectedUnit], live: Mapping[str, Mapping[str, object]]) -> Set[str]:
    """The live switches the plan lacks that hold no node, nor does any switch below them: not drift.

    Slurm deletes no switch at run time. ``scontrol update NodeName= Topology=`` only clears the node's bit in its
    old leaf and the switches above it (src/plugins/topology/tree/topology_tree.c, topology_p_add_rm_node); the
    switch table is rebuilt only from the file, at a reconfigure or restart. So a switch whose last nodes an
    incremental apply moved out stays listed (``Nodes=`` empty, in its parent's ``Switches=``) until then, and
    holds no job (checked on 25.11.7 and 26.05.5). One that holds a node is drift."""
    empty = {
        name
        for name, unit in live.items()
        if unit["kind"] == "switch" and name not in expected and not _unit_names(unit, "nodes")
    }
    while True:
        below_empty = {name for name in empty if set(_unit_names(live[name], "switches")) <= empty}
        if below_empty == empty:
            return empty
        empty = below_empty


def compare_units(expected: Mapping[str, ExpectedUnit], live: Mapping[str, Mapping[str, object]]) -> List[str]:
    """Differences between the plan and ``scontrol show topology``: leaf switches and blocks by their
    nodes, upper switches by their child switches (Slurm also lists every node below them). Switches an
    incremental apply emptied are passed over (``emptied_switches``)."""
    emptied = emptied_switches(expected, live)
    problems = ["%s %s: missing" % (expected[name].kind, name) for name in sorted(set(expected) - set(live))]
    extra = sorted(set(live) - set(expected) - emptied)
    problems += ["%s %s: not in the plan" % (live[name]["kind"], name) for name in extra]
    for name in sorted(set(expected) & set(live)):
        want, have = expected[name], live[name]
        if want.kind != have["kind"]:
            problems.append("%s: a %s in the plan, a %s live" % (name, want.kind, have["kind"]))
            continue
        field = "switches" if want.kind == "switch" and want.switches else "nodes"
        wanted = want.switches if field == "switches" else want.nodes
        # An emptied one is passed over, unless the plan lists it (its planned nodes set aside: cloud.py).
        found = [item for item in _unit_names(have, field) if field == "nodes" or item in wanted or item not in emptied]
        difference = _difference(wanted, found)
        if difference:
            problems.append("%s %s: %s %s" % (want.kind, name, field, difference))
    return problems


def moved_nodes(
    expected: Mapping[str, ExpectedUnit], live: Mapping[str, Mapping[str, object]]
) -> List[Dict[str, Optional[str]]]:
    """The planned nodes whose live leaf switch or block is not the planned one: {node, planned, live}
    (live None: in no live leaf). Upper switches list every node below them, so only leaves count."""
    planned = {node: name for name, unit in expected.items() if not unit.switches for node in unit.nodes}
    found: Dict[str, str] = {}
    for name in sorted(live):
        unit = live[name]
        nodes, switches = unit.get("nodes"), unit.get("switches")
        if isinstance(nodes, list) and not switches:
            for node in nodes:
                found.setdefault(str(node), name)
    return [
        {"node": node, "planned": planned[node], "live": found.get(node)}
        for node in sorted(planned)
        if found.get(node) != planned[node]
    ]


def read_back(
    bundle: Bundle, topologies: LiveTopologies, partitions: Mapping[str, Optional[str]]
) -> Tuple[Dict[str, Dict[str, Any]], List[Dict[str, str]]]:
    """Live topologies and partitions compared with the bundle by name: (readback, drift). A readback
    entry lists the nodes whose live leaf or block is not the planned one (``moved``)."""
    readback: Dict[str, Dict[str, Any]] = {}
    drift: List[Dict[str, str]] = []
    for name, expected in sorted(bundle.topologies.items()):
        # Slurm < 25.05 has one unnamed topology; a name there would be read as a switch name.
        live = topologies.get(None if bundle.slurm_format == CONF_FORMAT else name)
        problems = [live.error] if live.error else compare_units(expected, live.units)
        readback[name] = {"units": len(live.units), "matches": not problems, "mismatches": problems}
        if problems and not live.error:
            readback[name]["moved"] = moved_nodes(expected, live.units)
        if problems:
            detail = "%d mismatch(es): %s" % (len(problems), problems[0])
            drift.append({"what": "topology", "name": name, "detail": detail})
    for name, value in sorted(bundle.partitions.items()):
        if name not in partitions:
            drift.append({"what": "partition", "name": name, "detail": "not known to slurmctld"})
        elif partitions[name] != value:
            detail = "slurmctld has Topology=%s, the plan %s" % (shown_value(partitions[name]), shown_value(value))
            drift.append({"what": "partition", "name": name, "detail": detail})
    return readback, drift


def _unit_names(unit: Mapping[str, object], field: str) -> List[str]:
    value = unit.get(field)
    return [str(item) for item in value] if isinstance(value, list) else []


def _topology_kind(kinds: Iterable[str]) -> str:
    """A topology's kind from its units' kinds: tree, block, or flat (neither switches nor blocks)."""
    found = set(kinds)
    return "tree" if "switch" in found else "block" if "block" in found else "flat"


def _live_units(live: Mapping[str, Mapping[str, object]], kind: str) -> Dict[str, FrozenSet[str]]:
    """Node sets of the live leaves (Level=0, or no child switches) or of the live plain blocks."""
    if kind == "tree":
        return {
            name: frozenset(_unit_names(unit, "nodes"))
            for name, unit in live.items()
            if unit["kind"] == "switch" and (unit.get("level") == 0 or not _unit_names(unit, "switches"))
        }
    return {name: frozenset(_unit_names(unit, "nodes")) for name, unit in live.items() if unit["kind"] == "block"}


def _within(units: Mapping[str, FrozenSet[str]], nodes: FrozenSet[str]) -> Dict[str, FrozenSet[str]]:
    """The units restricted to ``nodes``, empty ones dropped: a shared topology also holds other
    partitions' nodes, and a partition's jobs only see its own."""
    return {name: members & nodes for name, members in units.items() if members & nodes}


def _have_common_top(live: Mapping[str, Mapping[str, object]], leaves: Iterable[str]) -> bool:
    """Whether one switch reaches all ``leaves`` (itself included): Slurm runs no job across leaves without one."""
    parents: Dict[str, List[str]] = {}
    for name, unit in live.items():
        for child in _unit_names(unit, "switches"):
            parents.setdefault(child, []).append(name)
    common: Optional[Set[str]] = None
    for leaf in leaves:
        reached, pending = {leaf}, [leaf]
        while pending:
            for parent in parents.get(pending.pop(), []):
                if parent not in reached:
                    reached.add(parent)
                    pending.append(parent)
        common = reached if common is None else common & reached
    return common is None or bool(common)


def _node_sets(sets: Iterable[FrozenSet[str]], limit: int = 3) -> str:
    shown = sorted(sorted(members) for members in sets)
    return "; ".join("[%s]" % sample(members) for members in shown[:limit]) + ("; ..." if len(shown) > limit else "")


def compare_grouping(
    expected: Mapping[str, ExpectedUnit], base_block_size: Optional[int], live: Mapping[str, Mapping[str, object]]
) -> List[str]:
    """How the live topology groups the plan's nodes differently from the plan ([] when it groups them alike).

    Tree: the same leaf node-sets, all under one common top switch; block: the same block node-sets
    and the same base block size. Switch, block and topology names and the levels in between do not
    count, and live nodes outside the plan's are left out (another partition's, in a shared topology).
    """
    planned_kind = _topology_kind(unit.kind for unit in expected.values())
    live_kind = _topology_kind(str(unit["kind"]) for unit in live.values())
    if live_kind != planned_kind:
        return ["a %s topology live, a %s in the plan" % (live_kind, planned_kind)]
    noun, nouns = ("leaf", "leaves") if planned_kind == "tree" else ("block", "blocks")
    planned = {frozenset(unit.nodes) for unit in expected.values() if unit.nodes and not unit.switches}
    nodes = frozenset(node for members in planned for node in members)
    found = _within(_live_units(live, live_kind), nodes)
    problems = []
    outside = sorted(nodes.difference(*found.values()))
    if outside:
        problems.append("%d planned node(s) in no live %s (%s)" % (len(outside), noun, sample(outside)))
    missing, extra = planned - set(found.values()), set(found.values()) - planned
    if missing:
        problems.append("%d planned %s not live: %s" % (len(missing), nouns, _node_sets(missing)))
    if extra:
        problems.append("%d live %s not planned: %s" % (len(extra), nouns, _node_sets(extra)))
    if planned_kind == "tree" and not _have_common_top(live, found):
        problems.append("no live switch reaches all %d leaves: jobs cannot span them" % len(found))
    if planned_kind == "block" and base_block_size is not None:
        live_size = next((unit.get("size") for unit in live.values() if unit["kind"] == "block"), None)
        if live_size != base_block_size:
            problems.append("base block size %s live, %d in the plan" % (live_size, base_block_size))
    return problems


def flat_constraints(nodes: Sequence[str], live: Mapping[str, Mapping[str, object]]) -> List[str]:
    """Why the live topology keeps jobs of a partition the plan leaves flat from using any of its nodes
    together ([] when it does not).

    Slurm 26.05 (checked in the chroot) never runs a multi-node job on nodes in no leaf, nor across
    leaves without a common top switch; a block topology places a job inside one block (or blocks it
    aggregates). A tree that only orders the nodes by proximity is a preference, not a constraint, and
    a one-node partition runs one-node jobs only, which any topology allows.
    """
    kind = _topology_kind(str(unit["kind"]) for unit in live.values())
    members = frozenset(nodes)
    if kind == "flat" or len(members) < 2:
        return []
    noun = "leaf" if kind == "tree" else "block"
    found = _within(_live_units(live, kind), members)
    problems = []
    outside = sorted(members.difference(*found.values()))
    if outside:
        problems.append("%d of the flat partition's node(s) in no live %s (%s)" % (len(outside), noun, sample(outside)))
    if kind == "tree" and not _have_common_top(live, found):
        problems.append("no live switch reaches all %d leaves holding the flat partition's nodes" % len(found))
    if kind == "block" and len(found) > 1:
        problems.append("the flat partition's nodes are split over %d live blocks" % len(found))
    return problems


def planned_base_block_sizes(bundle: Bundle) -> Dict[str, int]:
    """{topology: base block size} from the bundle's own topology file, the only place a bundle states it:
    the first ``block_sizes`` item of each topology.yaml entry, or ``BlockSizes=`` in topology.conf."""
    text = bundle.files[bundle.slurm_format]
    if bundle.slurm_format == CONF_FORMAT:
        match = re.search(r"^BlockSizes=(\d+)", text, re.MULTILINE)
        return {name: int(match.group(1)) for name in bundle.topologies} if match else {}
    parsed = parse_topology_yaml(text) or {}  # the renderer's layout; another states nothing checkable
    return {name: topology.block_sizes[0] for name, topology in parsed.items() if topology.block_sizes}


def _live_source(bundle: Bundle, used: Optional[str]) -> str:
    if used:
        return "Topology=%s" % used
    return "the cluster default" if bundle.slurm_format == YAML_FORMAT else "the cluster-wide topology"


def grouping_drift(
    bundle: Bundle,
    topologies: LiveTopologies,
    partitions: Mapping[str, Optional[str]],
    partition_members: Mapping[str, List[str]],
) -> Tuple[List[Dict[str, str]], Set[str]]:
    """The live grouping compared with the plan's: (grouping drift entries, partitions whose grouping differs).

    topology.yaml: per bundle partition, the topology it uses live (its Topology=, else the cluster
    default). topology.conf: the one cluster-wide topology, or, when the plan has none, every
    partition as flat.
    """
    entries: List[Dict[str, str]] = []
    differing: Set[str] = set()

    def differs(name: str, detail: str, affected: Iterable[str]) -> None:
        entries.append({"what": "grouping", "name": name, "detail": detail, "kind": "grouping"})
        differing.update(affected)

    sizes = planned_base_block_sizes(bundle)
    for name in sorted(set(bundle.partitions) - set(partitions)):
        differs(name, "not known to slurmctld", [name])
    if bundle.slurm_format == CONF_FORMAT and bundle.topologies:
        live = topologies.get(None)
        for name, expected in sorted(bundle.topologies.items()):
            problems = [live.error] if live.error else compare_grouping(expected, sizes.get(name), live.units)
            if problems:
                differs(name, "the cluster-wide topology: %s" % "; ".join(problems), bundle.partitions)
        return entries, differing
    for name, assignment in sorted(bundle.partitions.items()):
        if name not in partitions:
            continue
        used = partitions[name] if bundle.slurm_format == YAML_FORMAT else None
        live = topologies.get(used)
        expected = bundle.topologies.get(assignment, {}) if assignment else {}
        if live.error:
            problems = [live.error]
        elif assignment and expected:
            problems = compare_grouping(expected, sizes.get(assignment), live.units)
        else:
            problems = flat_constraints(partition_members.get(name, []), live.units)
        if problems:
            differs(name, "%s: %s" % (_live_source(bundle, used), "; ".join(problems)), [name])
    return entries, differing


def with_kinds(entries: Sequence[Dict[str, str]], bundle: Bundle, differing: Set[str]) -> List[Dict[str, str]]:
    """Name-based entries with their kind: "grouping" when a partition they concern groups its nodes
    differently live, else "naming" (names or text differ, the grouping is the same)."""
    assigned: Dict[str, Set[str]] = {}
    for partition, topology in bundle.partitions.items():
        if topology is not None:
            assigned.setdefault(topology, set()).add(partition)
    kinds = []
    for entry in entries:
        if entry["what"] == "partition":
            concerned = {entry["name"]}
        elif entry["what"] == "topology" and bundle.slurm_format == YAML_FORMAT:
            concerned = assigned.get(entry["name"], set())
        else:  # the file, the plugin, and before 25.05 the one topology: every partition
            concerned = set(bundle.partitions)
        kinds.append(dict(entry, kind="grouping" if concerned & differing else "naming"))
    return kinds
