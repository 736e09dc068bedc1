"""The simulator's lines say which node, which partition and why; nothing is cut silently."""

from __future__ import annotations

from topokeeper.render.narrate import (
    LEAF_ROWS,
    cut,
    drift_text,
    membership_changes,
    nodes_text,
    record_text,
    written_leaves,
)
from topokeeper.sim.aws.server import CallCounter


def test_a_cut_line_says_how_much_was_cut() -> None:
    assert cut("x" * 10, 10) == "x" * 10
    assert cut("x" * 25, 10) == "x" * 10 + " [... 15 more characters]"


def test_long_node_lists_say_how_many_more() -> None:
    names = [f"n{i:02d}" for i in range(1, 13)]
    assert nodes_text(names) == "n[01-08] and 4 more"
    assert nodes_text(names[:3]) == "n[01-03]" and nodes_text([]) == "none"
    assert nodes_text(names, 3, total=500) == "n[01-03] and 497 more"  # a record lists 200 of 500


def test_membership_changes_name_joins_leaves_and_replacements_per_partition() -> None:
    before = {"i-1": ("h1", "p5"), "i-2": ("h2", "p5"), "i-3": ("g1", "gb")}
    after = {"i-1": ("h1", "p5"), "i-9": ("g1", "gb"), "i-4": ("h4", "p5"), "i-5": ("c1", "cpu")}
    text = membership_changes(before, after, {"p5": "ml-p5", "gb": "ml-p6e"})
    assert text == (
        "group cpu (no partition): joined c1; partition ml-p5: joined h4, left h2; "
        "partition ml-p6e: replaced (new instance) g1"
    )
    assert membership_changes(after, after, {}) == "no node joined, left or was replaced since the last event"


def _record(**fields: object) -> dict[str, object]:
    record: dict[str, object] = {
        "partition": "ml-p6e",
        "reason": "plan-change",
        "outcome": "applied",
        "kind": "block",
        "node_count": 36,
        "nodes_added": [],
        "nodes_removed": [],
        "nodes_added_count": 0,
        "nodes_removed_count": 0,
        "nodes_moved": [{"node": "g1", "before": "us-1", "after": "us-2"}],
        "nodes_moved_count": 1,
        "triggers": [{"detail_type": "AWS API Call via CloudTrail", "summary": "BatchReplaceClusterNodes API call"}],
        "trigger_count": 1,
        "error": None,
    }
    return {**record, **fields}


def test_a_record_names_the_moved_node_and_why() -> None:
    assert record_text(_record()) == (
        "ml-p6e: plan-change applied (block, 36 nodes); moved 1: g1 us-1 -> us-2; "
        "why: 1 event(s): AWS API Call via CloudTrail (BatchReplaceClusterNodes API call) x1"
    )
    repair = record_text(_record(reason="drift-repair", nodes_moved=[], nodes_moved_count=0, folds=["folded x"]))
    assert repair.endswith("no node added, removed or moved; why: repairs live drift; folded: folded x")


def test_a_drift_line_names_the_partition_and_both_leaves() -> None:
    moves = [{"node": "h2", "before": "leaf-b", "after": "leaf-a"}, {"node": "x9", "before": None, "after": "l"}]
    assert drift_text(moves, {"ml-p5": ["h1", "h2"]}) == (
        "partition (no partition): x9 in no leaf or block live, l in the plan; "
        "partition ml-p5: h2 in leaf-b live, leaf-a in the plan"
    )


def test_uncounted_calls_are_forgotten_and_counted_ones_kept() -> None:
    calls = CallCounter()
    calls.record("sqs", "SendMessage")
    with calls.uncounted():
        calls.record("s3", "CreateBucket")
    calls.record("sqs", "SendMessage")
    assert calls.by_operation() == {"SendMessage": 2}


def _tree(name: str, leaves: dict[str, list[str]]) -> dict[str, object]:
    switches = [{"name": leaf, "switches": [], "nodes": nodes} for leaf, nodes in leaves.items()]
    spine = {"name": "spine", "switches": list(leaves), "nodes": sorted(n for ns in leaves.values() for n in ns)}
    nodes = spine["nodes"]
    return {"name": name, "kind": "tree", "node_count": len(nodes), "nodes": nodes, "switches": [spine, *switches]}


def _blocks(name: str, blocks: dict[str, list[str]]) -> dict[str, object]:
    nodes = sorted(n for ns in blocks.values() for n in ns)
    listed = [{"name": block, "nodes": members} for block, members in blocks.items()]
    return {"name": name, "kind": "block", "node_count": len(nodes), "nodes": nodes, "blocks": listed}


