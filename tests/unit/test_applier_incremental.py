"""Which plan changes the head node applies by live node updates, and the update batches (headnode/incremental.py)."""

from __future__ import annotations

import pytest

from tests.helpers import gb200_nodes, node, p5_nodes, snapshot
from topokeeper.domain.models import Node, PartitionSettings
from topokeeper.engine.planner import plan
from topokeeper.headnode.bundle import Bundle, ExpectedUnit
from topokeeper.headnode.cloud import without_nodes
from topokeeper.headnode.grouping import compare_grouping, compare_units, moved_nodes
from topokeeper.headnode.registered import live_values
from topokeeper.headnode.scontrol import LiveTopologies, LiveTopology
from topokeeper.render.bundle import render
from topokeeper.wire import parse_show_topology
from topokeeper.wire_updates import ParsedTopology, eligibility, parse_topology_yaml, plan_updates


def _text(gpu: list[Node] | None = None, gb: list[Node] | None = None, **settings: PartitionSettings) -> str:
    partitions = {"gpu": p5_nodes(8) if gpu is None else gpu, "gb": gb200_nodes(2) if gb is None else gb}
    return render(plan(snapshot(partitions, settings=settings))).topology_text


def _moved(name: str, *path: str) -> list[Node]:
    return [node(name, path=path) if n.name == name else n for n in p5_nodes(8)]


def test_the_rendered_file_parses_in_file_order() -> None:
    parsed = parse_topology_yaml(_text())
    assert parsed is not None
    assert list(parsed) == ["flat-default", "block-gb", "tree-gpu"]
    assert (parsed["flat-default"].kind, parsed["flat-default"].cluster_default) == ("flat", True)
    assert (parsed["block-gb"].kind, parsed["block-gb"].block_sizes) == ("block", (18,))
    assert parsed["tree-gpu"].units["nn-leaf000"] == (["p5-001", "p5-002", "p5-003"], [])
    assert parsed["tree-gpu"].units["nn-agg0"] == ([], ["nn-leaf000", "nn-leaf001"])


@pytest.mark.parametrize(
    "edit",
    [
        lambda text: text.replace("  flat: true", "  flat: true\n  extra: 1"),  # a key this parser does not know
        lambda text: text + "      - switch: nn-leaf000\n        nodes: p5-001\n",  # defined twice
        lambda text: text.replace("nodes: p5-008", "nodes: p5-[a,b]"),  # not a Slurm hostlist
    ],
    ids=["unknown-key", "duplicate-switch", "bad-hostlist"],
)
def test_a_file_in_another_layout_is_not_parsed(edit) -> None:
    assert parse_topology_yaml(edit(_text())) is None


def test_a_move_between_existing_leaves_is_one_batch_with_the_whole_path() -> None:
    batches, why = plan_updates(_text(), _text(gpu=_moved("p5-003", "nn-spine0", "nn-agg0", "nn-leaf001")))
    assert (batches, why) == ([("p5-003", "tree-gpu:root:nn-spine0:nn-agg0:nn-leaf001")], "")


def test_a_new_leaf_and_intermediate_switch_under_an_existing_one() -> None:
    batches, _ = plan_updates(_text(), _text(gpu=_moved("p5-007", "nn-spine0", "nn-agg2", "nn-leaf004")))
    assert batches == [("p5-007", "tree-gpu:root:nn-spine0:nn-agg2:nn-leaf004")]


def test_nodes_joining_an_existing_block_are_batched_per_destination_as_a_hostlist() -> None:
    nodes = gb200_nodes(2)
    batches, _ = plan_updates(_text(gb=nodes[:15] + nodes[18:30]), _text())
    assert batches == [("gb-[016-018]", "block-gb:us-0000"), ("gb-[031-036]", "block-gb:us-0001")]


