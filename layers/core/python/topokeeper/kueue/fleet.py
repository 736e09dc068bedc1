"""Which nodes share which network layer: domains per layer with their sizes, UltraServers, a table, Mermaid, JSON.

A domain is one network node at one layer; its size is the number of nodes below it, so the largest
layer-3 domain is the largest job that a required layer-3 topology can ever admit.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from topokeeper.domain.models import MAX_NETWORK_LAYERS, Node
from topokeeper.kueue.node_list import layer_label

_TABLE_MEMBERS = 3


@dataclass(frozen=True)
class Domain:
    layer: int
    network_node: str
    parent: str | None
    nodes: tuple[str, ...]
    instance_types: tuple[str, ...]

    @property
    def size(self) -> int:
        return len(self.nodes)


@dataclass(frozen=True)
class UltraServer:
    ultraserver_id: str
    nodes: tuple[str, ...]
    layer3_domains: tuple[str, ...]  # the layer-3 network nodes its members hang off


@dataclass(frozen=True)
class FleetLayers:
    domains: tuple[Domain, ...]  # by layer, then network node
    ultraservers: tuple[UltraServer, ...]
    nodes_without_topology: tuple[str, ...]
    node_count: int

    def layer(self, layer: int) -> tuple[Domain, ...]:
        return tuple(domain for domain in self.domains if domain.layer == layer)

    def largest(self, layer: int) -> int:
        return max((domain.size for domain in self.layer(layer)), default=0)

    @property
    def depth(self) -> int:
        return max((domain.layer for domain in self.domains), default=0)

    @property
    def ultraservers_inside_one_layer3_domain(self) -> bool:
        return all(len(server.layer3_domains) == 1 for server in self.ultraservers)


def fleet_layers(nodes: Iterable[Node]) -> FleetLayers:
    """Group the nodes by the network node they hang off at each layer (one pass; fine at 10,000 nodes)."""
    members: dict[tuple[int, str], list[str]] = defaultdict(list)
    types: dict[tuple[int, str], set[str]] = defaultdict(set)
    parents: dict[tuple[int, str], str | None] = {}
    servers: dict[str, list[Node]] = defaultdict(list)
    without: list[str] = []
    count = 0
    for node in nodes:
        count += 1
        if not node.network_nodes:
            without.append(node.name)
        for index, network_node in enumerate(node.network_nodes):
            key = (index + 1, network_node)
            members[key].append(node.name)
            if node.instance_type:
                types[key].add(node.instance_type)
            parents.setdefault(key, node.network_nodes[index - 1] if index else None)
        if node.ultraserver_id:
            servers[node.ultraserver_id].append(node)
    domains = tuple(
        Domain(key[0], key[1], parents[key], tuple(sorted(names)), tuple(sorted(types[key])))
        for key, names in sorted(members.items())
    )
    ultraservers = tuple(
        UltraServer(
            server_id,
            tuple(sorted(node.name for node in server_nodes)),
            tuple(sorted({node.network_nodes[2] if len(node.network_nodes) >= 3 else "" for node in server_nodes})),
        )
        for server_id, server_nodes in sorted(servers.items())
    )
    return FleetLayers(domains, ultraservers, tuple(sorted(without)), count)


def _members(names: tuple[str, ...]) -> str:
    shown = ", ".join(names[:_TABLE_MEMBERS])
    return shown + (f" (+{len(names) - _TABLE_MEMBERS})" if len(names) > _TABLE_MEMBERS else "")


def render_table(fleet: FleetLayers) -> str:
    rows = [("LAYER", "DOMAIN", "PARENT", "NODES", "TYPES", "MEMBERS")]
    for domain in fleet.domains:
        rows.append(
            (
                str(domain.layer),
                domain.network_node,
                domain.parent or "-",
                str(domain.size),
                ",".join(domain.instance_types),
                _members(domain.nodes),
            )
        )
    for server in fleet.ultraservers:
        rows.append(
            ("us", server.ultraserver_id, ",".join(server.layer3_domains) or "-", str(len(server.nodes)), "", "")
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() for row in rows]
    for layer in range(1, fleet.depth + 1):
        domains = fleet.layer(layer)
        lines.append(
            f"layer {layer} ({layer_label(layer)}): {len(domains)} domains, "
            f"largest {fleet.largest(layer)} nodes, smallest {min(d.size for d in domains)} nodes"
        )
    if fleet.depth >= 3:
        lines.append(f"largest job that fits one layer-3 domain: {fleet.largest(3)} nodes")
    if fleet.ultraservers:
        nested = (
            "each inside one layer-3 domain" if fleet.ultraservers_inside_one_layer3_domain else "some span layer-3"
        )
        largest = max(len(server.nodes) for server in fleet.ultraservers)
        lines.append(f"ultraservers: {len(fleet.ultraservers)} ({nested}), largest {largest} nodes")
    if fleet.nodes_without_topology:
        without = fleet.nodes_without_topology
        lines.append(f"without topology data: {len(without)} nodes: {_members(without)}")
    lines.append(f"{fleet.node_count} nodes")
    return "\n".join(lines) + "\n"


def render_mermaid(fleet: FleetLayers) -> str:
    """The layer map, top (layer 1) down, leaves with their node counts; UltraServers hang off layer 3."""
    ids = {
        (domain.layer, domain.network_node): f"l{domain.layer}n{index}" for index, domain in enumerate(fleet.domains)
    }
    lines = ["flowchart TB"]
    for domain in fleet.domains:
        label = f"layer {domain.layer}<br/>{domain.network_node}<br/>{domain.size} nodes"
        lines.append(f'  {ids[(domain.layer, domain.network_node)]}["{label}"]')
    for domain in fleet.domains:
        if domain.parent is not None and (domain.layer - 1, domain.parent) in ids:
            lines.append(f"  {ids[(domain.layer - 1, domain.parent)]} --> {ids[(domain.layer, domain.network_node)]}")
    for index, server in enumerate(fleet.ultraservers):
        lines.append(f'  us{index}[["ultraserver<br/>{server.ultraserver_id}<br/>{len(server.nodes)} nodes"]]')
        lines += [f"  {ids[(3, parent)]} -.- us{index}" for parent in server.layer3_domains if (3, parent) in ids]
    return "\n".join(lines) + "\n"


def fleet_json(fleet: FleetLayers) -> dict[str, Any]:
    return {
        "nodes": fleet.node_count,
        "layers": [
            {
                "layer": layer,
                "label": layer_label(layer),
                "largest_domain": fleet.largest(layer),
                "domains": [
                    {
                        "network_node": domain.network_node,
                        "parent": domain.parent,
                        "size": domain.size,
                        "instance_types": list(domain.instance_types),
                        "nodes": list(domain.nodes),
                    }
                    for domain in fleet.layer(layer)
                ],
            }
            for layer in range(1, MAX_NETWORK_LAYERS + 1)
            if fleet.layer(layer)
        ],
        "ultraservers": [
            {"ultraserver_id": s.ultraserver_id, "layer3_domains": list(s.layer3_domains), "nodes": list(s.nodes)}
            for s in fleet.ultraservers
        ],
        "nodes_without_topology": list(fleet.nodes_without_topology),
    }
