"""Bringing the live topology to a new topology.yaml without a reconfigure, where Slurm allows it.

Slurm >= 25.05 moves a node live with ``scontrol update NodeName=<hostlist> Topology=<t>:<path>,<t2>:<block>``:
the value is the node's whole placement (every topology it is in; a topology left out drops the node from it,
src/interfaces/topology.c), tree paths are written from the top switch down and create missing switches
under an existing one, and a block must exist (refused otherwise since 25.11). Proven on 25.11 and 26.05 in
the project's chroots, so only from 25.11. Anything the updates cannot express (a new topology or block, a
changed block order or block_sizes, a removed or re-parented switch, a file this parser does not read)
takes the whole-file path with reconfigure.
"""

from __future__ import annotations

import re
import time
from typing import (
    Callable,
    Dict,
    List,
    NamedTuple,
    Optional,
    Sequence,
    Tuple,
)

from topokeeper.headnode.failures import Failed, sample
from topokeeper.headnode.scontrol import Scontrol
from topokeeper.wire import RECONFIGURE_TIMEOUT, YAML_FORMAT, HostlistError, compress, expand, one_line

FIRST_INCREMENTAL_VERSION = (25, 11)  # proven on 25.11.7 (built from source) and 26.05 (sid); 25.05 is not


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


def _paths(units: Dict[str, Tuple[List[str], List[str]]]) -> Optional[Dict[str, str]]:
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


def _structure_problem(name: str, old: ParsedTopology, new: ParsedTopology) -> str:
    """Why the updates cannot turn ``old`` into ``new`` ("" when they can)."""
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
    removed = sorted(set(old.units) - set(new.units))
    if removed:
        return "topology %s removes switches (%s)" % (name, sample(removed))
    for switch in old.units:
        if new_parents[switch] != old_parents[switch]:
            return "topology %s moves switch %s to another parent" % (name, switch)
        if bool(old.units[switch][1]) != bool(new.units[switch][1]):  # a leaf is level 0 live, a parent above
            return "topology %s turns switch %s between leaf and parent" % (name, switch)
    paths = _paths(new.units) or {}
    for switch in set(new.units) - set(old.units):
        if new_parents[switch] is None:
            return "topology %s adds a top switch (%s)" % (name, switch)
        if not any((":%s:" % switch) in (":%s:" % path) for path in paths.values()):
            return "topology %s adds switch %s with no node under it" % (name, switch)
    return ""


def _placements(topologies: Dict[str, ParsedTopology]) -> Optional[Dict[str, str]]:
    """{node: its whole Topology= value}, topologies in file order; flat ones hold no placement."""
    parts: Dict[str, List[str]] = {}
    for name, topology in topologies.items():
        if topology.kind == "tree":
            paths = _paths(topology.units)
            if paths is None:
                return None
        elif topology.kind == "block":
            paths = {}
            for block, (nodes, _) in topology.units.items():
                for node in nodes:
                    if node in paths:
                        return None
                    paths[node] = block
        else:
            continue
        for node, path in paths.items():
            parts.setdefault(node, []).append("%s:%s" % (name, path))
    return {node: ",".join(values) for node, values in parts.items()}


def plan_updates(old_text: Optional[str], new_text: str) -> Tuple[Optional[List[Tuple[str, str]]], str]:
    """([(hostlist, Topology= value)] one batch per destination, sorted; "") when updates can bring a slurmctld
    serving ``old_text`` to ``new_text``, else (None, why not). A value "" takes a node out of every topology."""
    if old_text is None:
        return None, "no topology.yaml yet"
    old, new = parse_topology_yaml(old_text), parse_topology_yaml(new_text)
    if old is None or new is None:
        return None, "%s is not in the layout topokeeper writes" % ("the current file" if old is None else "the plan")
    if list(old) != list(new):
        return None, "the topologies or their order change"
    for name in old:
        problem = _structure_problem(name, old[name], new[name])
        if problem:
            return None, problem
    before, after = _placements(old), _placements(new)
    if before is None or after is None:
        return None, "a node is in two switches or blocks of one topology"
    batches: Dict[str, List[str]] = {}
    for node in sorted(set(before) | set(after)):
        if before.get(node, "") != after.get(node, ""):
            batches.setdefault(after.get(node, ""), []).append(node)
    return sorted((compress(nodes), value) for value, nodes in batches.items()), ""


def eligibility(
    version: Tuple[int, int, int], slurm_format: str, other_changes: Sequence[str], old_text: Optional[str], new: str
) -> Tuple[Optional[List[Tuple[str, str]]], str]:
    """plan_updates, after what the files alone do not say: the Slurm version and format, slurm.conf changes."""
    if slurm_format != YAML_FORMAT:
        return None, "%s is loaded by reconfigure only" % slurm_format
    if tuple(version[:2]) < FIRST_INCREMENTAL_VERSION:
        return None, "live topology updates are proven from Slurm %d.%02d only" % FIRST_INCREMENTAL_VERSION
    if other_changes:
        return None, "%s changes too" % ", ".join(other_changes)
    return plan_updates(old_text, new)


def update_live(
    scontrol: Scontrol, batches: Sequence[Tuple[str, str]], result: Dict[str, object], crash: Callable[[str], None]
) -> bool:
    """Run one ``scontrol update`` per batch (an argv, no shell); False at the first refusal, said in
    result["whole_file_reason"]. result["nodes_updated"] counts the nodes of the batches slurmctld accepted."""
    done = 0
    for index, (hostlist, value) in enumerate(batches):
        if scontrol.deadline is not None and scontrol.deadline - time.monotonic() < 2 * RECONFIGURE_TIMEOUT:
            # The fallback's reconfigure, and a rollback after it, keep their share of the budget.
            result["whole_file_reason"] = "too little of the time budget left for %d more live update(s)" % (
                len(batches) - index
            )
            return False
        try:
            run = scontrol.run("update", "NodeName=%s" % hostlist, "Topology=%s" % value)
        except Failed as error:  # a timeout: the reconfigure still loads the files
            result["whole_file_reason"] = str(error)
            return False
        if run.returncode != 0:
            why = one_line(run.stderr or run.stdout) or "exit %d" % run.returncode
            result["whole_file_reason"] = "scontrol update NodeName=%s Topology=%s: %s" % (hostlist, value, why)
            return False
        done += len(expand(hostlist))
        result["nodes_updated"] = done
        crash("after-update:%d" % index)
    return True
