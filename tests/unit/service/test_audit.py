import json
from datetime import UTC, datetime
from pathlib import Path

from tests.helpers import gb200_nodes, node, p5_nodes, snapshot
from topokeeper.adapters.audit_trail import cloudtrail_lake_event
from topokeeper.contract.ports import AuditRecord, Channel, DeliveryHandle, NodeMove, Outcome, PendingDelivery, Trigger
from topokeeper.domain.models import NO_ULTRASERVER_BLOCK
from topokeeper.engine.planner import plan
from topokeeper.render.bundle import render
from topokeeper.service.audit import MAX_LISTED_NODES, build_records

SCHEMA = Path(__file__).resolve().parents[2] / "fixtures" / "audit-record.schema.json"
NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def _document(partitions) -> dict:
    return json.loads(render(plan(snapshot(partitions))).files()["plan.json"])


def _delivery(sha: str) -> PendingDelivery:
    handle = DeliveryHandle(
        channel=Channel.SSM,
        cluster="test-cluster",
        plan_sha256=sha,
        reference="cmd-1",
        target="i-0123456789abcdef0",
        sent_at=NOW,
    )
    trigger = Trigger(
        source="aws.sagemaker",
        detail_type="SageMaker HyperPod Cluster State Change",
        event_id="e-1",
        time=NOW,
        summary="cluster Updating",
    )
    return PendingDelivery(handle=handle, generation=3, triggers=[trigger], trigger_count=42)


def test_the_audit_record_schema_is_pinned() -> None:
    """Consumers read these fields: changing them must be a deliberate, versioned decision."""
    assert AuditRecord.model_json_schema(by_alias=True) == json.loads(SCHEMA.read_text())


def test_one_record_per_changed_partition() -> None:
    before = _document({"p5": p5_nodes(8, partition="p5"), "gb": gb200_nodes(2)})
    extra = node("p5-100", path=("nn-spine0", "nn-agg0", "nn-leaf000"), partition="p5")
    after = _document({"p5": [*p5_nodes(8, partition="p5")[1:], extra], "gb": gb200_nodes(2)})
    records = build_records(
        cluster_name="test-cluster",
        previous=before,
        desired=after,
        delivery=_delivery(after["sha256"]),
        outcome=Outcome.APPLIED,
        error=None,
        completed_at=NOW,
    )
    assert [r.partition for r in records] == ["p5"]
    record = records[0]
    assert (record.nodes_added, record.nodes_removed) == (["p5-100"], ["p5-001"])
    assert record.before_sha256 != record.after_sha256
    assert (record.kind, record.topology, record.switch_count, record.block_count) == ("tree", "tree-p5", 7, 0)
    assert record.trigger_count == 42 and record.triggers[0].event_id == "e-1"
    assert (record.channel, record.delivery_reference, record.outcome) == ("ssm", "cmd-1", Outcome.APPLIED)


def test_first_plan_audits_every_partition_and_ids_are_stable() -> None:
    after = _document({"p5": p5_nodes(8, partition="p5"), "gb": gb200_nodes(2)})
    first = build_records(
        cluster_name="test-cluster",
        previous=None,
        desired=after,
        delivery=_delivery(after["sha256"]),
        outcome=Outcome.APPLIED,
        error=None,
        completed_at=NOW,
    )
    again = build_records(
        cluster_name="test-cluster",
        previous=None,
        desired=after,
        delivery=_delivery(after["sha256"]),
        outcome=Outcome.APPLIED,
        error=None,
        completed_at=NOW.replace(hour=13),
    )
    assert [r.partition for r in first] == ["gb", "p5"]
    assert all(r.before_sha256 is None for r in first)
    assert [r.audit_id for r in first] == [r.audit_id for r in again]
    failed = build_records(
        cluster_name="test-cluster",
        previous=None,
        desired=after,
        delivery=_delivery(after["sha256"]),
        outcome=Outcome.ROLLED_BACK,
        error="fatal",
        completed_at=NOW,
    )
    assert {r.audit_id for r in failed}.isdisjoint({r.audit_id for r in first})


def test_huge_changes_stay_small_with_exact_counts() -> None:
    after = _document({"p5": p5_nodes(5000, partition="p5")})
    (record,) = build_records(
        cluster_name="test-cluster",
        previous=None,
        desired=after,
        delivery=_delivery(after["sha256"]),
        outcome=Outcome.APPLIED,
        error=None,
        completed_at=NOW,
    )
    assert len(record.nodes_added) == MAX_LISTED_NODES and record.nodes_added_count == 5000
    assert len(json.dumps(record.document())) < 256 * 1024


