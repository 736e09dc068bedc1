"""DynamoDB items do not grow with the cluster (the emulator refuses an item over 400 KB, as DynamoDB does), but
their number does: the history reads across Query's 1 MB pages.

What bounds each item: the cluster state keeps 20 triggers (and 20 with the delivery in flight), one agent
verify result, which arrived in one event (the agent cuts its detail to 200 KiB), and the head node's node table
gzipped (about 11 bytes a node); a node facts item is one instance; an audit record lists at most 200 added and
200 removed nodes and 20 warnings (counts exact).
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from tests.integration.aws.test_adapters import TABLE, _large, _records, _rendered, _trail
from topokeeper.adapters.dynamodb import DynamoStateStore
from topokeeper.agent.applier_process import MAX_DETAIL_BYTES
from topokeeper.contract.ports import (
    MAX_TRIGGERS,
    ApplyResult,
    Channel,
    DeliveryHandle,
    Outcome,
    PendingDelivery,
    Trigger,
)
from topokeeper.domain.models import SlurmNodeRecord
from topokeeper.sim.aws_emulator import AwsEmulator, ManualClock
from topokeeper.sim.stack import create_state_table


@pytest.fixture
def table(aws: AwsEmulator) -> str:
    create_state_table(aws.client("dynamodb"), TABLE)
    return TABLE


def test_the_largest_cluster_state_fits_one_item(aws: AwsEmulator, clock: ManualClock, table: str) -> None:
    store = DynamoStateStore(aws.client("dynamodb"), table)
    # Triggers as ingest keeps them, with summaries far longer than ingest writes
    for number in range(MAX_TRIGGERS + 5):
        trigger = Trigger(
            source="aws.sagemaker", detail_type="SageMaker HyperPod Cluster State Change",
            event_id=f"{number:036d}", time=clock.now(), summary="s" * 1000,
        )  # fmt: skip
        state = store.record_change("big", trigger, clock.now())
    # The agent's largest verify report: a detail of 200 KiB, most of it the diff
    verify = ApplyResult(outcome=Outcome.DRIFT, applier_version="1.0.0", diff="-" * (MAX_DETAIL_BYTES - 2000))
    handle = DeliveryHandle(
        channel=Channel.SSM, cluster="big", plan_sha256="a" * 64, reference="r" * 36, target="mi-" + "0" * 17,
        sent_at=clock.now(),
    )  # fmt: skip
    pending = PendingDelivery(
        handle=handle, generation=state.generation, triggers=state.triggers, trigger_count=state.trigger_count
    )
    largest = state.model_copy(update={"last_verify": verify, "last_verify_at": clock.now(), "pending": pending})

    store.save(largest)

    stored = store.get("big")
    assert stored.last_verify == verify and stored.pending == pending
    assert len(stored.triggers) == MAX_TRIGGERS and stored.trigger_count == MAX_TRIGGERS + 5


def test_history_reads_across_query_pages(aws: AwsEmulator, clock: ManualClock, table: str) -> None:
    """Query answers at most 1 MB a page; twenty records of 60 KB (200 long node names each) need two."""
    records = []
    for index in range(20):
        clock.advance(timedelta(minutes=1).total_seconds())
        records.append(_large(_records(_rendered(), f"cmd-{index}", clock)[0], index, names=200, name_length=300))
    trail = _trail(aws, table)
    assert trail.publish(records) == 20

    history = trail.history(records[0].cluster_name, limit=1000)

    assert [entry["audit_id"] for entry in history] == [r.audit_id for r in reversed(records)]
    assert history[0] == records[-1].document()
    assert len(trail.history(records[0].cluster_name, limit=5)) == 5


def test_a_large_parallelcluster_node_table_fits_the_state_item(
    aws: AwsEmulator, clock: ManualClock, table: str
) -> None:
    """The SSM channel now brings back a whole node table (over 200 rows, from S3), and the state keeps it: a
    ParallelCluster cluster lists every dynamic node, powered down or not (20,000 here, 3 MB as JSON)."""
    store = DynamoStateStore(aws.client("dynamodb"), table)
    for number in range(MAX_TRIGGERS):
        trigger = Trigger(
            source="aws.ec2", detail_type="EC2 Instance State-change Notification",
            event_id=f"{number:036d}", time=clock.now(), summary="s" * 200,
        )  # fmt: skip
        state = store.record_change("pc", trigger, clock.now())
    rows = []
    for number in range(20_000):
        name = f"queue{number % 4}-dy-p5-48xlarge-cr{number % 5}-{number + 1}"
        address = f"10.{number % 256}.{number // 256 % 256}.{number * 7 % 256}" if number % 2 else name
        rows.append(SlurmNodeRecord(name=name, address=address, hostname=name, partitions=[f"queue{number % 4}"]))
    verify = ApplyResult(outcome=Outcome.DRIFT, applier_version="1.0.0", diff="-" * 100_000)
    large = state.model_copy(
        update={"slurm_nodes": rows, "table_read_for": [], "last_verify": verify, "last_verify_at": clock.now()}
    )

    store.save(large)

    stored = store.get("pc")
    assert stored.slurm_nodes == rows and stored.last_verify == verify
    # Saved again without a table (none known): the stored one goes too
    store.save(stored.model_copy(update={"slurm_nodes": None}))
    assert store.get("pc").slurm_nodes is None
    # A head node that reports no nodes has a table: empty, not unknown (unknown would read it again)
    store.save(store.get("pc").model_copy(update={"slurm_nodes": []}))
    assert store.get("pc").slurm_nodes == []
