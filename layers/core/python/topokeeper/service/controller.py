"""The controller's entry points: the reconcile queue's messages and the drift checks, each cluster handed to its
orchestrator's provider (``orchestrators``). The reconcile and drift functions, the operator CLI and the simulator
call these; the providers never do.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace

from pydantic import BaseModel, ConfigDict, ValidationError

from topokeeper.contract.config import ClusterConfig
from topokeeper.contract.errors import InputError, Permanent, Retryable
from topokeeper.contract.ports import ClusterState, ReconcileRequest, Trigger
from topokeeper.service.drift import DriftReport
from topokeeper.service.orchestrators import drift_checker, reconciler, writes_live
from topokeeper.service.reconcile import (
    ControllerDeps,
    Decision,
    ReconcileReport,
    Verdict,
    decide,
    deferred_report,
    publish_entries,
)
from topokeeper.service.state import queue_next_cycle, save_fields

RETRY_SECONDS = 60  # a reconcile that failed for now is tried again this soon, not after the visibility timeout


def reconcile(request: ReconcileRequest, deps: ControllerDeps) -> ReconcileReport:
    """Reconcile the request's cluster now, or say how long its message waits (``decide``)."""
    cluster = deps.settings.cluster(request.cluster)
    if cluster is None:
        return ReconcileReport(cluster=request.cluster, generation=request.generation, action="ignored")
    state = deps.state.get(cluster.name)
    verdict = decide(state, request, deps.clock.now(), deps.settings)
    live = verdict.live_write_in if writes_live(cluster.orchestrator) else None
    if live:  # back when a live write may go: the plan then tells whether this is one
        publish_entries(deps, cluster, state)
        return deferred_report(
            cluster.name, request, replace(verdict, defer_seconds=min(live, verdict.defer_seconds or live))
        )
    if verdict.decision is not Decision.PROCEED and live is None:
        return _not_now(deps, cluster.name, request, verdict)
    return reconciler(cluster.orchestrator)(cluster, state, request, deps, verdict)


def _not_now(deps: ControllerDeps, cluster: str, request: ReconcileRequest, verdict: Verdict) -> ReconcileReport:
    """A message that waits (deferred) or has nothing left to do (covered, superseded)."""
    if verdict.decision is Decision.DEFERRED:
        return deferred_report(cluster, request, verdict)
    # A covered message may be the only one of its cycle if a reconcile died after closing the cycle: make sure
    # the changes after it have a message.
    queue_next_cycle(deps.state, deps.queue, cluster)
    return ReconcileReport(cluster=cluster, generation=request.generation, action=verdict.decision.value)


def newest_generations(bodies: Iterable[str]) -> dict[str, int]:
    """The newest generation per cluster in one batch: older messages of the batch are superseded outright."""
    newest: dict[str, int] = {}
    for body in bodies:
        try:
            request = ReconcileRequest.model_validate_json(body)
        except ValidationError:
            continue
        newest[request.cluster] = max(newest.get(request.cluster, 0), request.generation)
    return newest


def _wait_behind_delivery(deps: ControllerDeps, cluster: str, receipt_handle: str) -> None:
    """Leave the deferred message's receipt with the delivery in flight, whose result resumes it. If that
    delivery finished meanwhile, nobody would: resume it now."""
    waiting = False

    def register(fresh: ClusterState) -> dict[str, object]:
        nonlocal waiting
        waiting = fresh.pending is not None
        if fresh.pending is None:
            return {}
        return {"pending": fresh.pending.model_copy(update={"waiting_receipt": receipt_handle})}

    save_fields(deps.state, cluster, register)
    if not waiting:
        deps.queue.resume(receipt_handle)


def process_message(
    body: str, receipt_handle: str, deps: ControllerDeps, newest: Mapping[str, int]
) -> ReconcileReport | None:
    """One SQS record. Malformed, or failing for good (bad facts, a deleted cluster, access denied) -> the
    dead-letter queue with the reason; superseded within its batch -> dropped without reading state;
    deferred -> hidden for ``defer_seconds`` (the caller must leave the message in the queue); failing for
    now -> hidden for ``RETRY_SECONDS``, and the error is raised."""
    try:
        request = ReconcileRequest.model_validate_json(body)
    except ValidationError as error:
        deps.queue.dead_letter(body, InputError.from_validation(error, prefix="message").args[0])
        return None
    if newest.get(request.cluster, 0) > request.generation:
        return ReconcileReport(cluster=request.cluster, generation=request.generation, action=Decision.SUPERSEDED.value)
    try:
        report = reconcile(request, deps)
    except InputError as error:
        deps.queue.dead_letter(body, f"cannot plan {request.cluster}: {error}")
        return None
    except Permanent as error:
        deps.queue.dead_letter(body, f"{request.cluster}: {error}")
        return None
    except Exception:
        deps.queue.defer(receipt_handle, RETRY_SECONDS)
        raise
    if report.defer_seconds is not None:
        deps.queue.defer(receipt_handle, report.defer_seconds)
        if report.behind_delivery:
            _wait_behind_delivery(deps, request.cluster, receipt_handle)
    return report


def check_drift(cluster: ClusterConfig, deps: ControllerDeps, requested_by: list[Trigger] | None = None) -> DriftReport:
    return drift_checker(cluster.orchestrator)(cluster, deps, requested_by or [])


def verify_managed_updates(reconciled: ReconcileReport | None, deps: ControllerDeps) -> DriftReport | None:
    """HyperPod just changed the cluster's topology itself: check the head node now rather than at the next
    scheduled check (after the reconcile, so the plan it compares with is current)."""
    cluster = deps.settings.cluster(reconciled.cluster) if reconciled and reconciled.managed_updates else None
    if reconciled is None or cluster is None:
        return None
    return check_drift(cluster, deps, requested_by=reconciled.managed_updates)


class DriftRequest(BaseModel):
    """The scheduler's input: one cluster, or all of them when empty."""

    model_config = ConfigDict(extra="ignore")
    cluster: str | None = None


class DriftCheckFailed(Retryable):
    """Some clusters could not be checked; the others were. Fails the invocation so the errors alarm; the
    next scheduled check tries again."""

    def __init__(self, reports: list[DriftReport], failures: list[str]) -> None:
        super().__init__("; ".join(failures))
        self.reports = reports


def check_requested(request: DriftRequest, deps: ControllerDeps) -> list[DriftReport]:
    """Check the requested clusters; one failing cluster does not hide the others."""
    clusters = deps.settings.clusters
    if request.cluster is not None:
        chosen = deps.settings.cluster(request.cluster)
        clusters = [chosen] if chosen else []
    reports: list[DriftReport] = []
    failures: list[str] = []
    for cluster in clusters:
        try:
            reports.append(check_drift(cluster, deps))
        except Exception as error:  # reported per cluster, then the invocation fails
            failures.append(f"{cluster.name}: {type(error).__name__}: {error}")
    if failures:
        raise DriftCheckFailed(reports, failures)
    return reports
