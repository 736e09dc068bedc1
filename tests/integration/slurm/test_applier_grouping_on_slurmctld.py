"""verify by grouping against a real slurmctld: HyperPod's own names for the planned grouping are naming
drift only; a node in another leaf, or a block split otherwise, is grouping drift.

The HyperPod-style files are written by hand: topologies ``tree`` and ``block`` (flat cluster default),
a spine and leaves of its own names with no aggregation level, blocks ``us1``/``us2``, ``Topology=``
on the partitions, one tree shared by two tree partitions; before 25.05 one topology.conf.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.helpers import gb200_nodes, node, p5_nodes
from tests.integration.slurm.test_applier_on_slurmctld import _bundle, _plan, _run
from topokeeper.domain.models import Node
from topokeeper.render.bundle import RenderedPlan
from topokeeper.sim.slurm_chroot import SlurmController

pytestmark = pytest.mark.slurm

HYPERPOD_ASSIGNMENTS = {"gpu": "tree", "lab": "tree", "gb": "block", "cpu": None}


def _cluster() -> dict[str, list[Node]]:
    """gpu: leaves p5-[001-003], p5-[004-007], p5-008; lab on the network node of gpu's first leaf."""
    return {
        "gpu": p5_nodes(8),
        "lab": [node(f"lab-00{i}", path=("nn-spine0", "nn-agg0", "nn-leaf000"), partition="lab") for i in (1, 2)],
        "gb": gb200_nodes(2),
        "cpu": [node(f"cpu-00{i}", "c5.xlarge", partition="cpu") for i in (1, 2)],
    }


def hyperpod_yaml(leaves: list[str], blocks: list[str]) -> str:
    """HyperPod-style topology.yaml: one ``tree`` for every tree partition, one ``block``, flat default."""
    lines = ["- topology: tree", "  cluster_default: false", "  tree:", "    switches:", "      - switch: spine"]
    lines.append("        children: " + ",".join(f"hp-{i}" for i in range(len(leaves))))
    for index, nodes in enumerate(leaves):
        lines += [f"      - switch: hp-{index}", f"        nodes: {nodes}"]
    lines += ["- topology: block", "  cluster_default: false", "  block:", "    block_sizes:", "      - 18"]
    lines.append("    blocks:")
    for index, nodes in enumerate(blocks):
        lines += [f"      - block: us{index + 1}", f"        nodes: {nodes}"]
    lines += ["- topology: flat", "  cluster_default: true", "  flat: true"]
    return "\n".join(lines) + "\n"


PLANNED_LEAVES = ["lab-[001-002],p5-[001-003]", "p5-[004-007]", "p5-008"]
PLANNED_BLOCKS = ["gb-[001-018]", "gb-[019-036]"]


def hyperpod_conf(leaves: list[str]) -> str:
    """One top switch of its own name over leaves of its own names (24.11 reads no YAML)."""
    top = "SwitchName=top-1 Switches=" + ",".join(f"nn-hp{i}" for i in range(len(leaves)))
    return "\n".join([top, *(f"SwitchName=nn-hp{i} Nodes={nodes}" for i, nodes in enumerate(leaves))]) + "\n"


def _start_hyperpod(controller: SlurmController, rendered: RenderedPlan) -> None:
    partitions = {p.partition: (p.nodes, HYPERPOD_ASSIGNMENTS[p.partition]) for p in rendered.plan.partitions}
    controller.prepare(rendered.plan.nodes, partitions)
    controller.write_file("topology.yaml", hyperpod_yaml(PLANNED_LEAVES, PLANNED_BLOCKS))
    controller.start()


def _reload(controller: SlurmController, name: str, content: str) -> None:
    controller.write_file(name, content)
    controller.run("scontrol", "reconfigure", check=True)


def _grouping(document: dict[str, Any]) -> list[dict[str, str]]:
    return [entry for entry in document["drift"] if entry["what"] == "grouping"]


def _assert_naming_only(code: int, document: dict[str, Any]) -> None:
    assert (code, document["outcome"], document["grouping_drift"]) == (3, "drift", False)
    assert document["drift"] and {entry["kind"] for entry in document["drift"]} == {"naming"}
    assert _grouping(document) == []


