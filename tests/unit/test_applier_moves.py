"""The applier's read-back names the nodes found in another leaf switch or block than the plan's."""

from __future__ import annotations

import json

from topokeeper.headnode.bundle import ExpectedUnit
from topokeeper.headnode.grouping import moved_nodes
from topokeeper.headnode.output import new_result, render_result
from topokeeper.wire import parse_show_topology

PLANNED = {
    "spine": ExpectedUnit("switch", ["a1", "a2", "b1", "b2"], ["leaf1", "leaf2"]),
    "leaf1": ExpectedUnit("switch", ["a1", "a2"], []),
    "leaf2": ExpectedUnit("switch", ["b1", "b2"], []),
}


def test_a_node_in_another_leaf_live_is_named_with_both_leaves() -> None:
    live = parse_show_topology(
        "SwitchName=spine Level=1 LinkSpeed=1 Nodes=a[1-2],b[1-2] Switches=leaf[1-2]\n"
        "SwitchName=leaf1 Level=0 LinkSpeed=1 Nodes=a1\n"
        "SwitchName=leaf2 Level=0 LinkSpeed=1 Nodes=a2,b[1-2]\n"
    )
    assert moved_nodes(PLANNED, live) == [{"node": "a2", "planned": "leaf1", "live": "leaf2"}]


def test_a_node_in_no_live_leaf_and_blocks() -> None:
    live = parse_show_topology("SwitchName=leaf1 Level=0 Nodes=a[1-2]\nSwitchName=leaf2 Level=0 Nodes=b1\n")
    assert moved_nodes(PLANNED, live) == [{"node": "b2", "planned": "leaf2", "live": None}]
    blocks = {"us-1": ExpectedUnit("block", ["g1", "g2"], []), "us-2": ExpectedUnit("block", ["g3"], [])}
    live_blocks = parse_show_topology("BlockName=us-1 BlockIndex=0 Nodes=g1 BlockSize=2\nBlockName=us-2 Nodes=g[2-3]")
    assert moved_nodes(blocks, live_blocks) == [{"node": "g2", "planned": "us-1", "live": "us-2"}]
    assert moved_nodes(blocks, parse_show_topology("BlockName=us-1 Nodes=g[1-2]\nBlockName=us-2 Nodes=g3")) == []


def test_the_moves_survive_the_stdout_document_and_are_capped() -> None:
    result = new_result("verify")
    moves = [{"node": f"n{i}", "planned": "leaf1", "live": "leaf2"} for i in range(500)]
    result["readback"] = {"tree-gpu": {"units": 3, "matches": False, "mismatches": ["x"], "moved": moves}}
    document = json.loads(render_result(result))
    kept = document["readback"]["tree-gpu"]["moved"]
    assert 0 < len(kept) < len(moves) and kept == moves[: len(kept)]
