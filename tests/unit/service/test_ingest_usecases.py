"""ingest() on the in-memory ports: which events count as a change, and the one message per cycle."""

from __future__ import annotations

import pytest

from tests.unit.service.usecase_support import CLUSTER, Controller
from topokeeper.errors import InputError
from topokeeper.events import HYPERPOD_DETAIL_TYPES, TopokeeperEvent
from topokeeper.ports import Metric, ReconcileRequest
from topokeeper.service.ingest import ingest

CLUSTER_ARN = "arn:aws:sagemaker:us-east-1:111122223333:cluster/abcdefabcdef"


def _event(
    detail: dict[str, object], event_id: str = "e-1", detail_type: str = HYPERPOD_DETAIL_TYPES[0]
) -> TopokeeperEvent:
    return TopokeeperEvent.model_validate(
        {
            "version": "0",
            "id": event_id,
            "detail-type": detail_type,
            "source": "aws.sagemaker",
            "account": "111122223333",
            "time": "2026-01-05T09:00:00Z",
            "region": "us-east-1",
            "resources": [],
            "detail": detail,
        }
    )


def _state_change(event_id: str = "e-1", cluster: str = CLUSTER) -> TopokeeperEvent:
    return _event({"ClusterArn": CLUSTER_ARN, "ClusterName": cluster, "ClusterStatus": "Updating"}, event_id)


def test_a_change_bumps_the_generation_and_queues_one_request() -> None:
    controller = Controller()
    result = ingest(_state_change(), controller.ingest_deps())
    assert (result.status, result.generation) == ("queued", 1)
    assert controller.queue.sent == [ReconcileRequest(cluster=CLUSTER, generation=1, since=0)]
    assert controller.now_state().triggers[0].summary == "cluster Updating"


def test_changes_of_one_cycle_share_one_deduplication_id() -> None:
    controller = Controller()
    for index in range(3):
        ingest(_state_change(f"e-{index}"), controller.ingest_deps())
    assert {request.deduplication_id for request in controller.queue.sent} == {f"{CLUSTER}:after:0"}
    assert controller.now_state().generation == 3


def test_a_redelivered_event_is_a_duplicate_that_still_makes_sure_a_message_exists() -> None:
    controller = Controller()
    ingest(_state_change(), controller.ingest_deps())
    result = ingest(_state_change(), controller.ingest_deps())
    assert result.status == "duplicate"
    assert controller.now_state().generation == 1
    assert len(controller.queue.sent) == 2  # SQS deduplicates the second
    assert controller.metrics.values(Metric.EVENTS_COALESCED) == [1]


def test_an_unmanaged_cluster_is_ignored() -> None:
    controller = Controller()
    result = ingest(_state_change(cluster="someone-else"), controller.ingest_deps())
    assert (result.status, result.reason) == ("ignored", "unmanaged cluster someone-else")
    assert controller.queue.sent == []


def test_a_cloudtrail_call_naming_the_cluster_by_arn_is_resolved() -> None:
    controller = Controller()
    detail = {
        "eventSource": "sagemaker.amazonaws.com",
        "eventName": "UpdateCluster",
        "requestParameters": {"clusterName": CLUSTER_ARN},
    }
    result = ingest(_event(detail, detail_type="AWS API Call via CloudTrail"), controller.ingest_deps())
    assert (result.status, result.cluster) == ("queued", CLUSTER)


def test_a_malformed_event_names_the_missing_field() -> None:
    controller = Controller()
    with pytest.raises(InputError, match=r"^detail\.ClusterName"):
        ingest(_event({"ClusterArn": CLUSTER_ARN}), controller.ingest_deps())
    assert controller.queue.sent == []
