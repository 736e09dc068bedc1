"""verify by grouping: the same node grouping under other names (HyperPod's) is naming drift only.

The live side is staged through the fake ``scontrol`` of test_applier_run, as HyperPod would leave
it: its own topology names (``tree``, ``block``), its own spine and leaf switch names and levels,
blocks named ``us1``/``us2``, and one tree shared by two tree partitions.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import gb200_nodes, node, p5_nodes, snapshot
from tests.integration.head_node.test_applier_run import FakeHeadNode
from topokeeper.domain.models import Node, PartitionSettings
from topokeeper.engine.planner import plan
from topokeeper.headnode.bundle import parse_bundle
from topokeeper.headnode.grouping import planned_base_block_sizes
from topokeeper.render.bundle import render

# The plan for p5_nodes(8): three leaves, under nn-agg0/nn-agg1, nn-spine0 and root.
GPU_LEAVES = [[f"p5-{i:03d}" for i in range(1, 4)], [f"p5-{i:03d}" for i in range(4, 8)], ["p5-008"]]
# A second tree partition on the first gpu leaf's network node.
LAB_NODES = ["lab-001", "lab-002"]
GB_BLOCKS = [[f"gb-{i:03d}" for i in range(1, 19)], [f"gb-{i:03d}" for i in range(19, 37)]]
CPU_NODES = ["cpu-1", "cpu-2"]


def _cluster() -> dict[str, list[Node]]:
    return {
        "gpu": p5_nodes(8),
        "lab": [node(name, path=("nn-spine0", "nn-agg0", "nn-leaf000"), partition="lab") for name in LAB_NODES],
        "gb": gb200_nodes(2),
        "cpu": [node(name, "c5.xlarge", partition="cpu") for name in CPU_NODES],
    }


def _bundle(version: str = "26.05", **settings: PartitionSettings) -> dict[str, Any]:
    return render(plan(snapshot(_cluster(), version=version, settings=settings))).bundle.document()


def _switch(name: str, level: int, nodes: list[str], children: list[str] | None = None) -> str:
    line = f"SwitchName={name} Level={level} LinkSpeed=0 Nodes={','.join(sorted(nodes))}"
    return line + (f" Switches={','.join(children)}" if children else "")


def hyperpod_tree(leaves: list[list[str]], spines: list[list[int]] | None = None) -> str:
    """``scontrol show topology`` of a HyperPod-style tree: leaves ``hp-leaf-N`` right under one spine
    (or under ``spines``: per spine, the indexes of its leaves), no aggregation level."""
    spines = spines if spines is not None else [list(range(len(leaves)))]
    lines = [
        _switch(f"hp-spine{number}", 1, [n for i in members for n in leaves[i]], [f"hp-leaf-{i}" for i in members])
        for number, members in enumerate(spines)
    ]
    lines += [_switch(f"hp-leaf-{index}", 0, nodes) for index, nodes in enumerate(leaves)]
    return "\n".join(lines) + "\n"


def hyperpod_blocks(blocks: list[list[str]], size: int = 18) -> str:
    lines = [
        f"BlockName=us{index + 1} BlockIndex={index} Nodes={','.join(nodes)} BlockSize={size}"
        for index, nodes in enumerate(blocks)
    ]
    everything = ",".join(n for nodes in blocks for n in nodes)
    lines.append(f"AggregatedBlock=us[1-{len(blocks)}] BlockIndex={len(blocks)} Nodes={everything} BlockSize=36")
    return "\n".join(lines) + "\n"


def _shared(gpu_leaves: list[list[str]]) -> list[list[str]]:
    """The gpu leaves as HyperPod's one tree holds them: lab's nodes share the leaf of p5-001."""
    return [sorted(leaf + LAB_NODES) if "p5-001" in leaf else leaf for leaf in gpu_leaves]


def _moved(gpu_leaves: list[list[str]]) -> list[list[str]]:
    """p5-003 moved from the first leaf to the second."""
    return [[n for n in gpu_leaves[0] if n != "p5-003"], ["p5-003", *gpu_leaves[1]], *gpu_leaves[2:]]


def serve_hyperpod(
    head_node: FakeHeadNode,
    bundle: dict[str, Any],
    tree: str | None = None,
    blocks: str | None = None,
    default: str = "",
) -> None:
    """slurm.conf, topology.yaml and slurmctld as HyperPod leaves them, grouping the nodes as planned
    unless ``tree``, ``blocks`` or the cluster ``default`` say otherwise."""
    head_node.serve(bundle)
    assigned = {"gpu": "tree", "lab": "tree", "gb": "block"}
    text = head_node.conf.read_text()
    for partition, topology in assigned.items():
        line = f"PartitionName={partition} Nodes=ALL State=UP"
        text = text.replace(line, f"{line} Topology={topology}")
    head_node.conf.write_text(text)
    (head_node.etc / "topology.yaml").write_text("- topology: tree\n  cluster_default: false\n")
    head_node.serve(
        partitions={**assigned, "cpu": None},
        partition_nodes={"cpu": CPU_NODES},
        topologies={
            "": default,
            "tree": hyperpod_tree(_shared(GPU_LEAVES)) if tree is None else tree,
            "block": hyperpod_blocks(GB_BLOCKS) if blocks is None else blocks,
        },
    )


def _kinds(document: dict[str, Any]) -> list[tuple[str, str, str]]:
    return sorted({(entry["what"], entry["name"], entry["kind"]) for entry in document["drift"]})


@pytest.fixture
def head_node(tmp_path: Path) -> FakeHeadNode:
    return FakeHeadNode(tmp_path)


def test_the_same_grouping_under_hyperpod_names_is_naming_drift_only(head_node: FakeHeadNode) -> None:
    bundle = _bundle()
    serve_hyperpod(head_node, bundle)

    code, document, _ = head_node.run("verify", bundle)

    assert (code, document["outcome"], document["grouping_drift"]) == (3, "drift", False)
    assert _kinds(document) == [
        ("file", "topology.yaml", "naming"),
        ("partition", "gb", "naming"),
        ("partition", "gpu", "naming"),
        ("partition", "lab", "naming"),
        ("topology", "block-gb", "naming"),
        ("topology", "tree-gpu", "naming"),
        ("topology", "tree-lab", "naming"),
    ]
    # The name-based entries keep what they said.
    assert {"what": "partition", "name": "gpu", "detail": "slurmctld has Topology=tree, the plan tree-gpu"} in [
        {key: value for key, value in entry.items() if key != "kind"} for entry in document["drift"]
    ]
    assert document["readback"]["tree-gpu"]["matches"] is False


@pytest.mark.parametrize(
    ("tree", "blocks", "partition", "detail"),
    [
        (
            hyperpod_tree(_shared(_moved(GPU_LEAVES))),
            None,
            "gpu",
            "Topology=tree: 2 planned leaves not live: [p5-001, p5-002, p5-003]; [p5-004, p5-005, p5-006, p5-007];"
            " 2 live leaves not planned: [p5-001, p5-002]; [p5-003, p5-004, p5-005, p5-006, p5-007]",
        ),
        (
            hyperpod_tree(_shared(GPU_LEAVES[:2])),
            None,
            "gpu",
            "Topology=tree: 1 planned node(s) in no live leaf (p5-008); 1 planned leaves not live: [p5-008]",
        ),
        (
            hyperpod_tree(_shared(GPU_LEAVES), spines=[[0, 1], [2]]),
            None,
            "gpu",
            "Topology=tree: no live switch reaches all 3 leaves: jobs cannot span them",
        ),
        (
            None,
            hyperpod_blocks([GB_BLOCKS[0][:-1], [GB_BLOCKS[0][-1], *GB_BLOCKS[1]]]),
            "gb",
            "Topology=block: 2 planned blocks not live: [gb-001, gb-002, gb-003, gb-004, gb-005, ...];"
            " [gb-019, gb-020, gb-021, gb-022, gb-023, ...]; 2 live blocks not planned:"
            " [gb-001, gb-002, gb-003, gb-004, gb-005, ...]; [gb-018, gb-019, gb-020, gb-021, gb-022, ...]",
        ),
        (None, hyperpod_blocks(GB_BLOCKS, size=9), "gb", "Topology=block: base block size 9 live, 18 in the plan"),
        (None, hyperpod_tree(GB_BLOCKS), "gb", "Topology=block: a tree topology live, a block in the plan"),
    ],
    ids=["node-moved-between-leaves", "missing-leaf", "no-common-top", "blocks-split-differently", "base-size", "kind"],
)
def test_a_different_grouping_is_grouping_drift(
    head_node: FakeHeadNode, tree: str | None, blocks: str | None, partition: str, detail: str
) -> None:
    bundle = _bundle()
    serve_hyperpod(head_node, bundle, tree=tree, blocks=blocks)

    code, document, _ = head_node.run("verify", bundle)

    assert (code, document["outcome"], document["grouping_drift"]) == (3, "drift", True)
    # Listed first, and only for that partition: lab shares the tree but its leaf is as planned.
    assert [entry for entry in document["drift"] if entry["what"] == "grouping"] == [
        {"what": "grouping", "name": partition, "detail": detail, "kind": "grouping"}
    ]
    assert document["drift"][0]["what"] == "grouping"
    # Entries about that partition, its planned topology or the whole file are grouping; the rest naming.
    concerned = {partition, bundle["partitions"][partition], "topology.yaml"}
    for what, name, kind in _kinds(document):
        assert kind == ("grouping" if name in concerned else "naming"), (what, name)


def test_a_flat_partition_differs_when_the_live_topology_keeps_its_nodes_apart(head_node: FakeHeadNode) -> None:
    bundle = _bundle()
    assert bundle["partitions"]["cpu"] is None
    # HyperPod's tree as the cluster default: the cpu nodes are in no leaf, no job can use both.
    serve_hyperpod(head_node, bundle, default=hyperpod_tree(GPU_LEAVES))

    code, document, _ = head_node.run("verify", bundle)

    assert (code, document["grouping_drift"]) == (3, True)
    assert [entry for entry in document["drift"] if entry["what"] == "grouping"] == [
        {
            "what": "grouping",
            "name": "cpu",
            "detail": "the cluster default: 2 of the flat partition's node(s) in no live leaf (cpu-1, cpu-2)",
            "kind": "grouping",
        }
    ]

    # A tree that holds them under one switch only orders them: no constraint.
    serve_hyperpod(head_node, bundle, default=hyperpod_tree([["cpu-1"], ["cpu-2"]]))
    assert head_node.run("verify", bundle)[1]["grouping_drift"] is False
    # Two blocks, or two spines, keep them apart.
    for default, problem in [
        (hyperpod_blocks([["cpu-1"], ["cpu-2"]]), "the flat partition's nodes are split over 2 live blocks"),
        (
            hyperpod_tree([["cpu-1"], ["cpu-2"]], spines=[[0], [1]]),
            "no live switch reaches all 2 leaves holding the flat partition's nodes",
        ),
    ]:
        serve_hyperpod(head_node, bundle, default=default)
        assert head_node.run("verify", bundle)[1]["drift"][0]["detail"] == f"the cluster default: {problem}"


def test_one_leaf_needs_no_top_switch(head_node: FakeHeadNode) -> None:
    """HyperPod may write a lone leaf where the plan has root -> spine -> ... -> leaf."""
    nodes = [node(f"p5-{i:03d}", path=("nn-spine0", "nn-agg0", "nn-leaf000")) for i in (1, 2)]
    bundle = render(plan(snapshot({"gpu": nodes}))).bundle.document()
    assert len(bundle["topologies"]["tree-gpu"]) == 4
    head_node.serve(bundle)
    head_node.serve(partitions={"gpu": "tree"}, topologies={"": "", "tree": _switch("leaf", 0, ["p5-001", "p5-002"])})

    _, document, _ = head_node.run("verify", bundle)

    assert (document["outcome"], document["grouping_drift"]) == ("drift", False)
    assert {entry["kind"] for entry in document["drift"]} == {"naming"}


def test_a_partition_unknown_to_slurmctld_differs_in_grouping(head_node: FakeHeadNode) -> None:
    bundle = _bundle()
    serve_hyperpod(head_node, bundle)
    head_node.serve(partitions={"cpu": None, "gpu": "tree", "lab": "tree"})

    _, document, _ = head_node.run("verify", bundle)

    assert document["grouping_drift"] is True
    assert document["drift"][0] == {
        "what": "grouping",
        "name": "gb",
        "detail": "not known to slurmctld",
        "kind": "grouping",
    }
    assert ("partition", "gpu", "naming") in _kinds(document)
    assert ("partition", "gb", "grouping") in _kinds(document)


def test_topology_conf_compares_the_cluster_wide_grouping(head_node: FakeHeadNode) -> None:
    bundle = _bundle("24.11")
    assert (list(bundle["topologies"]), bundle["topology_plugin"]) == (["cluster"], "topology/tree")
    head_node.serve(bundle, version="slurm 24.11.5")
    head_node.conf.write_text(head_node.conf.read_text() + "TopologyPlugin=topology/tree\n")
    (head_node.etc / "topology.conf").write_text("SwitchName=hp-spine0 Switches=hp-leaf-[0-5]\n")
    head_node.serve(topologies={"": hyperpod_tree([*_shared(GPU_LEAVES), *GB_BLOCKS, CPU_NODES])})

    code, document, _ = head_node.run("verify", bundle)

    assert (code, document["outcome"], document["grouping_drift"]) == (3, "drift", False)
    assert _kinds(document) == [("file", "topology.conf", "naming"), ("topology", "cluster", "naming")]

    head_node.serve(topologies={"": hyperpod_tree([*_shared(_moved(GPU_LEAVES)), *GB_BLOCKS, CPU_NODES])})
    _, document, _ = head_node.run("verify", bundle)
    assert document["grouping_drift"] is True
    assert document["drift"][0]["name"] == "cluster"
    assert document["drift"][0]["detail"].startswith("the cluster-wide topology: 2 planned leaves not live")
    assert {kind for _, _, kind in _kinds(document)} == {"grouping"}


def test_applied_in_sync_and_dry_run_documents_say_no_grouping_drift(head_node: FakeHeadNode) -> None:
    bundle = _bundle()
    head_node.serve(bundle)
    code, document, _ = head_node.run("apply", bundle)
    assert (code, document["outcome"], document["grouping_drift"], document["drift"]) == (0, "applied", False, [])
    assert head_node.run("verify", bundle)[1]["outcome"] == "in_sync"
    assert head_node.run("dry-run", bundle)[1]["grouping_drift"] is False


def test_the_planned_base_block_size_comes_from_the_bundles_own_file() -> None:
    yaml_bundle = _bundle(gb=PartitionSettings(block_sizes=(9, 18)))
    conf_bundle = render(plan(snapshot({"gb": gb200_nodes(2)}, version="24.11"))).bundle.document()
    assert conf_bundle["topology_plugin"] == "topology/block"
    assert planned_base_block_sizes(parse_bundle(json.dumps(yaml_bundle))) == {"block-gb": 9}
    assert planned_base_block_sizes(parse_bundle(json.dumps(conf_bundle))) == {"cluster": 18}