def test_a_node_leaving_every_topology_gets_an_empty_placement() -> None:
    batches, _ = plan_updates(_text(gpu=p5_nodes(6)), _text(gpu=p5_nodes(5)))
    assert batches == [("p5-006", "")]


def test_a_node_in_two_topologies_is_given_both() -> None:
    old = _text()
    new = old.replace("nodes: gb-[019-036]", "nodes: gb-[019-036],p5-008")
    batches, _ = plan_updates(old, new)
    assert batches == [("p5-008", "block-gb:us-0001,tree-gpu:root:nn-spine0:nn-agg1:nn-leaf002")]


@pytest.mark.parametrize(
    ("new", "why"),
    [
        (lambda: _text(gb=gb200_nodes(3)), "topology block-gb adds, removes or reorders blocks"),
        (
            lambda: _text().replace("      - 18\n", "      - 9\n"),
            "topology block-gb changes block_sizes",
        ),
        (lambda: _text(gb=[]), "the topologies or their order change"),
        (
            lambda: _text().replace(_AGG1, "").replace("0,nn-agg1", "0"),  # nn-agg1 goes, its leaf stays (a top)
            "topology tree-gpu moves switch nn-leaf002 to another parent",
        ),
        (
            lambda: _text().replace(_AGG1, "").replace("0,nn-agg1", "0").replace(_AGG0, _AGG0 + ",nn-leaf002"),
            "topology tree-gpu moves switch nn-leaf002 to another parent",  # ... or under nn-agg0
        ),
        (lambda: _text().replace(_ROOT, ""), "topology tree-gpu removes top switches (root)"),
        (lambda: _text().replace("- topology: tree-gpu", "- topology: tree-gpu\n  bogus: 1"), "the plan is not in"),
    ],
    ids=["new-block", "block-sizes", "removed-topology", "orphan", "re-parented", "removed-top", "unparsable"],
)
def test_what_only_a_reconfigure_can_load_is_refused_with_a_reason(new, why: str) -> None:
    batches, reason = plan_updates(_text(), new())
    assert batches is None
    assert reason.startswith(why)


_AGG1 = "      - switch: nn-agg1\n        children: nn-leaf002\n"
_AGG0 = "children: nn-leaf000,nn-leaf001"
_ROOT = "      - switch: root\n        children: nn-spine0\n"


def test_switches_whose_nodes_all_leave_go_from_the_file_and_the_nodes_move_live() -> None:
    """Slurm keeps a switch emptied by the updates (headnode/incremental.py); nothing under it stays in the plan."""
    unplaced = [node("p5-008") if n.name == "p5-008" else n for n in p5_nodes(8)]  # EC2 has not described it yet
    batches, why = plan_updates(_text(gpu=unplaced), _text())  # the no-topology placeholder loses its last node
    assert (batches, why) == ([("p5-008", "tree-gpu:root:nn-spine0:nn-agg1:nn-leaf002")], "")
    batches, why = plan_updates(_text(), _text(gpu=_moved("p5-008", "nn-spine1", "nn-agg9", "nn-leaf009")))
    assert (batches, why) == ([("p5-008", "tree-gpu:root:nn-spine1:nn-agg9:nn-leaf009")], "")  # nn-agg1's subtree
    assert plan_updates(_text(), _text(gpu=p5_nodes(4)))[0] == [("p5-[005-008]", "")]  # out of the topology