def test_hyperpod_tree_names_are_naming_drift_and_a_moved_node_is_grouping_drift(sid_root: Path, controllers) -> None:
    rendered = _plan(_cluster())
    bundle = _bundle(rendered)
    controller = controllers(sid_root)
    _start_hyperpod(controller, rendered)

    code, document = _run(controller, "verify", bundle)

    _assert_naming_only(code, document)
    assert document["partition_topologies"] == {"cpu": None, "dev": None, "gb": "block", "gpu": "tree", "lab": "tree"}
    assert sorted((e["what"], e["name"]) for e in document["drift"]) == [
        ("file", "topology.yaml"),
        *[("partition", name) for name in ("gb", "gb", "gpu", "gpu", "lab", "lab")],  # slurm.conf and slurmctld
        ("topology", "block-gb"),
        ("topology", "tree-gpu"),
        ("topology", "tree-lab"),
    ]

    # p5-003 moves to the second leaf: gpu's grouping differs, lab's (on the same live leaf) does not.
    _reload(
        controller,
        "topology.yaml",
        hyperpod_yaml(["lab-[001-002],p5-[001-002]", "p5-[003-007]", "p5-008"], PLANNED_BLOCKS),
    )
    code, document = _run(controller, "verify", bundle)

    assert (code, document["outcome"], document["grouping_drift"]) == (3, "drift", True)
    assert _grouping(document) == [
        {
            "what": "grouping",
            "name": "gpu",
            "detail": "Topology=tree: 2 planned leaves not live: [p5-001, p5-002, p5-003];"
            " [p5-004, p5-005, p5-006, p5-007]; 2 live leaves not planned: [p5-001, p5-002];"
            " [p5-003, p5-004, p5-005, p5-006, p5-007]",
            "kind": "grouping",
        }
    ]
    assert document["drift"][0] == _grouping(document)[0]
    kinds = {(e["what"], e["name"]): e["kind"] for e in document["drift"]}
    assert (
        kinds[("topology", "tree-gpu")] == kinds[("partition", "gpu")] == kinds[("file", "topology.yaml")] == "grouping"
    )
    assert kinds[("topology", "tree-lab")] == kinds[("partition", "lab")] == kinds[("partition", "gb")] == "naming"


def test_hyperpod_block_names_are_naming_drift_and_a_different_split_is_grouping_drift(
    sid_root: Path, controllers
) -> None:
    rendered = _plan(_cluster())
    bundle = _bundle(rendered)
    controller = controllers(sid_root)
    _start_hyperpod(controller, rendered)
    assert "BlockName=us1 BlockIndex=0 Nodes=gb-[001-018] BlockSize=18" in controller.show_topology("block")

    _assert_naming_only(*_run(controller, "verify", bundle))

    # gb-018 and gb-019 swap blocks: still two blocks of 18, grouped otherwise.
    _reload(controller, "topology.yaml", hyperpod_yaml(PLANNED_LEAVES, ["gb-[001-017],gb-019", "gb-018,gb-[020-036]"]))
    code, document = _run(controller, "verify", bundle)

    assert (code, document["grouping_drift"]) == (3, True)
    assert [(e["name"], e["kind"]) for e in _grouping(document)] == [("gb", "grouping")]
    assert _grouping(document)[0]["detail"].startswith("Topology=block: 2 planned blocks not live: ")
    kinds = {(e["what"], e["name"]): e["kind"] for e in document["drift"]}
    assert kinds[("topology", "block-gb")] == kinds[("partition", "gb")] == "grouping"
    assert kinds[("topology", "tree-gpu")] == kinds[("partition", "gpu")] == "naming"


def test_hyperpod_topology_conf_on_24_11_is_compared_cluster_wide(trixie_root: Path, controllers) -> None:
    rendered = _plan(_cluster(), version="24.11")
    bundle = _bundle(rendered)
    assert (list(bundle["topologies"]), bundle["topology_plugin"]) == (["cluster"], "topology/tree")
    leaves = [*PLANNED_LEAVES, "gb-[001-018]", "gb-[019-036]", "cpu-[001-002]"]
    controller = controllers(trixie_root)
    partitions = {p.partition: (p.nodes, None) for p in rendered.plan.partitions}
    controller.prepare(rendered.plan.nodes, partitions, ["TopologyPlugin=topology/tree"])
    controller.write_file("topology.conf", hyperpod_conf(leaves))
    controller.start()

    code, document = _run(controller, "verify", bundle)

    _assert_naming_only(code, document)
    assert sorted((e["what"], e["name"]) for e in document["drift"]) == [
        ("file", "topology.conf"),
        ("topology", "cluster"),
    ]

    # p5-007 moves to p5-008's leaf.
    _reload(controller, "topology.conf", hyperpod_conf([leaves[0], "p5-[004-006]", "p5-[007-008]", *leaves[3:]]))
    code, document = _run(controller, "verify", bundle)

    assert (code, document["grouping_drift"]) == (3, True)
    assert [e["name"] for e in _grouping(document)] == ["cluster"]
    assert _grouping(document)[0]["detail"] == (
        "the cluster-wide topology: 2 planned leaves not live: [p5-004, p5-005, p5-006, p5-007]; [p5-008];"
        " 2 live leaves not planned: [p5-004, p5-005, p5-006]; [p5-007, p5-008]"
    )
    assert {e["kind"] for e in document["drift"]} == {"grouping"}
