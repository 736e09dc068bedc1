"""The applier's node table and bindings (ParallelCluster binds node names to instances by NodeAddr), on
the fake ``scontrol`` of test_applier_run (the real slurmctld: tests/integration/slurm)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import p5_nodes, snapshot
from tests.integration.head_node.test_applier_run import FakeHeadNode
from topokeeper.engine.planner import plan
from topokeeper.render.bundle import render
from topokeeper.wire import MAX_STDOUT_CHARS, bindings_sha256

ADDRESSES = {f"p5-{i:03d}": f"10.0.1.{10 + i}" for i in range(1, 9)}


@pytest.fixture
def head_node(tmp_path: Path) -> FakeHeadNode:
    return FakeHeadNode(tmp_path)


def _bound_bundle(bindings: dict[str, str]) -> dict[str, Any]:
    planned = plan(snapshot({"gpu": p5_nodes(8)})).model_copy(update={"bindings": bindings})
    return render(planned).bundle.document()


def test_every_result_carries_the_node_table(head_node: FakeHeadNode) -> None:
    bundle = _bound_bundle(ADDRESSES)
    head_node.serve(bundle, addresses=ADDRESSES)

    _, document, _ = head_node.run("verify", bundle)

    assert document["slurm_nodes"][:2] == [["p5-001", "10.0.1.11", "p5-001", ""], ["p5-002", "10.0.1.12", "p5-002", ""]]
    assert len(document["slurm_nodes"]) == 8 and "slurm_nodes" not in document["dropped"]


def test_a_node_rebound_since_the_plan_is_deferred_and_the_rest_would_apply(head_node: FakeHeadNode) -> None:
    bundle = _bound_bundle(ADDRESSES)
    head_node.serve(bundle, addresses={**ADDRESSES, "p5-003": "10.0.1.99"})  # resumed on another instance

    code, document, _ = head_node.run("dry-run", bundle)

    assert (code, document["outcome"], document["error"]) == (0, "would_apply", None)
    assert document["deferred"] == [["p5-003", "10.0.1.13", "10.0.1.99"]]
    assert "+        nodes: p5-[001-002]" in document["diff"].splitlines()  # no file had it: in no switch


def test_a_rebound_node_alone_in_its_leaf_is_stale_bindings_and_nothing_is_written(head_node: FakeHeadNode) -> None:
    """Without it the plan's leaf would hold no node: the whole bundle is refused, as before deferral."""
    bundle = _bound_bundle(ADDRESSES)
    head_node.serve(bundle, addresses={**ADDRESSES, "p5-008": "10.0.1.99"})  # alone in nn-leaf002
    before = head_node.files()

    for mode in ("dry-run", "apply"):
        code, document, _ = head_node.run(mode, bundle)

        assert (code, document["outcome"]) == (4, "stale_bindings")
        assert document["error"] == (
            "1 node(s) not at the NodeAddr planned: p5-008: 10.0.1.18, now 10.0.1.99; without them tree-gpu"
            " nn-leaf002 would hold no node, so none is applied"
        )
        assert ["p5-008", "10.0.1.99", "p5-008", ""] in document["slurm_nodes"]  # what to plan again with
    assert head_node.files() == before and "reconfigure" not in head_node.calls()

    head_node.serve(addresses=ADDRESSES)
    code, document, _ = head_node.run("apply", bundle)
    assert (code, document["outcome"], document["deferred"]) == (0, "applied", [])


def test_bindings_are_hashed_apart_from_the_plan(head_node: FakeHeadNode) -> None:
    bundle = _bound_bundle(ADDRESSES)
    unbound = render(plan(snapshot({"gpu": p5_nodes(8)}))).bundle.document()
    assert bundle["plan_sha256"] == unbound["plan_sha256"] and "bindings" not in unbound
    assert bundle["bindings_sha256"] == bindings_sha256(ADDRESSES)
    head_node.serve(bundle, addresses=ADDRESSES)

    tampered = {**bundle, "bindings": {**ADDRESSES, "p5-003": "10.0.1.99"}}
    without_hash = {k: v for k, v in bundle.items() if k != "bindings_sha256"}
    for forged in (tampered, without_hash):
        code, document, _ = head_node.run("apply", forged)
        assert (code, document["outcome"]) == (2, "refused")
        assert document["error"] == "bundle.bindings_sha256: does not match the bundle's bindings (tampered?)"


def test_a_node_table_too_long_for_the_cap_is_cut_and_counted(head_node: FakeHeadNode) -> None:
    nodes = p5_nodes(1000)
    bundle = render(plan(snapshot({"gpu": nodes}))).bundle.document()
    head_node.serve(bundle, addresses={n.name: f"10.1.{i // 200}.{i % 200}" for i, n in enumerate(nodes)})

    _, document, text = head_node.run("verify", bundle)

    assert len(text) <= MAX_STDOUT_CHARS
    assert len(document["slurm_nodes"]) + document["dropped"]["slurm_nodes"] == 1000
    assert json.loads(text)["slurm_nodes"][0] == ["p5-001", "10.1.0.0", "p5-001", ""]
