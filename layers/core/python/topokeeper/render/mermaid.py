"""Plan -> Mermaid flowchart: one subgraph per partition (switch tree, UltraServer blocks, or flat).

A leaf shows its node count and a shortened hostlist instead of one box per node, so a 100-node
partition stays a picture of its switches. Mermaid ids are generated (p0s3); labels carry the names.
"""

from __future__ import annotations

from topokeeper.domain.models import BlockTopology, PartitionPlan, Plan, TreeTopology
from topokeeper.wire import compress

_MAX_LABEL_HOSTS = 48


def _hosts(nodes: tuple[str, ...]) -> str:
    text = compress(nodes)
    if len(text) > _MAX_LABEL_HOSTS:
        text = text[: _MAX_LABEL_HOSTS - 3] + "..."
    return f"{len(nodes)} node{'s' if len(nodes) != 1 else ''}: {text}"


def _partition_lines(index: int, partition: PartitionPlan) -> list[str]:
    prefix = f"p{index}"
    title = f"{partition.partition} · {partition.kind.value} · {len(partition.nodes)} nodes"
    lines = [f'  subgraph {prefix}["{title}"]', "    direction TB"]
    topology = partition.topology
    if isinstance(topology, TreeTopology):
        ids = {switch.name: f"{prefix}s{number}" for number, switch in enumerate(topology.switches)}
        for switch in topology.switches:
            label = switch.name if not switch.nodes else f"{switch.name}<br/>{_hosts(switch.nodes)}"
            shape = f'(["{label}"])' if switch.nodes else f'["{label}"]'
            lines.append(f"    {ids[switch.name]}{shape}")
        for switch in topology.switches:
            lines += [f"    {ids[switch.name]} --> {ids[child]}" for child in switch.switches]
    elif isinstance(topology, BlockTopology):
        sizes = ",".join(str(size) for size in topology.block_sizes)
        lines.append(f'    {prefix}sizes[/"block_sizes {sizes}"/]')
        previous = f"{prefix}sizes"
        for number, block in enumerate(topology.blocks):
            block_id = f"{prefix}b{number}"
            lines.append(f'    {block_id}[["{block.name}<br/>{_hosts(block.nodes)}"]]')
            lines.append(f"    {previous} -.- {block_id}")
            previous = block_id
    else:
        lines.append(f'    {prefix}flat["flat (cluster default)<br/>{_hosts(partition.nodes)}"]')
    lines.append("  end")
    return lines


def render_partition_mermaid(partition: PartitionPlan) -> str:
    return "\n".join(["flowchart TB", *_partition_lines(0, partition)]) + "\n"


def render_mermaid(plan: Plan) -> str:
    lines = [f"%% topokeeper plan for {plan.cluster_name} ({plan.slurm_format.value})", "flowchart TB"]
    for index, partition in enumerate(sorted(plan.partitions, key=lambda p: p.partition)):
        lines += _partition_lines(index, partition)
    return "\n".join(lines) + "\n"