def test_cloudtrail_lake_event_has_the_required_fields() -> None:
    after = _document({"gb": gb200_nodes(1)})
    (record,) = build_records(
        cluster_name="test-cluster",
        previous=None,
        desired=after,
        delivery=_delivery(after["sha256"]),
        outcome=Outcome.APPLIED,
        error=None,
        completed_at=NOW,
    )
    event = cloudtrail_lake_event(record, "111122223333", "arn:aws:lambda:us-east-1:111122223333:function:result")
    for key in ("version", "userIdentity", "eventSource", "eventName", "eventTime", "UID", "recipientAccountId"):
        assert event[key]
    assert event["eventName"] == "UpdatePartitionTopology" and event["eventTime"] == "2026-12-01T12:00:00Z"
    assert len(event["UID"]) <= 1024


def test_drift_repair_is_audited_even_when_the_plan_did_not_change() -> None:
    plan_document = _document({"p5": p5_nodes(8, partition="p5"), "gb": gb200_nodes(2)})
    delivery = _delivery(plan_document["sha256"]).model_copy(update={"repair": ["p5"]})
    (record,) = build_records(
        cluster_name="test-cluster",
        previous=plan_document,
        desired=plan_document,
        delivery=delivery,
        outcome=Outcome.APPLIED,
        error=None,
        completed_at=NOW,
    )
    assert (record.partition, record.reason, record.before_sha256) == ("p5", "drift-repair", None)
    assert record.nodes_added == record.nodes_removed == []


def _records(before: dict, after: dict, delivery: PendingDelivery | None = None) -> list[AuditRecord]:
    return build_records(
        cluster_name="test-cluster",
        previous=before,
        desired=after,
        delivery=delivery or _delivery(after["sha256"]),
        outcome=Outcome.APPLIED,
        error=None,
        completed_at=NOW,
    )


def test_a_replacement_in_another_ultraserver_is_recorded_as_a_move() -> None:
    """Same host name, new instance in another UltraServer (alone there, so in the catch-all block): no node
    added or removed, one node moved."""
    nodes = gb200_nodes(2)
    moved = node("gb-003", instance_type="p6e-gb200.36xlarge", path=("nn-gbspine", "nn-gbagg1", "nn-gbleaf1"))
    moved = moved.model_copy(update={"ultraserver": "us-0002", "instance_group": "gb"})
    before = _document({"gb": nodes})
    after = _document({"gb": [moved if n.name == "gb-003" else n for n in nodes]})
    (record,) = _records(before, after)
    assert (record.nodes_added_count, record.nodes_removed_count, record.nodes_moved_count) == (0, 0, 1)
    (move,) = record.nodes_moved
    assert (move.node, move.before, move.after) == ("gb-003", "us-0000", NO_ULTRASERVER_BLOCK)


def test_a_leaf_change_in_a_tree_is_a_move_and_joins_are_not() -> None:
    nodes = p5_nodes(8, partition="p5")
    relocated = node("p5-002", path=("nn-spine0", "nn-agg0", "nn-leaf001"), partition="p5")
    before = _document({"p5": nodes})
    after = _document({"p5": [relocated if n.name == "p5-002" else n for n in nodes]})
    (record,) = _records(before, after)
    assert [(m.node, m.before, m.after) for m in record.nodes_moved] == [("p5-002", "nn-leaf000", "nn-leaf001")]
    (grown,) = _records(before, _document({"p5": p5_nodes(9, partition="p5")}))
    assert grown.nodes_moved == [] and grown.nodes_added == ["p5-009"]


def test_a_drift_repair_names_the_nodes_it_puts_back_in_its_partition_only() -> None:
    plan_document = _document({"p5": p5_nodes(8, partition="p5"), "gb": gb200_nodes(2)})
    moves = [
        NodeMove(node="p5-002", before="nn-leaf001", after="nn-leaf000"),
        NodeMove(node="gb-001", before="us-0001", after="us-0000"),
    ]
    delivery = _delivery(plan_document["sha256"]).model_copy(update={"repair": ["p5"], "repair_moves": moves})
    (record,) = _records(plan_document, plan_document, delivery)
    assert record.reason == "drift-repair" and record.nodes_moved == moves[:1] and record.nodes_moved_count == 1


def test_the_record_says_how_slurm_24_11_folded_its_partition() -> None:
    """One cluster-wide topology before 25.05: the block partition is folded into the tree, and says so."""
    document = json.loads(
        render(plan(snapshot({"p5": p5_nodes(4, partition="p5"), "gb": gb200_nodes(1)}, version="24.11"))).files()[
            "plan.json"
        ]
    )
    records = {r.partition: r for r in _records(None, document)}
    assert any(" partition gb is folded into the cluster " in fold for fold in records["gb"].folds)
    assert all(" partition gb " in fold for fold in records["gb"].folds)
    assert all(" partition gb " not in fold for fold in records["p5"].folds)
