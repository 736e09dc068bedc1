"""The wire contract's incremental-apply rule (standard library only, Python 3.8+): whether, and by which
``scontrol update NodeName= Topology=`` batches, a slurmctld serving one topology.yaml reaches another.
headnode/incremental.py applies it, service/live_writes.py paces by it, and both sides read topokeeper's own
topology.yaml layout with ``parse_topology_yaml``. Like ``wire``, it imports only what Debian's python3-minimal
ships, and the wire itself.
"""

from __future__ import annotations

import re
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple

from topokeeper.wire import YAML_FORMAT, HostlistError, compress, expand, sample

FIRST_INCREMENTAL_VERSION = (25, 11)  # proven on 25.11.7 (built from source) and 26.05 (sid); 25.05 is not
AddedSwitches = Dict[str, Dict[str, Optional[str]]]  # {topology: {switch its updates create: its parent in the plan}}
Updates = Tuple[Optional[List[Tuple[str, str]]], str]  # ([(hostlist, Topology= value, "" for none)], "") or (None, why)


class ParsedTopology(NamedTuple):
    kind: str  # "tree", "block" or "flat"
    cluster_default: bool
    block_sizes: Tuple[int, ...]
    units: Dict[str, Tuple[List[str], List[str]]]  # switch or block -> (nodes, child switches), in file order


_LINES = [
    ("topology", re.compile(r"- topology: (\S+)$")),
    ("default", re.compile(r"  cluster_default: (true|false)$")),
    ("flat", re.compile(r"  flat: true$")),
    ("tree", re.compile(r"  tree:$")),
    ("switches", re.compile(r"    switches:$")),
    ("switch", re.compile(r"      - switch: (\S+)$")),
    ("children", re.compile(r"        children: (\S+)$")),
    ("nodes", re.compile(r"        nodes: (\S+)$")),
    ("block", re.compile(r"  block:$")),
    ("sizes", re.compile(r"    block_sizes:$")),
    ("size", re.compile(r"      - (\d+)$")),
    ("blocks", re.compile(r"    blocks:$")),
    ("unit", re.compile(r"      - block: (\S+)$")),
]


def parse_topology_yaml(text: str) -> Optional[Dict[str, ParsedTopology]]:
    """The topologies of a topology.yaml as topokeeper renders it (render/slurm_yaml.py), in file order; None
    for anything else (another writer's layout, a hand edit, a duplicate name): that file is reloaded whole."""
    found: Dict[str, ParsedTopology] = {}
    current: Optional[str] = None
    unit: Optional[str] = None
    for line in text.splitlines():
        if not line.strip() or line.startswith("#") or line == "---":
            continue
        matched = next(((key, m) for key, pattern in _LINES for m in [pattern.match(line)] if m), None)
        if matched is None:
            return None
        key, match = matched
        if key == "topology":
            current, unit = match.group(1), None
            if current in found:
                return None
            found[current] = ParsedTopology("", False, (), {})
            continue
        if current is None:
            return None
        entry = found[current]
        if key == "default":
            found[current] = entry._replace(cluster_default=match.group(1) == "true")
        elif key in ("flat", "tree", "block"):
            if entry.kind:
                return None
            found[current] = entry._replace(kind=key)
        elif key == "size":
            found[current] = entry._replace(block_sizes=(*entry.block_sizes, int(match.group(1))))
        elif key in ("switch", "unit"):
            unit = match.group(1)
            if unit in entry.units or entry.kind != ("tree" if key == "switch" else "block"):
                return None
            entry.units[unit] = ([], [])
        elif key in ("children", "nodes"):
            if unit is None:
                return None
            try:
                entry.units[unit][key == "children"].extend(expand(match.group(1)))
            except HostlistError:
                return None
    return found if all(entry.kind for entry in found.values()) else None


def _parents(units: Dict[str, Tuple[List[str], List[str]]]) -> Optional[Dict[str, Optional[str]]]:
    """{switch: its parent, None for a top switch}; None when a child is undefined or has two parents."""
    parents: Dict[str, Optional[str]] = {name: None for name in units}
    for name, (_, children) in units.items():
        for child in children:
            if child not in units or parents[child] is not None or child == name:
                return None
            parents[child] = name
    return parents


def switch_paths(units: Dict[str, Tuple[List[str], List[str]]]) -> Optional[Dict[str, str]]:
    """{node: "top:...:leaf"} of one tree; None when it is not a tree or a node is on two leaves."""
    parents = _parents(units)
    if parents is None:
        return None
    placed: Dict[str, str] = {}
    for name, (nodes, children) in units.items():
        if nodes and children:
            return None
        chain, at = [], name  # type: List[str], Optional[str]
        while at is not None:
            if len(chain) > len(units):
                return None  # a cycle
            chain.append(at)
            at = parents[at]
        for node in nodes:
            if node in placed:
                return None
            placed[node] = ":".join(reversed(chain))
    return placed


