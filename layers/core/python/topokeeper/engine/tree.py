"""Nodes -> switch tree, named by EC2 network-node ids.

``NetworkNodes`` lists a node's network nodes top-down; the last one is the node's leaf switch. All
top-level network nodes hang under one synthetic root, because Slurm will not let a job span leaves
that have no common parent. Nodes without topology data stay schedulable under ``no-topology``.
Names come from ids and lists are sorted, so the same facts in any order give the same tree and one
more node changes only the lines it must.
"""

from __future__ import annotations

from collections.abc import Iterable
from itertools import pairwise

from topokeeper.domain.models import NO_TOPOLOGY_SWITCH, ROOT_SWITCH, Node, Switch, TreeTopology, assemble
from topokeeper.domain.names import MAX_SLURM_NAME_LENGTH


def _nodes_switch_name(switch: str) -> str:
    suffix = "-nodes"
    return switch[: MAX_SLURM_NAME_LENGTH - len(suffix)] + suffix


def _switch(name: str, switches: tuple[str, ...] = (), nodes: tuple[str, ...] = ()) -> Switch:
    # Every name here is a validated node's (its name, its network nodes) or a constant: no need to check again.
    return assemble(Switch, {"name": name, "switches": switches, "nodes": nodes})


def build_tree(name: str, nodes: Iterable[Node]) -> tuple[TreeTopology, tuple[str, ...], tuple[str, ...]]:
    """Return the tree, the nodes that lacked topology data, and warnings about inconsistent data."""
    warnings: list[str] = []
    leaf_nodes, parents, without_topology = _read_paths(nodes, warnings)
    parent_of = _single_parents(parents, warnings)
    children: dict[str, set[str]] = {}
    for switch, parent in parent_of.items():
        if parent is not None:
            children.setdefault(parent, set()).add(switch)

    # Slurm refuses a switch that has both child switches and nodes: move such nodes one level down.
    for switch in sorted(set(leaf_nodes) & set(children)):
        moved = _nodes_switch_name(switch)
        warnings.append(f"switch {switch} is both a leaf and a parent; its nodes moved under {moved}")
        leaf_nodes.setdefault(moved, set()).update(leaf_nodes.pop(switch))
        children[switch].add(moved)
        parent_of[moved] = switch

    top_level = sorted(switch for switch, parent in parent_of.items() if parent is None)
    if without_topology:
        top_level.append(NO_TOPOLOGY_SWITCH)
        leaf_nodes[NO_TOPOLOGY_SWITCH] = set(without_topology)

    switches = [_switch(ROOT_SWITCH, switches=tuple(top_level))]
    level = top_level
    while level:
        next_level: list[str] = []
        for switch in level:
            if switch in leaf_nodes:
                switches.append(_switch(switch, nodes=tuple(sorted(leaf_nodes[switch]))))
            else:
                below = sorted(children.get(switch, ()))
                switches.append(_switch(switch, switches=tuple(below)))
                next_level.extend(below)
        level = sorted(next_level)
    topology = TreeTopology.model_validate({"name": name, "switches": ()})  # checks the name
    topology = topology.model_copy(update={"switches": tuple(switches)})
    return topology, tuple(sorted(without_topology)), tuple(warnings)


def _read_paths(
    nodes: Iterable[Node], warnings: list[str]
) -> tuple[dict[str, set[str]], dict[str, set[str]], list[str]]:
    """Each leaf's nodes, each switch's parents (as the paths say), and the nodes without topology data."""
    leaf_nodes: dict[str, set[str]] = {}
    parents: dict[str, set[str]] = {}
    without_topology: list[str] = []
    known_paths: set[tuple[str, ...]] = set()  # the nodes of a leaf share one path: its switches are in already
    for node in nodes:
        path = node.network_nodes
        if path in known_paths:
            leaf_nodes[path[-1]].add(node.name)
            continue
        if not path:
            without_topology.append(node.name)
            continue
        if len(set(path)) != len(path):
            warnings.append(f"{node.name}: network nodes repeat ({','.join(path)}); used its leaf only")
            path = path[-1:]
        else:
            known_paths.add(path)
        leaf_nodes.setdefault(path[-1], set()).add(node.name)
        parents.setdefault(path[0], set())
        for upper, lower in pairwise(path):
            parents.setdefault(lower, set()).add(upper)
    return leaf_nodes, parents, without_topology


def _single_parents(parents: dict[str, set[str]], warnings: list[str]) -> dict[str, str | None]:
    """Give every switch at most one parent (first by name) and break any cycle the data implies."""
    parent_of: dict[str, str | None] = {}
    for switch in sorted(parents):
        candidates = sorted(parents[switch])
        if len(candidates) > 1:
            warnings.append(f"switch {switch} has several parents ({','.join(candidates)}); kept {candidates[0]}")
        parent_of[switch] = candidates[0] if candidates else None
    for switch in sorted(parent_of):
        seen = {switch}
        current = parent_of[switch]
        while current is not None:
            if current in seen:
                warnings.append(f"switch {switch} is part of a cycle; detached it to the top level")
                parent_of[switch] = None
                break
            seen.add(current)
            current = parent_of.get(current)
    return parent_of
