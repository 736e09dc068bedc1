"""ParallelCluster's own topology.conf on the in-memory ports: seen, the cluster turns to verify; seen gone, it
turns back; chosen explicitly (replace_parallelcluster_topology), the cluster stays enforce, its bundles tell the
applier it may replace the file, and ParallelCluster's regeneration is drift to repair."""

from __future__ import annotations

from tests.unit.service.test_drift_usecases import _applied, _verify
from tests.unit.service.test_result_usecases import ssm_event
from tests.unit.service.usecase_support import CLUSTER, Controller
from topokeeper.contract.config import Mode
from topokeeper.contract.ports import ApplyResult, Outcome
from topokeeper.service.controller import check_drift, reconcile
from topokeeper.service.result import record_result
from topokeeper.service.state import cluster_mode, save_fields

ROWS = [[f"q1-st-p5-{n}", f"10.0.0.{n - 1}", f"q1-st-p5-{n}", "gpu"] for n in range(1, 9)]
FILE_DRIFT = [{"what": "file", "name": "topology.conf", "detail": "differs", "kind": "naming"}]


def _replacing() -> Controller:
    controller = Controller(orchestrator="ec2")
    cluster = controller.settings.clusters[0].model_copy(update={"replace_parallelcluster_topology": True})
    controller.settings = controller.settings.model_copy(update={"clusters": [cluster]})
    return controller


def test_a_later_verify_without_parallelclusters_file_clears_managed_by_and_the_cluster_is_enforce_again() -> None:
    controller = Controller(orchestrator="ec2")
    _applied(controller)
    _verify(controller, Outcome.IN_SYNC, slurm_nodes=ROWS, managed_by="parallelcluster")
    check_drift(controller.cluster, controller.deps())
    assert cluster_mode(controller.cluster, controller.now_state()) is Mode.VERIFY

    _verify(controller, Outcome.IN_SYNC, slurm_nodes=ROWS, managed_by=None)
    check_drift(controller.cluster, controller.deps())

    state = controller.now_state()
    assert state.managed_by is None and cluster_mode(controller.cluster, state) is Mode.ENFORCE


def test_a_document_that_did_not_look_leaves_managed_by_as_it_was() -> None:
    """A channel's own answer, an older applier's document without the node table (read just before the file's
    header), or one SSM cut short, says nothing about who writes the file."""
    controller = Controller(orchestrator="ec2")
    save_fields(controller.state, CLUSTER, {"managed_by": "parallelcluster"})
    _applied(controller)
    for result in (
        ApplyResult.from_channel(Outcome.TIMED_OUT, "SSM TimedOut"),
        ApplyResult(outcome=Outcome.REFUSED, applier_version="1.0.0", error="bundle is rendered as topology.yaml"),
        ApplyResult(outcome=Outcome.IN_SYNC, applier_version=None, slurm_nodes=ROWS, truncated=True),
    ):
        controller.channel.verify_result = result
        check_drift(controller.cluster, controller.deps())
        assert controller.now_state().managed_by == "parallelcluster", result


def test_a_dry_run_or_apply_result_without_it_clears_managed_by_too() -> None:
    controller = Controller(orchestrator="ec2")
    reconcile(controller.change(), controller.deps())
    pending = controller.now_state().pending
    assert pending is not None
    save_fields(controller.state, CLUSTER, {"managed_by": "parallelcluster"})
    controller.ssm_results[pending.handle.reference] = ApplyResult(
        outcome=Outcome.APPLIED, applier_version="1.0.0", slurm_nodes=ROWS
    )

    record_result(ssm_event(pending.handle.reference), controller.result_deps())

    assert controller.now_state().managed_by is None


def test_enforce_chosen_explicitly_delivers_bundles_that_may_replace_parallelclusters_file() -> None:
    controller = _replacing()
    save_fields(controller.state, CLUSTER, {"managed_by": "parallelcluster"})

    report = reconcile(controller.change(), controller.deps())

    assert report.action == "delivered" and cluster_mode(controller.cluster, controller.now_state()) is Mode.ENFORCE
    (bundle,) = controller.channel.delivered
    assert bundle.replace_managed == "parallelcluster" and "replace_managed" in bundle.document()
    assert "replace_managed" not in controller.plans.bundle(CLUSTER, bundle.plan_sha256).document()  # stored plan
    plain = Controller(orchestrator="ec2")
    reconcile(plain.change(), plain.deps())
    assert "replace_managed" not in plain.channel.delivered[0].document()


def test_parallelclusters_regeneration_is_drift_to_repair_when_enforce_was_chosen() -> None:
    controller = _replacing()
    _applied(controller)
    _verify(
        controller,
        Outcome.DRIFT,
        grouping_drift=False,
        drift=FILE_DRIFT,
        slurm_nodes=ROWS,
        managed_by="parallelcluster",
    )

    report = check_drift(controller.cluster, controller.deps())

    assert (report.live, report.drift, report.action) == ("drift", 1, "reconcile-requested")
    state = controller.now_state()
    assert state.managed_by == "parallelcluster" and state.repair_partitions == ["gpu"]
    assert reconcile(controller.queue.sent[-1], controller.deps()).action == "delivered"
    assert controller.channel.delivered[-1].replace_managed == "parallelcluster"
