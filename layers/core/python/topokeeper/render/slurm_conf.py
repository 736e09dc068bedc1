"""Plan -> topology.conf (Slurm < 25.05): the single cluster-wide topology.

One file holds one plugin's keys (mixing SwitchName and BlockName is fatal), and the plugin itself is
chosen by ``TopologyPlugin=`` in slurm.conf, which the applier sets from the bundle.
"""

from __future__ import annotations

from topokeeper.domain.models import BlockTopology, Plan, TreeTopology
from topokeeper.render.slurm_yaml import HEADER
from topokeeper.wire import compress


def render_conf(plan: Plan) -> str:
    topology = plan.cluster_topology
    lines: list[str] = []
    if isinstance(topology, TreeTopology):
        for switch in topology.switches:
            line = f"SwitchName={switch.name}"
            if switch.switches:
                line += f" Switches={','.join(switch.switches)}"
            if switch.nodes:
                line += f" Nodes={compress(switch.nodes)}"
            lines.append(line)
    elif isinstance(topology, BlockTopology):
        lines += [f"BlockName={block.name} Nodes={compress(block.nodes)}" for block in topology.blocks]
        lines.append(f"BlockSizes={','.join(str(size) for size in topology.block_sizes)}")
    else:
        lines.append("# flat: no switches or blocks (TopologyPlugin=topology/default ignores this file)")
    return HEADER + "\n".join(lines) + "\n"