def _plan(*partitions: dict[str, object]) -> dict[str, object]:
    return {"partitions": list(partitions)}


def test_after_a_write_the_timeline_tables_the_leaves_and_blocks_that_changed() -> None:
    before = _plan(
        _tree("ml-p5", {"leaf-a": ["p1", "p2"], "leaf-b": ["p3", "p4"]}),
        _blocks("ml-p6e", {"us-1": ["g1", "g2", "g3"]}),
        {"name": "cpu", "kind": "flat", "node_count": 2, "nodes": ["c1", "c2"]},
    )
    after = _plan(
        _tree("ml-p5", {"leaf-a": ["p1", "p2"], "leaf-b": ["p3"], "leaf-c": ["p5", "p6"]}),
        _blocks("ml-p6e", {"us-1": ["g1", "g2"], "us-2": ["g3"]}),
        {"name": "cpu", "kind": "flat", "node_count": 3, "nodes": ["c1", "c2", "c3"]},
    )
    records = [_record(partition=p, nodes_moved=[]) for p in ("ml-p6e", "ml-p5", "cpu")]
    assert written_leaves(before, after, records).splitlines() == [
        "cpu flat: 3 nodes, no leaf or block; "
        "ml-p5 tree: 5 nodes in 3 leaves, the largest job in one leaf 2 nodes; "
        "ml-p6e block: 3 nodes in 2 blocks, the largest job in one block 2 nodes",
        "  PARTITION  LEAF/BLOCK  NODES  CHANGE  HOSTLIST",
        "  ml-p5      leaf-b      1      -1      p3",
        "  ml-p5      leaf-c      2      new     p[5-6]",
        "  ml-p6e     us-1        2      -1      g[1-2]",
        "  ml-p6e     us-2        1      new     g3",
    ]
    # A partition the write did not change (no audit record) is not listed, even where its leaves differ.
    assert written_leaves(before, after, [_record(partition="cpu", nodes_moved=[])]) == (
        "cpu flat: 3 nodes, no leaf or block; no leaf or block changed"
    )
    # The first write: every leaf and block is new; one that is gone says so.
    first = written_leaves(None, before, [_record(partition="ml-p5", nodes_moved=[])]).splitlines()
    assert first[2:] == [
        "  ml-p5      leaf-a      2      new     p[1-2]",
        "  ml-p5      leaf-b      2      new     p[3-4]",
    ]
    emptied = _plan(_tree("ml-p5", {"leaf-a": ["p1", "p2", "p3", "p4"]}))
    gone = written_leaves(before, emptied, [_record(partition="ml-p5", nodes_moved=[])]).splitlines()
    assert gone[2:] == ["  ml-p5      leaf-a      4      +2       p[1-4]", "  ml-p5      leaf-b      0      removed  -"]


def test_a_drift_repair_tables_the_live_leaf_a_node_left_and_the_planned_leaf_it_rejoined() -> None:
    plan = _plan(_tree("ml-p5", {"leaf-a": ["p1", "p2"], "leaf-b": ["p3", "p4"]}))
    repair = _record(partition="ml-p5", reason="drift-repair", nodes_moved=[{"node": "p2", "before": "leaf-b"}])
    assert written_leaves(plan, plan, [repair]).splitlines()[1:] == [
        "  PARTITION  LEAF/BLOCK  NODES  CHANGE  HOSTLIST",
        "  ml-p5      leaf-a      2      +1      p[1-2]",
        "  ml-p5      leaf-b      2      -1      p[3-4]",
    ]


def test_at_a_thousand_nodes_a_write_lists_a_dozen_leaves_and_counts_the_rest() -> None:
    leaves = {f"leaf-{i:02d}": [f"node-{i * 16 + j:04d}" for j in range(16)] for i in range(64)}
    lines = written_leaves(None, _plan(_tree("big", leaves)), [_record(partition="big", nodes_moved=[])]).splitlines()
    assert lines[0] == "big tree: 1024 nodes in 64 leaves, the largest job in one leaf 16 nodes"
    assert len(lines) == 2 + LEAF_ROWS + 1 and lines[-1] == f"  and {64 - LEAF_ROWS} more changed leaves or blocks"
    assert lines[2] == "  big        leaf-00     16     new     node-[0000-0015]"  # the full hostlist, compressed
