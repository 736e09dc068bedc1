"""Powered-up CLOUD nodes, which a reconfigure does not place: they are re-placed live after each one.

Slurm (src/slurmctld/node_mgr.c, "Preserve dynamic topology for cloud nodes") keeps the topology that
``scontrol update NodeName=.. Topology=..`` gave a CLOUD node over the files across a reconfigure or a restart,
unless the node is powering down or powered down; at power-down (power_save.c, ``reset_node_topology``) it goes
back to its slurm.conf ``Topology=`` or to where it was before its first update, not to the current file. Only
such a node prints ``Topology=`` in ``scontrol show node`` (checked on 26.05.5): a node the files place prints none.
"""

from __future__ import annotations

import re
from typing import Any, Callable, Dict, FrozenSet, List, Mapping, Optional, Tuple

from topokeeper.headnode.bundle import Bundle, ExpectedUnit
from topokeeper.headnode.grouping import moved_nodes
from topokeeper.headnode.incremental import update_live
from topokeeper.headnode.scontrol import LiveTopologies, LiveTopology, Scontrol
from topokeeper.wire import UNREGISTERED_FLAGS, compress
from topokeeper.wire_updates import parse_topology_yaml, placements_by_node

_FIELDS = re.compile(r"(?:^|\s)(NodeName|State|Topology)=(\S*)")
POWERED_OFF = ("POWERED_DOWN", "POWERING_DOWN")  # Slurm resets these to their configured topology


def cloud_nodes(show_nodes: str) -> Dict[str, Tuple[bool, Optional[str]]]:
    """``scontrol -o show nodes`` -> {CLOUD node: (powered up, its dynamic Topology= or None when it has none)}."""
    found: Dict[str, Tuple[bool, Optional[str]]] = {}
    for line in show_nodes.splitlines():
        fields: Dict[str, str] = {}
        for key, value in _FIELDS.findall(line):
            # NodeName= and State= come first, free text (Reason=, Comment=, Extra=) later, Topology= last.
            fields[key] = value if key == "Topology" else fields.get(key, value)
        flags = fields.get("State", "").split("+")
        if fields.get("NodeName") and "CLOUD" in flags:
            powered_up = not any(flag in POWERED_OFF for flag in flags)
            found[fields["NodeName"]] = (powered_up, fields.get("Topology"))
    return found


def unregistered(show_nodes: str) -> FrozenSet[str]:
    """The CLOUD nodes whose slurmd has not registered since slurmctld resumed them, or that are powered down."""
    found = set()
    for line in show_nodes.splitlines():
        fields: Dict[str, str] = {}
        for key, value in _FIELDS.findall(line):
            fields.setdefault(key, value)  # the node's own, before any free text
        flags = fields.get("State", "").split("+")
        if fields.get("NodeName") and "CLOUD" in flags and any(flag in UNREGISTERED_FLAGS for flag in flags):
            found.add(fields["NodeName"])
    return frozenset(found)


def _same(live: str, planned: str) -> bool:
    return sorted(filter(None, live.split(","))) == sorted(filter(None, planned.split(",")))


def stray_batches(show_nodes: str, topology_yaml: str) -> List[Tuple[str, str]]:
    """[(hostlist, Topology= value)], one per destination: the powered-up CLOUD nodes whose dynamic topology is
    not where ``topology_yaml`` places them ([] for a file this parser does not read: a reconfigure placed it)."""
    parsed = parse_topology_yaml(topology_yaml)
    placements = placements_by_node(parsed) if parsed is not None else None
    if placements is None:
        return []
    batches: Dict[str, List[str]] = {}
    for name, (powered_up, live) in sorted(cloud_nodes(show_nodes).items()):
        planned = placements.get(name, "")
        if powered_up and live is not None and not _same(live, planned):
            batches.setdefault(planned, []).append(name)
    return sorted((compress(nodes), value) for value, nodes in batches.items())


def place_cloud_nodes(
    scontrol: Scontrol, topology_yaml: str, result: Dict[str, Any], crash: Callable[[str], None]
) -> str:
    """After a reconfigure: put every powered-up CLOUD node whose dynamic topology differs from the file where
    the file says, adding them to result["nodes_updated"]; "" or why an update failed (the read-back shows it)."""
    batches = stray_batches(scontrol.output("-o", "--future", "show", "nodes"), topology_yaml)
    if not batches:
        return ""
    done: Dict[str, Any] = {"nodes_updated": 0}  # its own count: an incremental attempt's is kept
    placed = update_live(scontrol, batches, done, lambda point: crash("cloud-" + point))
    result["nodes_updated"] += done["nodes_updated"]
    return "" if placed else "re-placing powered-up CLOUD nodes: %s" % done.get("whole_file_reason")


