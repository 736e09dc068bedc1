"""Plan -> topology.yaml (Slurm >= 25.05).

Written by hand rather than by a YAML library so the bytes are fixed by this file alone. It is safe
because every name was validated to ``[A-Za-z0-9._-]``, which YAML reads as a plain scalar.
Switch and block names are comma lists: Slurm brackets take numeric ranges only.
"""

from __future__ import annotations

from topokeeper.domain.models import (
    FLAT_DEFAULT,
    BlockTopology,
    FlatTopology,
    Plan,
    Topology,
    TreeTopology,
)
from topokeeper.wire import compress

HEADER = "# Managed by topokeeper: edits here are replaced on the next reconcile and reported as drift.\n"


def render_entry(topology: Topology, *, cluster_default: bool = False) -> str:
    """One ``- topology:`` list item."""
    lines = [f"- topology: {topology.name}", f"  cluster_default: {'true' if cluster_default else 'false'}"]
    if isinstance(topology, FlatTopology):
        lines.append("  flat: true")
    elif isinstance(topology, TreeTopology):
        lines += ["  tree:", "    switches:"]
        for switch in topology.switches:
            lines.append(f"      - switch: {switch.name}")
            if switch.switches:
                lines.append(f"        children: {','.join(switch.switches)}")
            if switch.nodes:
                lines.append(f"        nodes: {compress(switch.nodes)}")
    elif isinstance(topology, BlockTopology):
        lines += ["  block:", "    block_sizes:"]
        lines += [f"      - {size}" for size in topology.block_sizes]
        lines.append("    blocks:")
        for block in topology.blocks:
            lines += [f"      - block: {block.name}", f"        nodes: {compress(block.nodes)}"]
    return "\n".join(lines) + "\n"


def render_yaml(plan: Plan) -> str:
    entries = [render_entry(FlatTopology(name=FLAT_DEFAULT), cluster_default=True)]
    for partition in sorted(plan.partitions, key=lambda p: p.partition):
        if partition.assignment is not None:
            entries.append(render_entry(partition.topology))
    return HEADER + "".join(entries)
