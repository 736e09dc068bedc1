import difflib
import random

import pytest

from tests.helpers import gb200_nodes, node, p5_nodes, snapshot
from topokeeper.contract.errors import InputError
from topokeeper.domain.models import (
    FLAT_DEFAULT,
    NO_TOPOLOGY_SWITCH,
    NO_ULTRASERVER_BLOCK,
    ROOT_SWITCH,
    BlockTopology,
    Node,
    Partition,
    PartitionSettings,
    SlurmFormat,
    TopologyKind,
    TreeTopology,
)
from topokeeper.engine.planner import plan, plan_partition, resolve_kind
from topokeeper.render.bundle import render


def _partition(nodes, **settings) -> Partition:
    return Partition(name="gpu", nodes=tuple(nodes), settings=PartitionSettings(**settings))


@pytest.mark.parametrize(
    ("types", "kind"),
    [
        (["p6e-gb200.36xlarge"], TopologyKind.BLOCK),
        (["trn2u.48xlarge"], TopologyKind.BLOCK),
        (["p5.48xlarge"], TopologyKind.TREE),
        (["p5.48xlarge", "p6-b200.48xlarge"], TopologyKind.TREE),
        (["p6e-gb200.36xlarge", "p5.48xlarge"], TopologyKind.TREE),
        (["p5.48xlarge", "g5.48xlarge"], TopologyKind.FLAT),
        (["p6e-gb200.36xlarge", "c7i.4xlarge"], TopologyKind.FLAT),
        (["c7i.4xlarge"], TopologyKind.FLAT),
    ],
)
def test_resolution_follows_hyperpod(types: list[str], kind: TopologyKind) -> None:
    nodes = [node(f"n{i}", instance_type=t, path=("a", "b", f"c{i}"), ultraserver="us-1") for i, t in enumerate(types)]
    assert resolve_kind(_partition(nodes)) is kind


def test_override_kind_wins() -> None:
    nodes = p5_nodes(4)
    assert resolve_kind(_partition(nodes, kind="flat")) is TopologyKind.FLAT
    assert resolve_kind(_partition(nodes, kind="block")) is TopologyKind.BLOCK


def test_empty_partition_is_flat_with_a_warning() -> None:
    result = plan_partition(_partition([]))
    assert result.kind is TopologyKind.FLAT
    assert result.assignment is None
    assert "no nodes" in result.warnings[0]


def test_tree_has_one_root_and_leaves_named_by_network_nodes() -> None:
    result = plan_partition(_partition(p5_nodes(16)))
    tree = result.topology
    assert isinstance(tree, TreeTopology)
    by_name = {s.name: s for s in tree.switches}
    assert tree.switches[0].name == ROOT_SWITCH
    assert by_name[ROOT_SWITCH].switches == ("nn-spine0",)
    assert by_name["nn-spine0"].switches == ("nn-agg0", "nn-agg1", "nn-agg2")
    assert by_name["nn-agg0"].switches == ("nn-leaf000", "nn-leaf001")
    assert by_name["nn-leaf000"].nodes == ("p5-001", "p5-002", "p5-003")
    assert by_name["nn-leaf001"].nodes == ("p5-004", "p5-005", "p5-006", "p5-007")
    assert result.assignment == "tree-gpu"
    assert result.nodes_without_topology == ()


def test_root_spans_several_top_level_network_nodes() -> None:
    nodes = [node("a1", path=("nn-s1", "nn-x1", "nn-l1")), node("b1", path=("nn-s2", "nn-x2", "nn-l2"))]
    tree = plan_partition(_partition(nodes)).topology
    assert isinstance(tree, TreeTopology)
    assert tree.switches[0].switches == ("nn-s1", "nn-s2")


def test_four_layer_tree() -> None:
    nodes = [
        node(f"b{i}", instance_type="p6-b200.48xlarge", path=("nn-1", "nn-2", f"nn-3{i // 2}", f"nn-4{i}"))
        for i in range(4)
    ]
    tree = plan_partition(_partition(nodes)).topology
    assert isinstance(tree, TreeTopology)
    assert [s.name for s in tree.switches] == [
        "root",
        "nn-1",
        "nn-2",
        "nn-30",
        "nn-31",
        "nn-40",
        "nn-41",
        "nn-42",
        "nn-43",
    ]


def test_nodes_without_topology_stay_schedulable_and_are_counted() -> None:
    nodes = [*p5_nodes(4), node("p5-new")]
    result = plan_partition(_partition(nodes))
    tree = result.topology
    assert isinstance(tree, TreeTopology)
    assert NO_TOPOLOGY_SWITCH in tree.switches[0].switches
    assert {s.name: s for s in tree.switches}[NO_TOPOLOGY_SWITCH].nodes == ("p5-new",)
    assert result.nodes_without_topology == ("p5-new",)
    assert any("without network topology" in w for w in result.warnings)


