"""Edits of a loaded config that slurmctld refuses on ``scontrol reconfigure``, with the reason it gives.

Each applies to ``mixed_cluster``'s plan (tree-gpu, block-gb, flat cpu) loaded by ``load_plan``. The
reasons are those of the real slurmctld 26.05 and 24.11: tests/integration/slurm/test_standin_scontrol.py
checks that it and the file-only stand-in both give them; tests/integration/head_node/test_file_head_node.py
uses them on the stand-in alone.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import NamedTuple

from tests.helpers import gb200_nodes, node, p5_nodes, snapshot
from topokeeper.engine.planner import plan
from topokeeper.render.bundle import RenderedPlan, render
from topokeeper.sim.head_node import HeadNodeController

PLUGIN_FATAL = "fatal: Failed to initialize topology plugin"


def mixed_cluster(version: str) -> RenderedPlan:
    """8 p5 (tree-gpu), two UltraServers (block-gb), two CPU nodes (flat); before 25.05 one tree for all."""
    cpu = [node("cpu-001", "c5.xlarge", partition="cpu"), node("cpu-002", "c5.xlarge", partition="cpu")]
    return render(plan(snapshot({"gpu": p5_nodes(8), "gb": gb200_nodes(2), "cpu": cpu}, version=version)))


def load_plan(controller: HeadNodeController, rendered: RenderedPlan) -> None:
    """The plan's topology file and slurm.conf keys, as the applier writes them, then reconfigure."""
    nodes = rendered.plan.nodes
    partitions = {p.partition: (p.nodes, p.assignment) for p in rendered.plan.partitions}
    plugin = (
        [f"TopologyPlugin={rendered.plan.topology_plugin}"] if rendered.bundle.slurm_format == "topology.conf" else []
    )
    controller.write_slurm_conf(nodes, partitions, plugin)
    (controller.etc / rendered.bundle.slurm_format).write_text(rendered.topology_text)
    controller.run("scontrol", "reconfigure", check=True)


def _on_partition_line(partition: str, addition: str) -> Callable[[str], str]:
    return lambda text: re.sub(rf"^(PartitionName={partition} .*)$", rf"\1{addition}", text, flags=re.MULTILINE)


class RefusedEdit(NamedTuple):
    id: str
    version: str
    file: str  # in slurm.conf's directory
    edit: Callable[[str], str]
    # The last line slurmctld logs ({etc}: slurm.conf's directory); for slurm.conf before 25.05 the first
    # error of scontrol itself, which then cannot read slurm.conf either.
    reason: str


REFUSED_EDITS = [
    RefusedEdit("yaml-syntax", "26.05", "topology.yaml", lambda text: text + "  - : [\n", PLUGIN_FATAL),
    RefusedEdit("empty-yaml", "26.05", "topology.yaml", lambda text: "", PLUGIN_FATAL),
    RefusedEdit(
        "undefined-partition-topology",
        "26.05",
        "slurm.conf",
        lambda text: text.replace("Topology=tree-gpu", "Topology=nosuch"),
        "fatal: read_slurm_conf reading {etc}/slurm.conf: Requested topology configuration is not available",
    ),
    RefusedEdit(
        "duplicate-switch",
        "26.05",
        "topology.yaml",
        lambda text: text + "      - switch: nn-leaf000\n        nodes: p5-001\n",
        "fatal: Switch (nn-leaf000) has already been defined",
    ),
    RefusedEdit(
        "duplicate-block",
        "26.05",
        "topology.yaml",
        lambda text: text.replace("block: us-0001", "block: us-0000"),
        "fatal: Block (us-0000) has already been defined",
    ),
    RefusedEdit(
        "undefined-child-switch",
        "26.05",
        "topology.yaml",
        lambda text: text.replace("children: nn-leaf002", "children: nn-leaf002,nn-ghost"),
        "fatal: Switch configuration nn-agg1 has invalid child (nn-ghost)",
    ),
    RefusedEdit(
        "not-a-tree",
        "26.05",
        "topology.yaml",
        lambda text: text.replace("children: nn-leaf002", "children: nn-leaf002,root"),
        "fatal: Switch configuration is not a tree",
    ),
    RefusedEdit(
        "invalid-block-sizes",
        "26.05",
        "topology.yaml",
        lambda text: text.replace("    block_sizes:\n      - 18\n", "    block_sizes:\n      - 18\n      - 54\n"),
        "fatal: Invalid BlockSizes value in topology block-gb",
    ),
    RefusedEdit(
        "duplicate-switch",
        "24.11",
        "topology.conf",
        lambda text: text + "SwitchName=nn-leaf000 Nodes=p5-001\n",
        "fatal: Switch (nn-leaf000) has already been defined",
    ),
    RefusedEdit(
        "unknown-key",
        "24.11",
        "topology.conf",
        lambda text: text.replace("SwitchName=nn-leaf002 ", "SwitchName=nn-leaf002 Colour=red "),
        "fatal: something wrong with opening/reading {etc}/topology.conf: Invalid argument",
    ),
    RefusedEdit(
        "unknown-plugin",
        "24.11",
        "slurm.conf",
        lambda text: text.replace("TopologyPlugin=topology/tree", "TopologyPlugin=topology/flat"),
        PLUGIN_FATAL,
    ),
    RefusedEdit(
        "partition-topology",
        "24.11",
        "slurm.conf",
        _on_partition_line("gpu", " Topology=tree-gpu"),
        "scontrol: error: Parsing error at unrecognized key: Topology",
    ),
]
