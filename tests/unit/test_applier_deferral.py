"""Nodes re-bound since the plan are deferred, the rest of the signed plan applied (headnode/deferral.py)."""

from __future__ import annotations

import json

import pytest

from tests.helpers import node, p5_nodes, snapshot
from topokeeper.domain.models import Node
from topokeeper.engine.planner import plan
from topokeeper.headnode.bundle import Bundle, parse_bundle
from topokeeper.headnode.deferral import rebound, without_deferred
from topokeeper.headnode.failures import StaleBindings
from topokeeper.render.bundle import render
from topokeeper.wire import content_sha256
from topokeeper.wire_updates import parse_topology_yaml, plan_updates

BINDINGS = {f"p5-{i:03d}": f"10.0.1.{10 + i}" for i in range(1, 9)}


def _bundle(nodes: list[Node], version: str = "26.05") -> Bundle:
    planned = plan(snapshot({"gpu": nodes}, version=version)).model_copy(update={"bindings": BINDINGS})
    return parse_bundle(json.dumps(render(planned).bundle.document()))


def _moved(moves: dict[str, str]) -> list[Node]:
    """p5_nodes(8) with some nodes under another leaf of agg1 (nn-leaf002, or a new one)."""
    return [node(n.name, path=("nn-spine0", "nn-agg1", moves[n.name])) if n.name in moves else n for n in p5_nodes(8)]


def _leaves(bundle: Bundle, topology: str = "tree-gpu") -> dict[str, list[str]]:
    return {name: unit.nodes for name, unit in bundle.topologies[topology].items() if unit.nodes}


def _deferred(*names: str) -> list[list[str]]:
    return [[name, BINDINGS[name], "10.0.9.9"] for name in names]


def test_rebound_nodes_are_deferred_and_powered_down_ones_are_not() -> None:
    bundle = _bundle(p5_nodes(8))
    rows = [[n, a, n, "gpu"] for n, a in BINDINGS.items()]
    rows[0][1], rows[1][1] = "10.0.9.9", "p5-002"  # p5-001 re-bound, p5-002 powered down
    deferred = [["p5-001", "10.0.1.11", "10.0.9.9"], ["p5-008", "10.0.1.18", ""]]  # p5-008: slurmctld lists none
    assert rebound(bundle, rows[:-1]) == (["p5-002"], deferred)


def test_a_deferred_node_stays_in_the_leaf_it_is_in_now_and_the_others_move_as_planned() -> None:
    old = _bundle(p5_nodes(8))
    new = _bundle(_moved({"p5-006": "nn-leaf002", "p5-007": "nn-leaf002"}))

    subset = without_deferred(new, _deferred("p5-006"), old.files["topology.yaml"])

    assert _leaves(subset) == {
        "nn-leaf000": ["p5-001", "p5-002", "p5-003"],
        "nn-leaf001": ["p5-004", "p5-005", "p5-006"],
        "nn-leaf002": ["p5-007", "p5-008"],
    }
    parsed = parse_topology_yaml(subset.files["topology.yaml"])
    assert parsed is not None and parsed["tree-gpu"].units["nn-leaf001"][0] == ["p5-004", "p5-005", "p5-006"]
    # Signed plan and subset are told apart by their content hash; the rest of the bundle is the plan's.
    assert subset.plan_sha256 == content_sha256("topology.yaml", None, subset.files, subset.partitions)
    assert subset.plan_sha256 not in (new.plan_sha256, old.plan_sha256)
    assert (subset.signed_bytes, subset.bindings, subset.nodes) == (new.signed_bytes, new.bindings, new.nodes)
    # The live updates move only the applied node.
    assert plan_updates(old.files["topology.yaml"], subset.files["topology.yaml"]) == (
        [("p5-007", "tree-gpu:root:nn-spine0:nn-agg1:nn-leaf002")],
        "",
    )


def test_a_deferred_node_the_file_has_nowhere_or_in_a_leaf_the_plan_drops_is_left_out_of_the_topology() -> None:
    new = _bundle(p5_nodes(8))
    nowhere = without_deferred(new, _deferred("p5-007"), None)  # no topology file yet
    assert _leaves(nowhere)["nn-leaf001"] == ["p5-004", "p5-005", "p5-006"]
    assert "nodes: p5-[004-006]" in nowhere.files["topology.yaml"].splitlines()[-3]
    gone = _bundle(_moved({"p5-007": "nn-leaf009"}))  # the file now has p5-007 under nn-leaf009, the plan no such leaf
    subset = without_deferred(new, _deferred("p5-007"), gone.files["topology.yaml"])
    assert _leaves(subset)["nn-leaf001"] == ["p5-004", "p5-005", "p5-006"]
    assert all("p5-007" not in nodes for nodes in _leaves(subset).values())


@pytest.mark.parametrize("version", ["26.05", "24.11"])
def test_a_leaf_the_deferred_nodes_would_empty_refuses_the_whole_bundle(version: str) -> None:
    new = _bundle(p5_nodes(8), version)  # nn-leaf002 holds p5-008 alone

    with pytest.raises(StaleBindings) as refused:
        without_deferred(new, _deferred("p5-008"), None)

    topology = "tree-gpu" if version == "26.05" else "topology.conf"
    assert str(refused.value) == (
        "1 node(s) not at the NodeAddr planned: p5-008: 10.0.1.18, now 10.0.9.9; without them"
        f" {topology} nn-leaf002 would hold no node, so none is applied"
    )


def test_topology_conf_keeps_a_deferred_node_where_it_is_too() -> None:
    old = _bundle(p5_nodes(8), "24.11")
    new = _bundle(_moved({"p5-006": "nn-leaf002"}), "24.11")

    subset = without_deferred(new, _deferred("p5-006"), old.files["topology.conf"])

    assert subset.files["topology.conf"] == old.files["topology.conf"]
    assert _leaves(subset, "cluster") == _leaves(old, "cluster")


def test_nothing_deferred_or_nothing_different_is_the_signed_plan_itself() -> None:
    bundle = _bundle(p5_nodes(8))
    assert without_deferred(bundle, [], None) is bundle
    assert without_deferred(bundle, _deferred("p5-004"), bundle.files["topology.yaml"]) is bundle
