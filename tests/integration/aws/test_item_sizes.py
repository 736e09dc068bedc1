"""What grows with the cluster stays under DynamoDB's 400 KB item limit (the emulator refuses larger items, as
DynamoDB does): an audit record names every node a partition gained or lost, so a 20,000-node partition's first
record is larger than one item; the history keeps it whole, split, and reads it back across Query pages."""

from __future__ import annotations

import random

import pytest

from tests.integration.aws.test_adapters import TABLE, _records, _rendered, _trail
from topokeeper.ports import AuditRecord
from topokeeper.sim.aws_emulator import AwsEmulator, ManualClock
from topokeeper.sim.stack import create_state_table


@pytest.fixture
def table(aws: AwsEmulator) -> str:
    create_state_table(aws.client("dynamodb"), TABLE)
    return TABLE


def _incompressible(record: AuditRecord, index: int, names: int) -> AuditRecord:
    """Node names that compression cannot shrink: the record must be split, not only compressed."""
    rng = random.Random(index)
    added = [f"n{rng.getrandbits(128):032x}" for _ in range(names)]
    return record.model_copy(
        update={"audit_id": f"{index:032d}", "nodes_added": added, "nodes_added_count": names, "node_count": names}
    )


def test_a_record_larger_than_an_item_is_stored_whole(aws: AwsEmulator, clock: ManualClock, table: str) -> None:
    base = _records(_rendered(), "cmd-1", clock)[0]
    # 20,000 host names as HyperPod names them: about 460 KB of JSON, over DynamoDB's 400 KB
    hosts = [f"ip-10-{1 + i // 65000}-{i // 250 % 256}-{i % 250}" for i in range(20_000)]
    named = base.model_copy(update={"audit_id": "1" * 32, "nodes_added": hosts, "nodes_added_count": len(hosts)})
    # 40,000 names compression cannot shrink: about 1.4 MB, more than three items even compressed
    random_names = _incompressible(base, 2, 40_000)
    trail = _trail(aws, table)

    assert trail.publish([named, random_names]) == 2

    history = trail.history(base.cluster_name)
    assert {entry["audit_id"]: entry for entry in history} == {
        named.audit_id: named.document(),
        random_names.audit_id: random_names.document(),
    }


def test_history_reads_across_query_pages(aws: AwsEmulator, clock: ManualClock, table: str) -> None:
    """Query answers at most 1 MB a page: a history of large records needs more than one."""
    base = _records(_rendered(), "cmd-1", clock)[0]
    records = []
    for index in range(5):
        clock.advance(60)
        records.append(_incompressible(_records(_rendered(), f"cmd-{index}", clock)[0], 10 + index, 8_000))
    trail = _trail(aws, table)
    assert trail.publish(records) == 5

    history = trail.history(base.cluster_name)

    assert [entry["audit_id"] for entry in history] == [r.audit_id for r in reversed(records)]
    assert history[0] == records[-1].document()
