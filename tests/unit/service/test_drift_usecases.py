"""check_drift() on the in-memory ports: each verdict, and what it asks for in enforce and verify mode."""

from __future__ import annotations

import pytest

from tests.unit.service.usecase_support import CLUSTER, Controller
from topokeeper.contract.event_schemas import CLOUDTRAIL_DETAIL_TYPE, MANAGED_TOPOLOGY_EVENT, TopokeeperEvent
from topokeeper.contract.ports import ApplyResult, Metric, NodeMove, Outcome
from topokeeper.service.controller import check_drift, reconcile, verify_managed_updates
from topokeeper.service.ingest import ingest
from topokeeper.service.reconcile import DELIVERY_TIMEOUT, ReconcileReport


def _applied(controller: Controller) -> None:
    """The plan is desired and applied, nothing in flight."""
    reconcile(controller.change(), controller.deps())
    state = controller.now_state()
    controller.state.save(state.model_copy(update={"pending": None, "applied_sha256": state.desired_sha256}))
    controller.queue.sent.clear()


def _verify(controller: Controller, outcome: Outcome, **fields: object) -> None:
    controller.channel.verify_result = ApplyResult.model_validate(
        {"outcome": outcome.value, "applier_version": "1.0.0", "mode": "verify", **fields}
    )


def test_in_sync_reports_zero_drift_and_asks_nothing() -> None:
    controller = Controller()
    _applied(controller)
    report = check_drift(controller.cluster, controller.deps())
    assert (report.live, report.aws, report.drift, report.action) == ("in_sync", "current", 0, "none")
    assert controller.metrics.values(Metric.TOPOLOGY_DRIFT) == [0]
    assert controller.queue.sent == []


def test_live_drift_in_enforce_mode_repairs_the_drifted_partition() -> None:
    controller = Controller()
    _applied(controller)
    _verify(controller, Outcome.DRIFT, drift=[{"what": "partition", "name": "gpu", "detail": "edited"}])
    report = check_drift(controller.cluster, controller.deps())
    assert (report.live, report.drift, report.action) == ("drift", 1, "reconcile-requested")
    assert controller.now_state().repair_partitions == ["gpu"]
    (request,) = controller.queue.sent
    assert request.reason == "drift"


def test_live_drift_in_verify_mode_is_only_reported() -> None:
    controller = Controller(mode="verify")
    reconcile(controller.change(), controller.deps())
    controller.queue.sent.clear()
    _verify(controller, Outcome.DRIFT, grouping_drift=True, drift=[{"what": "grouping", "name": "gpu"}])
    report = check_drift(controller.cluster, controller.deps())
    assert (report.live, report.drift, report.action) == ("drift", 1, "reported")
    assert controller.now_state().repair_partitions == []
    assert controller.queue.sent == []


def test_naming_only_drift_in_verify_mode_is_in_sync() -> None:
    controller = Controller(mode="verify")
    reconcile(controller.change(), controller.deps())
    _verify(controller, Outcome.DRIFT, grouping_drift=False, drift=[{"what": "topology", "name": "x"}])
    report = check_drift(controller.cluster, controller.deps())
    assert (report.live, report.drift, report.action) == ("in_sync", 0, "none")


def test_a_lost_event_is_found_by_planning_again() -> None:
    controller = Controller()
    _applied(controller)
    controller.facts.move(0, 1)  # AWS changed; no event told us
    report = check_drift(controller.cluster, controller.deps())
    assert (report.aws, report.drift, report.action) == ("changed", 1, "reconcile-requested")
    assert len(controller.queue.sent) == 1


def test_a_delivery_in_flight_is_pending_not_judged() -> None:
    controller = Controller()
    reconcile(controller.change(), controller.deps())
    report = check_drift(controller.cluster, controller.deps())
    assert (report.live, report.drift, report.action) == ("pending", 0, "none")
    assert controller.channel.verified == 0
    assert controller.metrics.values(Metric.TOPOLOGY_DRIFT) == [0]


