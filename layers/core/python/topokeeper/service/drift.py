"""Drift: on a schedule, compare the live topology with the desired plan, and the plan with AWS now.

Live drift is a hand edit or another writer on the head node; AWS drift is a change whose event was
lost. Both set ``TopologyDrift`` to 1. A difference that changes in progress explain is ``pending``, not drift
(``TopologyDrift`` 0): a delivery in flight (live), or changes newer than the last reconcile whose oldest is
younger than ``max_wait_seconds`` plus the delivery timeout (AWS), as during a rolling scale-up. In enforce
mode drift triggers a reconcile (live drift also forgets the applied hash, so the plan is written again); in
verify mode it is only reported, so topokeeper never fights HyperPod's own topology management.
"""

from __future__ import annotations

import hashlib
from datetime import datetime, timedelta
from typing import Literal

from pydantic import BaseModel, ConfigDict

from topokeeper.config import ClusterConfig, Mode, Orchestrator, Settings
from topokeeper.errors import Retryable
from topokeeper.ports import ApplyResult, ClusterState, Metric, NodeMove, Outcome, Trigger
from topokeeper.render.bundle import Bundle
from topokeeper.service.live import live_status
from topokeeper.service.reconcile import (
    DELIVERY_TIMEOUT,
    ControllerDeps,
    ReconcileReport,
    missing_topology,
    plan_cluster,
)
from topokeeper.service.signing import for_reading
from topokeeper.service.state import cluster_mode, request_reconcile, save_fields, topology_owner_fields

DRIFT_CHECK = "Topology Drift Check"


class DriftReport(BaseModel):
    cluster: str
    live: Literal["in_sync", "drift", "pending", "unknown", "not-applicable"]  # not-applicable: EKS, no head node
    aws: Literal["current", "changed", "pending", "unknown"]
    drift: int | None
    action: Literal["none", "reported", "reconcile-requested"]
    detail: list[dict[str, object]] = []
    moved: list[NodeMove] = []  # nodes in another leaf or block live than in the plan
    error: str | None = None
    requested_by: list[Trigger] = []  # HyperPod's own topology changes (their CloudTrail events) that asked for it
    verify_request: str | None = None  # the fresh verify asked of the head node for them (its report names it)


def drifted_partitions(result: ApplyResult, bundle: Bundle) -> list[str]:
    """The partitions a verify found drifted. A topology or partition entry names them; an edited file or
    plugin with no such entry (not reconfigured yet) may touch any assigned partition."""
    by_topology: dict[str, list[str]] = {}
    for partition, topology in bundle.partitions.items():
        by_topology.setdefault(topology or "", []).append(partition)
    named: set[str] = set()
    for item in result.drift:
        what, name = item.get("what"), str(item.get("name", ""))
        if what in ("partition", "grouping") and name in bundle.partitions:
            named.add(name)
        elif what in ("topology", "grouping"):
            # Before 25.05 one topology serves every partition.
            named.update(by_topology.get(name, []) if bundle.topology_plugin is None else bundle.partitions)
    if named:
        return sorted(named)
    if any(item.get("what") in ("file", "plugin") for item in result.drift):
        return sorted(p for p, t in bundle.partitions.items() if t is not None or bundle.topology_plugin)
    return []


def live_moves(result: ApplyResult) -> list[NodeMove]:
    """What a verify found in another leaf or block than planned (the applier's read-back ``moved``)."""
    moves = {
        str(item["node"]): NodeMove(node=str(item["node"]), before=item.get("live"), after=item.get("planned"))
        for entry in result.readback.values()
        for item in entry.get("moved", [])
        if isinstance(item, dict) and item.get("node")
    }
    return [moves[node] for node in sorted(moves)]


def pending_window(settings: Settings) -> timedelta:
    """How long changes newer than the last reconcile may explain a difference before it counts as drift: the
    reconcile may wait ``max_wait_seconds`` for them, then its delivery up to the delivery timeout."""
    return timedelta(seconds=settings.max_wait_seconds) + DELIVERY_TIMEOUT


def aws_status(
    state: ClusterState, planned_sha256: str, now: datetime, settings: Settings
) -> Literal["current", "changed", "pending"]:
    """AWS against the desired plan: the same, changed by changes still on their way (pending), or changed
    with nothing on its way to explain it (a lost event, or changes stuck longer than the window)."""
    if planned_sha256 == state.desired_sha256:
        return "current"
    oldest = state.first_pending_at or state.last_event_at
    if state.has_unreconciled_changes and oldest is not None and now - oldest < pending_window(settings):
        return "pending"
    return "changed"


