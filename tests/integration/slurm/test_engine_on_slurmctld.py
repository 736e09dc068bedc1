"""Every rendered file loads into a real slurmctld, reads back as planned, and places jobs by topology."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers import gb200_nodes, node, snapshot
from topokeeper.cli.planning import plan_from_files
from topokeeper.domain.models import BlockTopology, PartitionSettings, TreeTopology
from topokeeper.engine.planner import plan
from topokeeper.render.bundle import RenderedPlan, render
from topokeeper.sim.slurm_chroot import SlurmController, unexpected_log_lines
from topokeeper.wire import parse_show_topology

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
pytestmark = pytest.mark.slurm

# Expected with topology.yaml: each topology covers only its own partition's nodes (slurm-facts §5).
EXPECTED_NOISE = (
    "switches lack access to",
    "Blocks lack access to",
    "TOPOLOGY: no switch can reach all nodes",
    # 24.11 on a fresh StateSaveLocation (the harness starts clean):
    "Could not open job state file",
    "Could not open reservation state file",
    "Trying backup state save file",
)


def _load(controller: SlurmController, rendered: RenderedPlan, assign: bool = True) -> None:
    partitions = {p.partition: (p.nodes, p.assignment if assign else None) for p in rendered.plan.partitions}
    extra = [f"TopologyPlugin={rendered.plan.topology_plugin}"] if rendered.plan.topology_plugin else []
    controller.prepare(rendered.plan.nodes, partitions, extra)
    controller.write_file(rendered.plan.slurm_format.value, rendered.topology_text)
    controller.start()


def _unexpected_log_lines(controller: SlurmController) -> list[str]:
    return unexpected_log_lines(controller.log_text(), EXPECTED_NOISE)


def _assert_live_matches(controller: SlurmController, topology: TreeTopology | BlockTopology, name: str | None) -> None:
    live = parse_show_topology(controller.show_topology(name))
    if isinstance(topology, TreeTopology):
        assert set(live) == {s.name for s in topology.switches}
        for switch in topology.switches:
            if switch.nodes:
                assert live[switch.name]["nodes"] == sorted(switch.nodes), switch.name
                assert live[switch.name]["level"] == 0
            else:
                assert live[switch.name]["switches"] == sorted(switch.switches), switch.name
    else:
        assert set(live) == {b.name for b in topology.blocks}
        for block in topology.blocks:
            assert live[block.name]["nodes"] == sorted(block.nodes), block.name
            assert live[block.name]["size"] == topology.block_sizes[0]


def test_mixed_cluster_yaml_loads_on_26_05(sid_root: Path, controllers) -> None:
    rendered = plan_from_files(EXAMPLES / "mixed-cluster.json", None, None)
    controller = controllers(sid_root)
    _load(controller, rendered)

    assert "26.05" in controller.run("scontrol", "version").stdout
    assignments = controller.partition_topologies()
    for partition in rendered.plan.partitions:
        assert assignments[partition.partition] == partition.assignment
        if partition.assignment:
            assert isinstance(partition.topology, TreeTopology | BlockTopology)
            _assert_live_matches(controller, partition.topology, partition.assignment)
    assert assignments["dev"] is None
    assert controller.show_topology() == ""  # the cluster default is flat
    assert _unexpected_log_lines(controller) == []


def test_mixed_cluster_places_jobs_by_topology(yaml_root: Path, controllers) -> None:
    rendered = plan_from_files(EXAMPLES / "mixed-cluster.json", None, None)
    controller = controllers(yaml_root)
    _load(controller, rendered)
    by_partition = {p.partition: p for p in rendered.plan.partitions}

    tree = by_partition["ml-p5"].topology
    assert isinstance(tree, TreeTopology)
    leaves = [set(s.nodes) for s in tree.switches if s.nodes and s.name != "no-topology"]
    first = controller.job_nodes(controller.submit("ml-p5", 1))
    whole_leaf = set(_expand(controller.job_nodes(controller.submit("ml-p5", 4))))
    assert whole_leaf in leaves and first not in whole_leaf
    three = set(_expand(controller.job_nodes(controller.submit("ml-p5", 3))))
    assert any(three <= leaf for leaf in leaves)

    blocks = by_partition["ml-p6e"].topology
    assert isinstance(blocks, BlockTopology)
    block_sets = [set(b.nodes) for b in blocks.blocks]
    controller.job_nodes(controller.submit("ml-p6e", 1))
    four = set(_expand(controller.job_nodes(controller.submit("ml-p6e", 4))))
    assert any(four <= block for block in block_sets)
    full = set(_expand(controller.job_nodes(controller.submit("ml-p6e", 18))))
    assert full in block_sets


def test_flat_partition_spans_any_nodes(sid_root: Path, controllers) -> None:
    rendered = plan_from_files(EXAMPLES / "mixed-cluster.json", None, None)
    controller = controllers(sid_root)
    _load(controller, rendered)
    assert len(_expand(controller.job_nodes(controller.submit("preprocess", 4)))) == 4


def _expand(hostlist: str) -> list[str]:
    from topokeeper.wire import expand

    return expand(hostlist)


def test_block_sizes_with_aggregation_and_orphans_load(yaml_root: Path, controllers) -> None:
    orphan = node("gb-900", "p6e-gb200.36xlarge", ("nn-gbspine", "nn-gbagg0", "nn-gbleaf0"), partition="gb")
    settings = {"gb": PartitionSettings(block_sizes=(17, 34))}
    rendered = render(plan(snapshot({"gb": [*gb200_nodes(4, size=17), orphan]}, settings=settings)))
    controller = controllers(yaml_root)
    _load(controller, rendered)
    topology = rendered.plan.partitions[0].topology
    assert isinstance(topology, BlockTopology)
    _assert_live_matches(controller, topology, "block-gb")
    assert "AggregatedBlock=" in controller.show_topology("block-gb")
    assert _unexpected_log_lines(controller) == []
    # The orphan stays schedulable.
    assert controller.job_nodes(controller.submit("gb", 1, "-w", "gb-900")) == "gb-900"


def test_four_layer_tree_and_missing_topology_load(sid_root: Path, controllers) -> None:
    nodes = [
        node(f"b-{i:02d}", "p6-b200.48xlarge", ("nn-1", "nn-2", f"nn-3{i // 4}", f"nn-4{i // 2}"), partition="b200")
        for i in range(8)
    ]
    nodes.append(node("b-99", "p6-b200.48xlarge", (), partition="b200"))
    rendered = render(plan(snapshot({"b200": nodes})))
    controller = controllers(sid_root)
    _load(controller, rendered)
    topology = rendered.plan.partitions[0].topology
    assert isinstance(topology, TreeTopology)
    _assert_live_matches(controller, topology, "tree-b200")
    live = parse_show_topology(controller.show_topology("tree-b200"))
    assert live["root"]["level"] == 4
    assert _unexpected_log_lines(controller) == []
    # A multi-node job can use the node without topology data together with the others.
    assert "b-99" in _expand(controller.job_nodes(controller.submit("b200", 9)))


def test_64_character_names_are_accepted(sid_root: Path, controllers) -> None:
    long_switch = "nn-" + "a" * 61
    long_node = "node-" + "x" * 54 + "-0001"
    assert len(long_switch) == len(long_node) == 64
    nodes = [
        node(long_node, path=("nn-top", long_switch), partition="p5"),
        node("p5-1", path=("nn-top", "nn-x"), partition="p5"),
    ]
    rendered = render(plan(snapshot({"p5": nodes})))
    controller = controllers(sid_root)
    _load(controller, rendered)
    live = parse_show_topology(controller.show_topology("tree-p5"))
    assert live[long_switch]["nodes"] == [long_node]


def test_p5_cluster_conf_loads_on_24_11(trixie_root: Path, controllers) -> None:
    rendered = plan_from_files(EXAMPLES / "p5-cluster-slurm-24.11.json", None, None)
    assert rendered.plan.topology_plugin == "topology/tree"
    controller = controllers(trixie_root)
    _load(controller, rendered)
    assert "24.11" in controller.run("scontrol", "version").stdout
    topology = rendered.plan.cluster_topology
    assert isinstance(topology, TreeTopology)
    for switch in topology.switches:
        live = parse_show_topology(controller.show_topology(switch.name))
        assert switch.name in live
        if switch.nodes:
            assert live[switch.name]["nodes"] == sorted(switch.nodes)
    assert _unexpected_log_lines(controller) == []
    leaves = [set(s.nodes) for s in topology.switches if s.nodes and s.name != "no-topology"]
    controller.job_nodes(controller.submit("ml-p5", 1))
    four = set(_expand(controller.job_nodes(controller.submit("ml-p5", 4))))
    assert four in leaves


@pytest.mark.parametrize("version", ["24.11"])
def test_mixed_cluster_conf_on_24_11_covers_every_partition(trixie_root: Path, controllers, version: str) -> None:
    rendered = plan_from_files(EXAMPLES / "mixed-cluster.json", None, version)
    assert rendered.plan.topology_plugin == "topology/tree"
    assert "Topology=" not in json.dumps(rendered.bundle.partitions)
    controller = controllers(trixie_root)
    _load(controller, rendered, assign=False)
    assert _unexpected_log_lines(controller) == []
    # Multi-node jobs run in every partition, flat ones included (pitfall P3 in slurm-facts).
    for partition, count in (("ml-p5", 4), ("ml-p6e", 18), ("preprocess", 4)):
        assert len(_expand(controller.job_nodes(controller.submit(partition, count)))) == count


def test_block_only_cluster_conf_on_24_11(trixie_root: Path, controllers) -> None:
    rendered = render(plan(snapshot({"gb": gb200_nodes(2)}, version="24.11")))
    assert rendered.plan.topology_plugin == "topology/block"
    controller = controllers(trixie_root)
    _load(controller, rendered, assign=False)
    assert _unexpected_log_lines(controller) == []
    blocks = rendered.plan.cluster_topology
    assert isinstance(blocks, BlockTopology)
    controller.job_nodes(controller.submit("gb", 1))
    full = set(_expand(controller.job_nodes(controller.submit("gb", 18))))
    assert full in [set(b.nodes) for b in blocks.blocks]


def test_incomplete_ultraserver_on_24_11_falls_back_to_tree(trixie_root: Path, controllers) -> None:
    """24.11 refuses blocks below the base size; the planner must never render one."""
    cpu = [node(f"c-{i}", "c7i.4xlarge", partition="cpu") for i in range(3)]
    rendered = render(plan(snapshot({"gb": gb200_nodes(2)[:-1], "cpu": cpu}, version="24.11")))
    assert rendered.plan.topology_plugin == "topology/tree"
    assert any("fatal before Slurm 25.05" in w for w in rendered.plan.warnings)
    controller = controllers(trixie_root)
    _load(controller, rendered, assign=False)
    assert _unexpected_log_lines(controller) == []
    assert len(_expand(controller.job_nodes(controller.submit("gb", 17)))) == 17
    assert len(_expand(controller.job_nodes(controller.submit("cpu", 3)))) == 3