def test_a_delivery_past_its_timeout_is_no_longer_pending() -> None:
    controller = Controller()
    reconcile(controller.change(), controller.deps())
    controller.clock.advance(DELIVERY_TIMEOUT.total_seconds())
    report = check_drift(controller.cluster, controller.deps())
    assert (report.live, report.drift, report.action) == ("unknown", None, "none")
    assert controller.metrics.values(Metric.TOPOLOGY_DRIFT) == []


def _scaling(controller: Controller, *, waited: float) -> None:
    """Applied; then AWS changed and its event arrived (queued, not reconciled yet) ``waited`` seconds ago."""
    _applied(controller)
    controller.facts.move(0, 1)
    controller.change("e-scale")
    controller.queue.sent.clear()
    controller.clock.advance(waited)


@pytest.mark.parametrize("max_wait", [0, 30, 300])
def test_changes_newer_than_the_last_reconcile_and_younger_than_the_window_are_pending(max_wait: int) -> None:
    controller = Controller(max_wait_seconds=max_wait)
    window = max_wait + DELIVERY_TIMEOUT.total_seconds()
    _scaling(controller, waited=window - 1)
    report = check_drift(controller.cluster, controller.deps())
    assert (report.live, report.aws, report.drift, report.action) == ("in_sync", "pending", 0, "none")
    assert controller.metrics.values(Metric.TOPOLOGY_DRIFT) == [0]
    assert controller.queue.sent == []  # the change's own message is on its way


@pytest.mark.parametrize("max_wait", [0, 30, 300])
def test_changes_older_than_the_window_are_drift(max_wait: int) -> None:
    controller = Controller(max_wait_seconds=max_wait)
    _scaling(controller, waited=max_wait + DELIVERY_TIMEOUT.total_seconds())
    report = check_drift(controller.cluster, controller.deps())
    assert (report.aws, report.drift, report.action) == ("changed", 1, "reconcile-requested")
    assert controller.metrics.values(Metric.TOPOLOGY_DRIFT) == [1]


def test_the_window_counts_from_the_oldest_change_not_the_newest() -> None:
    controller = Controller(max_wait_seconds=30)
    _scaling(controller, waited=30 + DELIVERY_TIMEOUT.total_seconds() - 5)
    controller.change("e-later")  # a fresh change does not restart the window of the older one
    controller.clock.advance(10)
    report = check_drift(controller.cluster, controller.deps())
    assert (report.aws, report.drift) == ("changed", 1)


def test_a_change_already_reconciled_does_not_excuse_a_difference() -> None:
    controller = Controller()
    _applied(controller)  # its change is reconciled
    controller.facts.move(0, 1)  # and then AWS changed without an event
    report = check_drift(controller.cluster, controller.deps())
    assert (report.aws, report.drift) == ("changed", 1)


def test_a_write_that_did_not_land_is_tried_again() -> None:
    controller = Controller()
    reconcile(controller.change(), controller.deps())
    state = controller.now_state()
    controller.state.save(state.model_copy(update={"pending": None}))  # refused or rolled back: not applied
    report = check_drift(controller.cluster, controller.deps())
    assert report.action == "reconcile-requested"


def test_an_unreachable_head_node_is_unknown_not_in_sync() -> None:
    controller = Controller()
    _applied(controller)
    controller.channel.verify_result = ApplyResult.from_channel(Outcome.TIMED_OUT, "SSM TimedOut")
    report = check_drift(controller.cluster, controller.deps())
    assert (report.live, report.drift, report.error) == ("unknown", None, "SSM TimedOut")
    assert controller.metrics.values(Metric.TOPOLOGY_DRIFT) == []


def test_no_plan_yet_asks_for_a_reconcile() -> None:
    controller = Controller()
    report = check_drift(controller.cluster, controller.deps())
    assert report.action == "reconcile-requested"
    assert controller.queue.sent[0].cluster == CLUSTER


def _ingested(controller: Controller, event_name: str) -> ReconcileReport:
    """A HyperPod CloudTrail record for the cluster goes through ingest, then its reconcile runs."""
    event = TopokeeperEvent.model_validate(
        {
            "version": "0",
            "id": f"eb-{event_name}",
            "detail-type": CLOUDTRAIL_DETAIL_TYPE,
            "source": "aws.sagemaker",
            "account": "111122223333",
            "time": "2026-01-05T09:00:00Z",
            "region": "us-east-1",
            "resources": [],
            "detail": {
                "eventSource": "sagemaker.amazonaws.com",
                "eventName": event_name,
                "eventID": f"ct-{event_name}",
                "requestParameters": {"clusterName": CLUSTER},
            },
        }
    )
    ingest(event, controller.ingest_deps())
    return reconcile(controller.queue.sent[-1], controller.deps())