def test_switch_that_is_both_leaf_and_parent_is_split() -> None:
    nodes = [node("a", path=("nn-s", "nn-x")), node("b", path=("nn-s", "nn-x", "nn-l"))]
    result = plan_partition(_partition(nodes))
    tree = result.topology
    assert isinstance(tree, TreeTopology)
    by_name = {s.name: s for s in tree.switches}
    assert by_name["nn-x"].nodes == ()
    assert by_name["nn-x"].switches == ("nn-l", "nn-x-nodes")
    assert by_name["nn-x-nodes"].nodes == ("a",)
    assert all(not (s.nodes and s.switches) for s in tree.switches)


def test_inconsistent_parents_and_cycles_still_give_a_tree() -> None:
    nodes = [
        node("a", path=("nn-p", "nn-q", "nn-l1")),
        node("b", path=("nn-q", "nn-p", "nn-l2")),
        node("c", path=("nn-r", "nn-q", "nn-l3")),
    ]
    result = plan_partition(_partition(nodes))
    tree = result.topology
    assert isinstance(tree, TreeTopology)
    parents: dict[str, list[str]] = {}
    for switch in tree.switches:
        for child in switch.switches:
            parents.setdefault(child, []).append(switch.name)
    assert all(len(p) == 1 for p in parents.values())
    reachable, frontier = set(), [ROOT_SWITCH]
    while frontier:
        current = frontier.pop()
        reachable.add(current)
        frontier += list({s.name: s for s in tree.switches}[current].switches)
    assert reachable == {s.name for s in tree.switches}
    assert result.warnings


def test_block_per_ultraserver_sized_by_instance_type() -> None:
    result = plan_partition(_partition(gb200_nodes(2)))
    blocks = result.topology
    assert isinstance(blocks, BlockTopology)
    assert blocks.block_sizes == (18,)
    assert [b.name for b in blocks.blocks] == ["us-0000", "us-0001"]
    assert all(len(b.nodes) == 18 for b in blocks.blocks)
    assert result.assignment == "block-gpu"


def test_slurm_nodes_without_an_instance_are_written_without_topology() -> None:
    """Powered-down ParallelCluster dynamic nodes: under no-topology (tree) or in the trailing block."""
    asleep = [Node(name=f"q1-dy-{i}", partition="gpu", status="NoInstance") for i in (1, 2)]
    tree = plan_partition(Partition(name="gpu", nodes=(*p5_nodes(4), *asleep), instance_types=("p5.48xlarge",)))
    # No instance is not missing topology: nothing EC2 could still report, so nothing to ask again for.
    assert (tree.kind, tree.nodes_without_instance, tree.nodes_without_topology) == (
        TopologyKind.TREE,
        ("q1-dy-1", "q1-dy-2"),
        (),
    )
    assert isinstance(tree.topology, TreeTopology)
    assert {s.name: s.nodes for s in tree.topology.switches}[NO_TOPOLOGY_SWITCH] == ("q1-dy-1", "q1-dy-2")
    assert not any("without network topology data" in w for w in tree.warnings)
    only_asleep = plan_partition(Partition(name="gpu", nodes=tuple(asleep), instance_types=("p5.48xlarge",)))
    assert (only_asleep.kind, only_asleep.nodes_without_instance) == (TopologyKind.TREE, ("q1-dy-1", "q1-dy-2"))
    unreported = Node(name="q1-st-9", instance_id="i-0000000000000009a", instance_type="p5.48xlarge", partition="gpu")
    mixed = plan_partition(
        Partition(name="gpu", nodes=(*p5_nodes(4), unreported, *asleep), instance_types=("p5.48xlarge",))
    )
    assert (mixed.nodes_without_instance, mixed.nodes_without_topology) == (("q1-dy-1", "q1-dy-2"), ("q1-st-9",))
    blocks = plan_partition(
        Partition(name="gpu", nodes=(*gb200_nodes(1), *asleep), instance_types=("p6e-gb200.36xlarge",))
    )
    assert isinstance(blocks.topology, BlockTopology)
    assert (blocks.topology.blocks[-1].name, blocks.topology.blocks[-1].nodes) == (
        NO_ULTRASERVER_BLOCK,
        ("q1-dy-1", "q1-dy-2"),
    )


