"""Drift of a head-node cluster (``check_slurm_drift``; ``service.controller.check_drift`` dispatches): on a schedule,
compare the live topology with the desired plan, and the plan with AWS now.

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

from pydantic import BaseModel

from topokeeper.contract.config import ClusterConfig, Mode, Settings
from topokeeper.contract.errors import TopokeeperError
from topokeeper.contract.ports import ApplyResult, ClusterState, Metric, NodeMove, Outcome, Trigger, log
from topokeeper.domain import placement
from topokeeper.render.bundle import Bundle
from topokeeper.service.live import live_status
from topokeeper.service.reconcile import (
    DELIVERY_TIMEOUT,
    ControllerDeps,
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


def check_slurm_drift(cluster: ClusterConfig, deps: ControllerDeps, requested_by: list[Trigger]) -> DriftReport:
    """A cluster with a head node (HyperPod Slurm, EC2/ParallelCluster): its live topology against the plan (the
    head node's verify), and the plan against AWS now."""
    now = deps.clock.now()
    state = deps.state.get(cluster.name)
    if state.desired_sha256 is None:
        _request_reconcile(deps, cluster.name, now, "no desired plan yet")
        return DriftReport(
            cluster=cluster.name,
            live="unknown",
            aws="unknown",
            drift=None,
            action="reconcile-requested",
            requested_by=requested_by,
        )
    request = verify_request_id(requested_by) if requested_by else None
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
    action = _action(cluster, state, drift=drift, live=live, aws=aws, writing=writing)
    if action == "reconcile-requested":
        if drift == 1 and live == "drift" and cluster_mode(cluster, state) is Mode.ENFORCE:
            _mark_repair(
                deps, cluster.name, drifted_partitions(live_result, bundle) or sorted(bundle.partitions), moved
            )
        _request_reconcile(deps, cluster.name, now, f"drift: live {live}, AWS {aws}")
    if cluster.placement_metrics:  # a view, after the verdict and its repair: whatever it meets, those are done
        emit_placement_metrics(cluster, deps)
    return DriftReport(
        cluster=cluster.name,
        live=live,
        aws=aws,
        drift=drift,
        action=action,
        detail=live_result.drift,
        moved=moved,
        error=live_result.error if live == "unknown" else None,
        requested_by=requested_by,
        verify_request=request if not writing else None,
    )


def emit_placement_metrics(cluster: ClusterConfig, deps: ControllerDeps) -> None:
    """Each partition's placement figures (docs/placement.md) as metrics. They are a view, not the drift
    verdict: a head node that cannot give its facts is logged and counted, and the check goes on."""
    try:
        if deps.placement_facts is None:
            raise TopokeeperError("this function cannot read placement facts")
        facts = placement.facts_from_compact(deps.placement_facts(cluster), f"{cluster.name}: placement-facts")
    # A view only: whatever stops it (a lost connection too) never fails the drift check.
    except Exception as error:
        log.warning("placement metrics of %s not emitted: %s", cluster.name, error)
        deps.metrics.emit(cluster.name, Metric.PLACEMENT_FACTS_FAILURES, 1)
        return
    deps.metrics.emit(cluster.name, Metric.PLACEMENT_FACTS_FAILURES, 0)
    for figure in placement.figures(facts):
        name = figure.partition
        deps.metrics.emit(cluster.name, Metric.LARGEST_PLACEABLE_JOB_NODES, figure.largest, partition=name)
        spread = sum(job.beyond_need for job in figure.spread)
        deps.metrics.emit(cluster.name, Metric.JOBS_SPREAD_BEYOND_NEED, spread, partition=name)
        waits = [job.seconds for job in figure.pending if job.on_topology]
        deps.metrics.emit(cluster.name, Metric.TOPOLOGY_PENDING_SECONDS, max(waits, default=0), partition=name)


DriftAction = Literal["none", "reported", "reconcile-requested"]


def _action(
    cluster: ClusterConfig, state: ClusterState, *, drift: int | None, live: str, aws: str, writing: bool
) -> DriftAction:
    """What the check does about what it found: reconcile (enforce mode; in verify mode only a lost event's
    re-plan, which never writes), report, or nothing."""
    if drift == 1 and cluster_mode(cluster, state) is Mode.ENFORCE:
        return "reconcile-requested"
    if aws == "changed":
        return "reconcile-requested"  # a lost event: plan again (verify mode only re-plans, never writes)
    if writing and state.pending is None:
        return "reconcile-requested"  # the last write did not land (refused, rolled back): try again
    if drift == 1:
        return "reported"
    return "none"


def _mark_repair(deps: ControllerDeps, cluster: str, repair: list[str], moved: list[NodeMove]) -> None:
    """Live drift in enforce mode: the next reconcile writes these partitions again, even with an unchanged plan."""
    save_fields(
        deps.state,
        cluster,
        lambda fresh: {
            "repair_partitions": sorted(set(fresh.repair_partitions) | set(repair)),
            "repair_moves": moved or fresh.repair_moves,
        },
    )


def _request_reconcile(deps: ControllerDeps, cluster: str, now: datetime, summary: str) -> None:
    request_reconcile(deps.state, deps.queue, cluster, now, reason="drift", detail_type=DRIFT_CHECK, summary=summary)


def verify_request_id(triggers: list[Trigger]) -> str:
    """The same triggers ask the same request (a retried reconcile asks nothing new of the head node)."""
    return "vr-" + hashlib.sha256("\n".join(t.event_id for t in triggers).encode()).hexdigest()[:20]