def test_hyperpods_topology_update_verifies_at_once_and_the_report_links_its_record() -> None:
    controller = Controller(mode="verify")
    _verify(controller, Outcome.DRIFT, grouping_drift=True, drift=[{"what": "grouping", "name": "gpu"}])
    reconciled = _ingested(controller, MANAGED_TOPOLOGY_EVENT)
    assert reconciled.action == "planned-only"

    report = verify_managed_updates(reconciled, controller.deps())

    assert report is not None and controller.channel.verified == 1
    assert (report.live, report.aws, report.drift, report.action) == ("drift", "current", 1, "reported")
    (requested_by,) = report.requested_by
    assert requested_by.event_id == f"eb-{MANAGED_TOPOLOGY_EVENT}"
    assert f"ct-{MANAGED_TOPOLOGY_EVENT}" in requested_by.summary
    assert controller.metrics.values(Metric.TOPOLOGY_DRIFT) == [1]
    # The head node is asked for a fresh verify, named by the triggers (a retried reconcile asks the same).
    assert report.verify_request is not None and report.verify_request.startswith("vr-")
    assert verify_managed_updates(reconciled, controller.deps()).verify_request == report.verify_request  # type: ignore[union-attr]


def test_other_changes_wait_for_the_scheduled_verify() -> None:
    controller = Controller(mode="verify")
    reconciled = _ingested(controller, "UpdateCluster")
    assert verify_managed_updates(reconciled, controller.deps()) is None
    assert controller.channel.verified == 0


def test_a_managed_update_of_a_deferred_reconcile_is_verified_by_the_reconcile_that_runs() -> None:
    controller = Controller(mode="verify", debounce_seconds=30)
    deferred = _ingested(controller, MANAGED_TOPOLOGY_EVENT)
    assert deferred.action == "deferred" and verify_managed_updates(deferred, controller.deps()) is None
    controller.clock.advance(30)
    report = verify_managed_updates(reconcile(controller.queue.sent[-1], controller.deps()), controller.deps())
    assert report is not None and [t.event_id for t in report.requested_by] == [f"eb-{MANAGED_TOPOLOGY_EVENT}"]


def test_live_drift_names_the_moved_nodes_and_the_repair_carries_them() -> None:
    """The applier's read-back lists the nodes found in another leaf live; the repair's delivery takes them
    (its audit record names them) and the state forgets them once the repair is sent."""
    controller = Controller()
    _applied(controller)
    moved = {"node": "n-2", "planned": "leaf-a", "live": "leaf-b"}
    _verify(
        controller,
        Outcome.DRIFT,
        drift=[{"what": "topology", "name": "gpu", "detail": "2 mismatch(es)"}],
        readback={"tree-gpu": {"units": 3, "matches": False, "mismatches": ["x"], "moved": [moved]}},
    )
    report = check_drift(controller.cluster, controller.deps())
    expected = NodeMove(node="n-2", before="leaf-b", after="leaf-a")
    assert report.moved == [expected] and controller.now_state().repair_moves == [expected]
    (request,) = controller.queue.sent
    reconcile(request, controller.deps())
    state = controller.now_state()
    assert state.pending is not None and state.pending.repair_moves == [expected]
    assert state.repair_moves == []


def test_drift_on_a_cluster_whose_topology_parallelcluster_writes_is_only_reported() -> None:
    controller = Controller(orchestrator="ec2")
    _applied(controller)
    drift = [{"what": "grouping", "name": "gpu"}]
    _verify(controller, Outcome.DRIFT, grouping_drift=True, drift=drift, managed_by="parallelcluster")
    report = check_drift(controller.cluster, controller.deps())
    assert (report.live, report.drift, report.action) == ("drift", 1, "reported")
    state = controller.now_state()
    assert state.managed_by == "parallelcluster" and state.repair_partitions == [] and controller.queue.sent == []