def test_block_sizes_do_not_follow_live_counts() -> None:
    nodes = gb200_nodes(2)[:-1]  # one failed instance
    blocks = plan_partition(_partition(nodes)).topology
    assert isinstance(blocks, BlockTopology)
    assert blocks.block_sizes == (18,)
    assert [len(b.nodes) for b in blocks.blocks] == [18, 17]


def test_block_sizes_from_config() -> None:
    blocks = plan_partition(_partition(gb200_nodes(2), block_sizes=(17,))).topology
    assert isinstance(blocks, BlockTopology)
    assert blocks.block_sizes == (17,)


def test_blocks_are_ordered_by_network_proximity_then_id() -> None:
    nodes = [
        node("z1", "p6e-gb200.36xlarge", ("nn-s", "nn-agg-b", "nn-l1"), ultraserver="us-a"),
        node("z2", "p6e-gb200.36xlarge", ("nn-s", "nn-agg-a", "nn-l2"), ultraserver="us-z"),
        node("z3", "p6e-gb200.36xlarge", ("nn-s", "nn-agg-a", "nn-l3"), ultraserver="us-m"),
        node("z4", "p6e-gb200.36xlarge", (), ultraserver="us-b"),
    ]
    blocks = plan_partition(_partition(nodes)).topology
    assert isinstance(blocks, BlockTopology)
    assert [b.name for b in blocks.blocks] == ["us-m", "us-z", "us-a", "us-b"]


def test_node_without_ultraserver_goes_to_a_trailing_block() -> None:
    nodes = [*gb200_nodes(1), node("gb-new", "p6e-gb200.36xlarge", ("nn-gbspine", "nn-gbagg0", "nn-gbleaf0"))]
    result = plan_partition(_partition(nodes))
    blocks = result.topology
    assert isinstance(blocks, BlockTopology)
    assert blocks.blocks[-1].name == NO_ULTRASERVER_BLOCK
    assert blocks.blocks[-1].nodes == ("gb-new",)
    assert result.nodes_without_topology == ("gb-new",)


def test_block_without_known_size_needs_config() -> None:
    with pytest.raises(InputError) as error:
        plan_partition(_partition(p5_nodes(4), kind="block"))
    assert error.value.field == "partitions.gpu.block_sizes"


def test_flat_partition_has_no_assignment() -> None:
    result = plan_partition(_partition([node("c1", "c7i.4xlarge")]))
    assert (result.kind, result.assignment, result.topology.name) == (TopologyKind.FLAT, None, FLAT_DEFAULT)


def test_long_partition_name_is_refused_naming_the_partition() -> None:
    long_name = "p" * 60
    with pytest.raises(InputError) as error:
        plan_partition(Partition(name=long_name, nodes=tuple(p5_nodes(2, partition=long_name))))
    assert error.value.field == f"partitions.{long_name}"


def test_yaml_format_plan_has_per_partition_assignments() -> None:
    result = plan(
        snapshot(
            {
                "p5": p5_nodes(8, partition="p5"),
                "gb": gb200_nodes(2),
                "cpu": [node("c1", "c7i.4xlarge", partition="cpu")],
            }
        )
    )
    assert result.slurm_format is SlurmFormat.YAML
    assert {p.partition: p.assignment for p in result.partitions} == {"p5": "tree-p5", "gb": "block-gb", "cpu": None}
    assert result.cluster_topology is None


@pytest.mark.parametrize(
    ("partitions", "plugin", "kind"),
    [
        ({"p5": p5_nodes(8, partition="p5"), "gb": gb200_nodes(1)}, "topology/tree", TopologyKind.TREE),
        ({"gb": gb200_nodes(2)}, "topology/block", TopologyKind.BLOCK),
        ({"cpu": [node("c1", "c7i.4xlarge", partition="cpu")]}, "topology/default", TopologyKind.FLAT),
    ],
)
def test_conf_format_has_one_cluster_topology(partitions, plugin: str, kind: TopologyKind) -> None:
    result = plan(snapshot(partitions, version="24.11"))
    assert result.slurm_format is SlurmFormat.CONF
    assert result.topology_plugin == plugin
    assert result.cluster_topology is not None and result.cluster_topology.kind is kind
    assert all(p.assignment is None for p in result.partitions)


def test_conf_tree_covers_every_managed_node() -> None:
    cpu = [node("c1", "c7i.4xlarge", partition="cpu")]
    result = plan(snapshot({"p5": p5_nodes(8, partition="p5"), "gb": gb200_nodes(1), "cpu": cpu}, version="24.11"))
    tree = result.cluster_topology
    assert isinstance(tree, TreeTopology)
    listed = [n for s in tree.switches for n in s.nodes]
    assert sorted(listed) == sorted(result.nodes)


def _files(partitions, version="26.05") -> dict[str, str]:
    return render(plan(snapshot(partitions, version=version))).files()


