"""Nodes -> Slurm blocks, one per UltraServer.

Slurm aggregates blocks in line order, so blocks are ordered by network proximity (the upper network
layers their instances share), then by id. Block sizes come from the instance type or the config,
never from how many nodes are alive now: one failed instance must not change the base size. Nodes
without an UltraServer id (EC2 reports ``CapacityBlockId`` eventually) stay schedulable in a trailing
``no-ultraserver`` block and are counted.
"""

from __future__ import annotations

from collections.abc import Iterable

from topokeeper.domain.models import NO_ULTRASERVER_BLOCK, Block, BlockTopology, Node, assemble


def build_blocks(
    name: str, nodes: Iterable[Node], block_sizes: tuple[int, ...]
) -> tuple[BlockTopology, tuple[str, ...]]:
    """Return the block topology and the nodes that had no UltraServer id."""
    members: dict[str, set[str]] = {}
    upper_paths: dict[str, set[tuple[str, ...]]] = {}
    orphans: list[str] = []
    for node in nodes:
        if node.ultraserver_id is None:
            orphans.append(node.name)
            continue
        members.setdefault(node.ultraserver_id, set()).add(node.name)
        upper_paths.setdefault(node.ultraserver_id, set())
        if node.network_nodes:
            upper_paths[node.ultraserver_id].add(node.network_nodes[:-1])

    def proximity(block_id: str) -> tuple[int, tuple[str, ...], str]:
        paths = upper_paths[block_id]
        return (0, min(paths), block_id) if paths else (1, (), block_id)

    # Block names are validated UltraServer ids or a constant, their nodes validated nodes: no need to check again.
    blocks = [
        assemble(Block, {"name": block_id, "nodes": tuple(sorted(members[block_id]))})
        for block_id in sorted(members, key=proximity)
    ]
    if orphans:
        blocks.append(assemble(Block, {"name": NO_ULTRASERVER_BLOCK, "nodes": tuple(sorted(orphans))}))
    topology = BlockTopology.model_validate({"name": name, "block_sizes": block_sizes, "blocks": ()})
    return topology.model_copy(update={"blocks": tuple(blocks)}), tuple(sorted(orphans))