# -- what verify expects of powered-down CLOUD nodes ----------------------------------------------------------


def _without(units: Mapping[str, Any], nodes: FrozenSet[str], prune: bool = False) -> Dict[str, Any]:
    """``units`` (planned ExpectedUnits or live dicts) without ``nodes``; a planned unit (or live block) that held
    only them goes too, and with ``prune`` a live switch, its place in its switch and a switch left with nothing (a
    leaf no update ever created: nodes left to registration). Without it a planned leaf slurmctld lacks stays drift:
    the file was not loaded; and a live switch stays, empty, read as one an incremental apply emptied
    (grouping.emptied_switches): a powered-down node goes back into one (its first place, re-read only at a
    reconfigure)."""
    kept: Dict[str, Any] = {}
    for name, unit in units.items():
        planned = isinstance(unit, ExpectedUnit)
        members = [str(node) for node in (unit.nodes if planned else unit.get("nodes") or [])]
        left = [node for node in members if node not in nodes]
        if members and not left and (planned or prune or unit.get("kind") != "switch"):  # no block is kept emptied
            continue
        kept[name] = unit._replace(nodes=left) if planned else dict(unit, nodes=left)
    gone = set(units) - set(kept) if prune else set()
    while gone:  # a leaf that held only them went: so does it from its switch, and a switch left with nothing
        emptied = set()
        for name, unit in kept.items():
            planned = isinstance(unit, ExpectedUnit)
            children = list(unit.switches if planned else unit.get("switches") or [])
            if not set(children) & gone:
                continue
            children = [child for child in children if child not in gone]
            kept[name] = unit._replace(switches=children) if planned else dict(unit, switches=children)
            if not children and not (unit.nodes if planned else unit.get("nodes")):
                emptied.add(name)
        for name in emptied:
            del kept[name]
        gone = emptied
    return kept


class WithoutNodes(LiveTopologies):
    """The live topologies as if ``nodes`` were in none of them."""

    def __init__(self, live: LiveTopologies, nodes: FrozenSet[str], prune: bool = False) -> None:
        super().__init__(live.scontrol)
        self.live, self.nodes, self.prune = live, nodes, prune

    def get(self, name: Optional[str]) -> LiveTopology:
        found = self.live.get(name)
        return LiveTopology(_without(found.units, self.nodes, self.prune), found.error)


def set_aside_powered_down(
    bundle: Bundle, topologies: LiveTopologies, show_nodes: str
) -> Tuple[Bundle, LiveTopologies, Dict[str, List[str]]]:
    """(bundle, live topologies) without the powered-down or powering-down CLOUD nodes that a live leaf or block
    holds other than the plan's (or that the plan places nowhere), and {topology: those nodes}. Such a node runs
    no job, Slurm puts it back on its configured or original topology, not the file's, and the reconcile its
    resume triggers places it: it is not drift."""
    down = frozenset(name for name, (powered_up, _) in cloud_nodes(show_nodes).items() if not powered_up)
    aside: Dict[str, List[str]] = {}
    for name, expected in sorted(bundle.topologies.items()):
        live = topologies.get(name)
        if live.error or not down:
            continue
        planned = {node for unit in expected.values() if not unit.switches for node in unit.nodes}
        found = {node for unit in _without(live.units, frozenset()).values() for node in unit["nodes"]}
        # In another leaf or block, or in one the plan does not give it; a planned node in none stays drift.
        moved = {str(entry["node"]) for entry in moved_nodes(expected, live.units) if entry["live"] is not None}
        off = moved | (found - planned)
        if off & down:
            aside[name] = sorted(off & down)
    if not aside:
        return bundle, topologies, {}
    bundle, topologies = without_nodes(bundle, topologies, frozenset(n for names in aside.values() for n in names))
    return bundle, topologies, aside


def without_nodes(
    bundle: Bundle, topologies: LiveTopologies, nodes: FrozenSet[str], prune: bool = False
) -> Tuple[Bundle, LiveTopologies]:
    """(bundle, live topologies) as if ``nodes`` were in none of their topologies: compared without them."""
    stripped = {name: _without(units, nodes, prune) for name, units in bundle.topologies.items()}
    return bundle._replace(topologies=stripped), WithoutNodes(topologies, nodes, prune)