def _observed(deps: ControllerDeps, cluster: str, state: ClusterState, live_result: ApplyResult) -> ClusterState:
    """Keep what the verify told about the head node: its node table (plan with the bindings as they are now:
    a re-bound node is a change) and a topology file another tool writes (the cluster is verify from now)."""
    fields: dict[str, object] = {}
    table = live_result.node_table()
    if table is not None:
        fields["slurm_nodes"] = table
    fields.update(topology_owner_fields(live_result))
    if fields:
        save_fields(deps.state, cluster, fields)
    return state.model_copy(update=fields)


def check_drift(cluster: ClusterConfig, deps: ControllerDeps, requested_by: list[Trigger] | None = None) -> DriftReport:
    if cluster.orchestrator is Orchestrator.EKS:
        from topokeeper.service.eks import check_eks_drift  # noqa: PLC0415 (it builds on this module)

        return check_eks_drift(cluster, deps, requested_by or [])
    now = deps.clock.now()
    state = deps.state.get(cluster.name)
    request = verify_request_id(requested_by) if requested_by else None
    if state.desired_sha256 is None:
        request_reconcile(
            deps.state,
            deps.queue,
            cluster.name,
            now,
            reason="drift",
            detail_type=DRIFT_CHECK,
            summary="no desired plan yet",
        )
        return DriftReport(
            cluster=cluster.name,
            live="unknown",
            aws="unknown",
            drift=None,
            action="reconcile-requested",
            requested_by=requested_by or [],
        )

    bundle = deps.plans.bundle(cluster.name, state.desired_sha256)
    in_flight = state.pending is not None and now - state.pending.handle.sent_at < DELIVERY_TIMEOUT
    not_landed = cluster_mode(cluster, state) is Mode.ENFORCE and state.applied_sha256 != state.desired_sha256
    writing = state.pending is not None or not_landed
    if writing:
        # The head node is being brought to the plan: comparing it now would report a change as drift.
        live_result = ApplyResult.from_channel(
            Outcome.PENDING, "a delivery is in flight" if in_flight else "the last write did not land"
        )
    else:
        live_result = deps.channel(cluster).verify(
            for_reading(bundle, state.bundle_generation, deps.signer, now), request=request
        )
    state = _observed(deps, cluster.name, state, live_result)
    # A write that did not land, or whose delivery outlived its timeout, is no change on its way; a verify the
    # agent answers later (PENDING) is judged when its report comes, not now.
    live = live_status(live_result, cluster_mode(cluster, state)) if in_flight or not writing else "unknown"
    if not writing and live == "pending":
        live = "unknown"
    moved = live_moves(live_result) if live == "drift" else []
    rendered = plan_cluster(cluster, state, deps.facts(cluster))
    aws = aws_status(state, rendered.sha256, now, deps.settings)
    deps.metrics.emit(cluster.name, Metric.NODES_WITHOUT_TOPOLOGY, missing_topology(rendered))

    drift: int | None = 1 if live == "drift" or aws == "changed" else (0 if live in ("in_sync", "pending") else None)
    if drift is not None:
        deps.metrics.emit(cluster.name, Metric.TOPOLOGY_DRIFT, drift)
    action: Literal["none", "reported", "reconcile-requested"] = "none"
    if drift == 1 and cluster_mode(cluster, state) is Mode.ENFORCE:
        if live == "drift":
            repair = drifted_partitions(live_result, bundle) or sorted(bundle.partitions)
            save_fields(
                deps.state,
                cluster.name,
                lambda fresh: {
                    "repair_partitions": sorted(set(fresh.repair_partitions) | set(repair)),
                    "repair_moves": moved or fresh.repair_moves,
                },
            )
        action = "reconcile-requested"
    elif aws == "changed":
        action = "reconcile-requested"  # a lost event: plan again (verify mode only re-plans, never writes)
    elif writing and state.pending is None:
        action = "reconcile-requested"  # the last write did not land (refused, rolled back): try again
    elif drift == 1:
        action = "reported"
    if action == "reconcile-requested":
        request_reconcile(
            deps.state,
            deps.queue,
            cluster.name,
            now,
            reason="drift",
            detail_type=DRIFT_CHECK,
            summary=f"drift: live {live}, AWS {aws}",
        )
    return DriftReport(
        cluster=cluster.name,
        live=live,
        aws=aws,
        drift=drift,
        action=action,
        detail=live_result.drift,
        moved=moved,
        error=live_result.error if live == "unknown" else None,
        requested_by=requested_by or [],
        verify_request=request if not writing else None,
    )


def verify_request_id(triggers: list[Trigger]) -> str:
    """The same triggers ask the same request (a retried reconcile asks nothing new of the head node)."""
    return "vr-" + hashlib.sha256("\n".join(t.event_id for t in triggers).encode()).hexdigest()[:20]


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