# As slurmctld 26.05.5 and 25.11.7 show a tree after `scontrol update NodeName=.. Topology=t:top:spine:leafB` moved
# the last nodes out of no-topology and leafC: both kept, empty, and listed under their parents.
_EMPTIED = """SwitchName=top Level=2 LinkSpeed=0 Nodes=n[1-6] Switches=spine,spine2,no-topology
SwitchName=spine2 Level=1 LinkSpeed=0 Nodes= Switches=leafC
SwitchName=leafC Level=0 LinkSpeed=0 Nodes=
SwitchName=spine Level=1 LinkSpeed=0 Nodes=n[1-6] Switches=leafA,leafB
SwitchName=leafA Level=0 LinkSpeed=0 Nodes=n[1-2]
SwitchName=leafB Level=0 LinkSpeed=0 Nodes=n[3-6]
SwitchName=no-topology Level=0 LinkSpeed=0 Nodes=
"""
_PLANNED = {
    "top": ExpectedUnit("switch", ["n1", "n2", "n3", "n4", "n5", "n6"], ["spine"]),
    "spine": ExpectedUnit("switch", ["n1", "n2", "n3", "n4", "n5", "n6"], ["leafA", "leafB"]),
    "leafA": ExpectedUnit("switch", ["n1", "n2"], []),
    "leafB": ExpectedUnit("switch", ["n3", "n4", "n5", "n6"], []),
}


def test_the_read_back_passes_over_emptied_switches_but_not_one_holding_a_node() -> None:
    live = parse_show_topology(_EMPTIED)
    assert compare_units(_PLANNED, live) == []
    assert (moved_nodes(_PLANNED, live), compare_grouping(_PLANNED, None, live)) == ([], [])
    held = parse_show_topology(_EMPTIED.replace("leafB Level=0 LinkSpeed=0 Nodes=n[3-6]", "leafB Nodes=n[3-5]"))
    held["no-topology"]["nodes"] = ["n6"]
    assert compare_units(_PLANNED, held) == [
        "switch no-topology: not in the plan",
        "switch leafB: nodes 1 missing (n6)",
        "switch top: switches 1 not in the plan (no-topology)",
    ]


def test_an_emptied_switch_is_passed_over_beside_nodes_left_to_registration() -> None:
    """The prune of a leaf whose nodes are left to their slurmd (cloud.without_nodes) and an emptied switch."""
    planned = dict(_PLANNED, top=_PLANNED["top"]._replace(switches=["spine", "leafR"]))
    planned["leafR"] = ExpectedUnit("switch", ["n7"], [])
    bundle = Bundle("sha", "topology.yaml", None, {}, {"gpu": "t"}, [], {"t": planned}, {})
    live = LiveTopologies(None)  # type: ignore[arg-type]
    live.shown_value["t"] = LiveTopology(parse_show_topology(_EMPTIED), "")
    stripped, topologies = without_nodes(bundle, live, frozenset({"n7"}), prune=True)
    assert compare_units(stripped.topologies["t"], topologies.get("t").units) == []
    # Where the registration route finds nodes (registered.py): the emptied switches place none.
    paths = live_values({"t": ParsedTopology("tree", False, (), {})}, live)
    assert paths == {f"n{i}": "t:top:spine:" + ("leafA" if i < 3 else "leafB") for i in range(1, 7)}


def test_eligibility_gates_on_version_format_and_slurm_conf() -> None:
    old, new = _text(), _text(gpu=_moved("p5-003", "nn-spine0", "nn-agg0", "nn-leaf001"))
    assert eligibility((26, 5, 5), "topology.yaml", [], old, new)[0] == [
        ("p5-003", "tree-gpu:root:nn-spine0:nn-agg0:nn-leaf001")
    ]
    assert eligibility((25, 11, 7), "topology.yaml", [], old, new)[0] == [
        ("p5-003", "tree-gpu:root:nn-spine0:nn-agg0:nn-leaf001")
    ]
    assert eligibility((25, 5, 6), "topology.yaml", [], old, new) == (
        None,
        "live topology updates are proven from Slurm 25.11 only",
    )
    assert eligibility((24, 11, 5), "topology.conf", [], old, new) == (
        None,
        "topology.conf is loaded by reconfigure only",
    )
    assert eligibility((26, 5, 5), "topology.yaml", ["slurm.conf"], old, new) == (None, "slurm.conf changes too")
    assert eligibility((26, 5, 5), "topology.yaml", [], None, new) == (None, "no topology.yaml yet")
