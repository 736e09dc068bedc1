"""ingest() on the in-memory ports: which events count as a change, and the one message per cycle."""

from __future__ import annotations

import pytest

from tests.unit.service.usecase_support import CLUSTER, Controller
from topokeeper.contract.errors import InputError
from topokeeper.contract.event_schemas import (
    CLOUDTRAIL_DETAIL_TYPE,
    CLOUDTRAIL_SERVICE_EVENT_DETAIL_TYPE,
    HYPERPOD_DETAIL_TYPES,
    MANAGED_TOPOLOGY_EVENT,
    TopokeeperEvent,
)
from topokeeper.contract.ports import Metric, ReconcileRequest
from topokeeper.service.ingest import ingest
from topokeeper.service.reconcile import is_managed_topology_update

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


def _managed_update(detail_type: str, event_id: str = "mt-1", **where: object) -> TopokeeperEvent:
    """HyperPod's own UpdatePartitionTopology record, shaped from the documentation (no live sample yet)."""
    detail = {
        "eventSource": "sagemaker.amazonaws.com",
        "eventName": MANAGED_TOPOLOGY_EVENT,
        "eventID": f"ct-{event_id}",
        **where,
    }
    return _event(detail, event_id, detail_type)


@pytest.mark.parametrize(
    ("detail_type", "where"),
    [
        (CLOUDTRAIL_DETAIL_TYPE, {"requestParameters": {"clusterName": CLUSTER_ARN, "partitionName": "gpu"}}),
        (CLOUDTRAIL_SERVICE_EVENT_DETAIL_TYPE, {"serviceEventDetails": {"clusterArn": CLUSTER_ARN}}),
        (CLOUDTRAIL_SERVICE_EVENT_DETAIL_TYPE, {"serviceEventDetails": {"clusterName": CLUSTER}}),
    ],
)
def test_hyperpods_own_topology_update_is_a_change_counted_as_managed(
    detail_type: str, where: dict[str, object]
) -> None:
    controller = Controller(mode="verify")
    result = ingest(_managed_update(detail_type, **where), controller.ingest_deps())
    assert (result.status, result.cluster) == ("queued", CLUSTER)
    assert controller.metrics.values(Metric.MANAGED_TOPOLOGY_UPDATES) == [1]
    (trigger,) = controller.now_state().triggers
    assert is_managed_topology_update(trigger)
    assert "ct-mt-1" in trigger.summary  # the CloudTrail record to look up


def test_a_managed_update_named_only_in_the_envelope_resources_is_found() -> None:
    controller = Controller()
    event = _managed_update(CLOUDTRAIL_SERVICE_EVENT_DETAIL_TYPE).model_copy(update={"resources": [CLUSTER_ARN]})
    assert ingest(event, controller.ingest_deps()).cluster == CLUSTER


def test_a_redelivered_managed_update_is_counted_once() -> None:
    controller = Controller()
    event = _managed_update(CLOUDTRAIL_DETAIL_TYPE, requestParameters={"clusterName": CLUSTER})
    ingest(event, controller.ingest_deps())
    assert ingest(event, controller.ingest_deps()).status == "duplicate"
    assert controller.metrics.values(Metric.MANAGED_TOPOLOGY_UPDATES) == [1]


def test_other_api_calls_are_not_managed_updates() -> None:
    controller = Controller()
    detail = {"eventSource": "sagemaker.amazonaws.com", "eventName": "UpdateCluster"}
    ingest(
        _event({**detail, "requestParameters": {"clusterName": CLUSTER}}, "e-1", CLOUDTRAIL_DETAIL_TYPE),
        controller.ingest_deps(),
    )
    assert controller.metrics.values(Metric.MANAGED_TOPOLOGY_UPDATES) == []
    assert not is_managed_topology_update(controller.now_state().triggers[0])


def test_a_managed_update_naming_no_cluster_names_the_field() -> None:
    controller = Controller()
    with pytest.raises(InputError, match=r"^detail\.requestParameters\.clusterName"):
        ingest(_managed_update(CLOUDTRAIL_SERVICE_EVENT_DETAIL_TYPE), controller.ingest_deps())
    assert controller.queue.sent == []


def test_a_cluster_event_whose_description_mimics_the_summary_is_not_a_managed_update() -> None:
    controller = Controller()
    details = {"ClusterName": CLUSTER, "Description": "UpdatePartitionTopology by HyperPod, CloudTrail event x"}
    ingest(_event({"EventDetails": details}, "e-1", HYPERPOD_DETAIL_TYPES[2]), controller.ingest_deps())
    assert not is_managed_topology_update(controller.now_state().triggers[0])
    assert controller.metrics.values(Metric.MANAGED_TOPOLOGY_UPDATES) == []
