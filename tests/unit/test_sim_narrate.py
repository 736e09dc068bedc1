"""The simulator's lines say which node, which partition and why; nothing is cut silently."""

from __future__ import annotations

from topokeeper.narrate import cut, drift_text, membership_changes, nodes_text, record_text
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