def _structure_problem(name: str, old: ParsedTopology, new: ParsedTopology, added: Dict[str, Optional[str]]) -> str:
    """Why the updates cannot turn ``old`` into ``new`` ("" when they can); the switches it adds go to ``added``."""
    if (old.kind, old.cluster_default) != (new.kind, new.cluster_default):
        return "topology %s changes its type or cluster_default" % name
    if old.kind == "block":
        if old.block_sizes != new.block_sizes:
            return "topology %s changes block_sizes" % name
        if list(old.units) != list(new.units):
            return "topology %s adds, removes or reorders blocks" % name
        return ""
    if old.kind != "tree":
        return ""
    old_parents, new_parents = _parents(old.units), _parents(new.units)
    if old_parents is None or new_parents is None:
        return "topology %s is not a tree" % name
    # A removed switch stays live, emptied, until a reconfigure (headnode/incremental.py): only below a kept top.
    tops = [switch for switch in old.units if switch not in new.units and old_parents[switch] is None]
    if tops:
        return "topology %s removes top switches (%s)" % (name, sample(tops))
    for switch in (switch for switch in old.units if switch in new.units):  # a kept one under a removed one moves
        if new_parents[switch] != old_parents[switch]:
            return "topology %s moves switch %s to another parent" % (name, switch)
        if bool(old.units[switch][1]) != bool(new.units[switch][1]):  # a leaf is level 0 live, a parent above
            return "topology %s turns switch %s between leaf and parent" % (name, switch)
    paths = switch_paths(new.units) or {}
    for switch in set(new.units) - set(old.units):
        if new_parents[switch] is None:
            return "topology %s adds a top switch (%s)" % (name, switch)
        if not any((":%s:" % switch) in (":%s:" % path) for path in paths.values()):
            return "topology %s adds switch %s with no node under it" % (name, switch)
        added[switch] = new_parents[switch]
    return ""


def placements_by_node(topologies: Dict[str, ParsedTopology]) -> Optional[Dict[str, str]]:
    """{node: its whole Topology= value}, topologies in file order; flat ones hold no placement."""
    parts: Dict[str, List[str]] = {}
    for name, topology in topologies.items():
        if topology.kind == "tree":
            paths = switch_paths(topology.units)
        else:  # blocks (a flat topology has no units); None when a node is in two
            paths = {node: block for block, (nodes, _) in topology.units.items() for node in nodes}
            paths = paths if len(paths) == sum(len(nodes) for nodes, _ in topology.units.values()) else None
        if paths is None:
            return None
        for node, path in paths.items():
            parts.setdefault(node, []).append("%s:%s" % (name, path))
    return {node: ",".join(values) for node, values in parts.items()}


def plan_updates(old_text: Optional[str], new_text: str, *, added: Optional[AddedSwitches] = None) -> Updates:
    """The updates (one per destination, sorted) bringing a slurmctld serving ``old_text`` to ``new_text``, and in
    ``added`` (if given) the switches they create, which slurmctld may still keep elsewhere (headnode/incremental)."""
    if old_text is None:
        return None, "no topology.yaml yet"
    old, new = parse_topology_yaml(old_text), parse_topology_yaml(new_text)
    if old is None or new is None:
        return None, "%s is not in the layout topokeeper writes" % ("the current file" if old is None else "the plan")
    if list(old) != list(new):
        return None, "the topologies or their order change"
    for name in old:
        problem = _structure_problem(name, old[name], new[name], {} if added is None else added.setdefault(name, {}))
        if problem:
            return None, problem
    before, after = placements_by_node(old), placements_by_node(new)
    if before is None or after is None:
        return None, "a node is in two switches or blocks of one topology"
    batches: Dict[str, List[str]] = {}
    for node in sorted(set(before) | set(after)):
        if before.get(node, "") != after.get(node, ""):
            batches.setdefault(after.get(node, ""), []).append(node)
    return sorted((compress(nodes), value) for value, nodes in batches.items()), ""


def eligibility(
    version: Tuple[int, int, int],
    slurm_format: str,
    other_changes: Sequence[str],
    old_text: Optional[str],
    new: str,
    *,
    added: Optional[AddedSwitches] = None,
) -> Updates:
    """plan_updates, after what the files alone do not say: the Slurm version and format, slurm.conf changes."""
    if slurm_format != YAML_FORMAT:
        return None, "%s is loaded by reconfigure only" % slurm_format
    if tuple(version[:2]) < FIRST_INCREMENTAL_VERSION:
        return None, "live topology updates are proven from Slurm %d.%02d only" % FIRST_INCREMENTAL_VERSION
    if other_changes:
        return None, "%s changes too" % ", ".join(other_changes)
    return plan_updates(old_text, new, added=added)