def test_same_facts_in_any_order_give_the_same_bytes() -> None:
    nodes = p5_nodes(40, partition="p5")
    gb = gb200_nodes(3)
    expected = _files({"p5": nodes, "gb": gb})
    shuffler = random.Random(7)
    for _ in range(5):
        shuffler.shuffle(nodes)
        shuffler.shuffle(gb)
        assert _files({"p5": list(nodes), "gb": list(gb)}) == expected


def test_adding_one_node_changes_only_its_lines() -> None:
    before = _files({"p5": p5_nodes(16, partition="p5")})["topology.yaml"].splitlines()
    extra = node("p5-100", path=("nn-spine0", "nn-agg0", "nn-leaf000"), partition="p5")
    after = _files({"p5": [*p5_nodes(16, partition="p5"), extra]})["topology.yaml"].splitlines()
    changed = [line for line in difflib.unified_diff(before, after, lineterm="", n=0) if line[:1] in "+-"]
    assert changed == ["--- ", "+++ ", "-        nodes: p5-[001-003]", "+        nodes: p5-[001-003,100]"]


def test_adding_a_leaf_adds_its_switch_and_its_parent_line_only() -> None:
    before = _files({"p5": p5_nodes(8, partition="p5")})["topology.yaml"].splitlines()
    extra = node("p5-200", path=("nn-spine0", "nn-agg0", "nn-leafnew"), partition="p5")
    after = _files({"p5": [*p5_nodes(8, partition="p5"), extra]})["topology.yaml"].splitlines()
    changed = [line for line in difflib.unified_diff(before, after, lineterm="", n=0) if line[:1] in "+-"][2:]
    assert changed == [
        "-        children: nn-leaf000,nn-leaf001",
        "+        children: nn-leaf000,nn-leaf001,nn-leafnew",
        "+      - switch: nn-leafnew",
        "+        nodes: p5-200",
    ]


def test_one_node_of_an_unknown_type_turning_a_partition_flat_is_named() -> None:
    nodes = [*p5_nodes(16), node("odd-1", "ml.p5.4xlarge", ())]
    result = plan_partition(_partition(nodes))
    assert result.kind is TopologyKind.FLAT
    (warning,) = result.warnings
    assert "odd-1" in warning and "p5.4xlarge" in warning and "flat" in warning


def test_a_typo_in_an_instance_type_is_named_with_the_rule_that_made_the_partition_flat() -> None:
    result = plan_partition(_partition([*p5_nodes(16), node("odd-1", "ml.p5.48xlargee", ())]))
    (warning,) = result.warnings
    assert result.kind is TopologyKind.FLAT and "p5.48xlargee (odd-1)" in warning and "rule" in warning


def test_a_partition_flat_by_config_or_of_cpu_types_only_is_no_surprise() -> None:
    assert plan_partition(_partition(p5_nodes(4), kind="flat")).warnings == ()
    assert plan_partition(_partition([node("c1", "c7i.4xlarge")])).warnings == ()


def test_a_size_of_a_topology_family_without_topology_data_is_named_even_alone() -> None:
    (warning,) = plan_partition(_partition([node("n1", "p5.4xlarge"), node("n2", "p5.4xlarge")])).warnings
    assert "p5.4xlarge (n1, n2)" in warning


def test_block_sizes_above_the_ultraserver_size_are_refused_naming_the_key() -> None:
    with pytest.raises(InputError) as error:
        plan_partition(_partition(gb200_nodes(2), block_sizes=(20,)))
    assert error.value.field == "partitions.gpu.block_sizes"
    assert "18" in str(error.value)


def test_what_24_11_folds_into_its_one_topology_is_said() -> None:
    cpu = [node("c1", "c7i.4xlarge", partition="cpu")]
    result = plan(snapshot({"p5": p5_nodes(8, partition="p5"), "gb": gb200_nodes(1), "cpu": cpu}, version="24.11"))
    folded = [w for w in result.warnings if w.startswith("Slurm 24.11")]
    assert any("block partition gb" in w and "tree" in w for w in folded), result.warnings
    assert any("flat partition cpu" in w and "c1" in w and "no-topology" in w for w in folded), result.warnings
    assert not any("partition p5" in w for w in folded)


def test_nothing_is_folded_on_25_05_or_when_the_kinds_agree() -> None:
    partitions = {"p5": p5_nodes(8, partition="p5"), "gb": gb200_nodes(1)}
    assert not plan(snapshot(partitions, version="26.05")).warnings
    assert not [w for w in plan(snapshot({"gb": gb200_nodes(2)}, version="24.11")).warnings if "fold" in w]
