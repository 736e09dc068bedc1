"""Reconcile: read the facts, plan, and deliver only when the content hash changed.

Level-triggered like a Kubernetes controller: a message says only that a cluster changed. A burst
collapses three ways: SQS deduplicates every change of a reconcile cycle into one message (see
``ReconcileRequest.since``); a message whose generation an earlier reconcile already covered, or that a
newer one in the same batch supersedes, is dropped; and the message waits for a quiet period
(``debounce_seconds``, bounded by ``max_wait_seconds``) and for ``min_write_interval`` since the last
write. Waiting is expressed as ``Deferred``: the handler hides the message for that long, and the FIFO
group keeps the cluster's later messages behind it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum

from botocore.exceptions import ClientError
from pydantic import BaseModel, ValidationError

from topokeeper.config import ClusterConfig, Mode, Settings
from topokeeper.engine.planner import plan
from topokeeper.engine.snapshot import build_snapshot
from topokeeper.errors import ConcurrentUpdate, InputError
from topokeeper.events import ReconcileRequest
from topokeeper.ports import Clock, DeliveryChannel, DeliveryHandle, FactsSource, Metric, Metrics
from topokeeper.render.bundle import RenderedPlan, render
from topokeeper.service.state import (
    ClusterState,
    PendingDelivery,
    PlanStore,
    StateStore,
    WorkQueue,
    queue_next_cycle,
    request_reconcile,
    save_fields,
)

MAX_TOPOLOGY_RETRIES = 30  # "not yet" topology data is asked again up to this many times per change
# A delivery with no result by then no longer blocks writes: SSM may wait up to its 600 s delivery
# timeout before running the applier, which may then run up to 600 s.
DELIVERY_TIMEOUT = timedelta(minutes=25)
RETRY_SECONDS = 60
PERMANENT_ERRORS = frozenset(
    {"ResourceNotFound", "ValidationException", "AccessDeniedException", "AccessDenied"}
)  # a reconcile that failed is tried again this soon, not after the queue's visibility timeout


class Deferred(Exception):
    """Not now: try this message again in ``seconds``."""

    def __init__(self, seconds: float, reason: str) -> None:
        super().__init__(f"deferred {seconds:.0f}s: {reason}")
        self.seconds = max(1.0, seconds)
        self.reason = reason


class Decision(StrEnum):
    COVERED = "covered"  # an earlier reconcile already handled this generation
    SUPERSEDED = "superseded"  # a newer message for the cluster is in the same batch
    PROCEED = "proceed"


def decide(state: ClusterState, request: ReconcileRequest, now: datetime, settings: Settings) -> Decision:
    """Whether to reconcile now; raises ``Deferred`` when it should wait."""
    # A message stands for every change of its cycle (later ones are deduplicated into it by SQS), so it
    # reconciles whatever the state is now; only a cycle that an earlier reconcile closed is done.
    if request.generation <= state.reconciled_generation:
        return Decision.COVERED
    if state.pending is not None and now - state.pending.handle.sent_at < DELIVERY_TIMEOUT:
        remaining = DELIVERY_TIMEOUT - (now - state.pending.handle.sent_at)
        raise Deferred(min(remaining.total_seconds(), 30), "a delivery is in flight")
    if state.last_event_at is not None and state.first_pending_at is not None:
        quiet = (now - state.last_event_at).total_seconds()
        waited = (now - state.first_pending_at).total_seconds()
        if quiet < settings.debounce_seconds and waited < settings.max_wait_seconds:
            raise Deferred(settings.debounce_seconds - quiet, "debounce: changes are still arriving")
    if state.last_write_at is not None:
        since_write = (now - state.last_write_at).total_seconds()
        if since_write < settings.min_write_interval_seconds:
            raise Deferred(settings.min_write_interval_seconds - since_write, "minimum interval between writes")
    return Decision.PROCEED


@dataclass
class ControllerDeps:
    """What reconcile and drift both need: the two loops that read facts and talk to head nodes."""

    settings: Settings
    state: StateStore
    plans: PlanStore
    queue: WorkQueue
    metrics: Metrics
    clock: Clock
    facts: Callable[[ClusterConfig], FactsSource]
    channel: Callable[[ClusterConfig], DeliveryChannel]


class ReconcileReport(BaseModel):
    cluster: str
    generation: int
    action: str  # covered | superseded | ignored | unchanged | delivered | planned-only
    plan_sha256: str | None = None
    delivery_reference: str | None = None
    nodes_without_topology: int = 0


def plan_cluster(cluster: ClusterConfig, state: ClusterState, facts: FactsSource) -> RenderedPlan:
    """Facts -> rendered plan; the head node's own Slurm version wins over the configured one."""
    raw = facts.read(cluster.name)
    version = state.slurm_version or cluster.slurm_version
    return render(plan(build_snapshot(raw, cluster.planner_config, version)))


def missing_topology(rendered: RenderedPlan) -> int:
    """Nodes of topology-capable types that EC2 has not described yet (asked again later)."""
    return sum(len(p.nodes_without_topology) for p in rendered.plan.partitions)


def reconcile(request: ReconcileRequest, deps: ControllerDeps) -> ReconcileReport:
    cluster = deps.settings.cluster(request.cluster)
    if cluster is None:
        return ReconcileReport(cluster=request.cluster, generation=request.generation, action="ignored")
    started = time.monotonic()
    now = deps.clock.now()
    state = deps.state.get(cluster.name)
    decision = decide(state, request, now, deps.settings)
    if decision is not Decision.PROCEED:
        # A covered message may be the only one of its cycle if a reconcile died after closing the cycle:
        # make sure the changes after it have a message.
        queue_next_cycle(deps.state, deps.queue, cluster.name)
        return ReconcileReport(cluster=cluster.name, generation=request.generation, action=decision.value)
    # Every change since the last reconcile is handled by this one: all but one needed no reconcile of its own.
    coalesced = state.generation - state.reconciled_generation - 1
    if coalesced > 0:
        deps.metrics.emit(cluster.name, Metric.EVENTS_COALESCED, coalesced)

    rendered = plan_cluster(cluster, state, deps.facts(cluster))
    if rendered.sha256 != state.desired_sha256:  # plans are content-addressed: one put per new plan
        deps.plans.put(cluster.name, rendered.bundle, rendered.files()["plan.json"])
    missing = missing_topology(rendered)
    deps.metrics.emit(cluster.name, Metric.NODES_WITHOUT_TOPOLOGY, missing)

    update: dict[str, object] = {
        "reconciled_generation": state.generation,
        "desired_sha256": rendered.sha256,
        "topology_retries": state.topology_retries + 1 if missing else 0,
    }
    action, reference = "unchanged", None
    if cluster.effective_mode is Mode.VERIFY:
        action = "planned-only"
    elif rendered.sha256 != state.applied_sha256 or state.repair_partitions:
        delivery = _claim_delivery(deps, cluster, state, rendered, now)
        handle = deps.channel(cluster).deliver(rendered.bundle)
        action, reference = "delivered", handle.reference
        update["pending"] = delivery.model_copy(update={"handle": handle})
        update["last_write_at"] = now
    repaired = set(state.repair_partitions)
    save_fields(
        deps.state,
        cluster.name,
        lambda fresh: {**update, "repair_partitions": [p for p in fresh.repair_partitions if p not in repaired]},
    )
    deps.state.consume_triggers(cluster.name, state.generation)
    # Changes that arrived while this ran were deduplicated into this cycle's message: queue the next.
    queue_next_cycle(deps.state, deps.queue, cluster.name)

    if missing and state.topology_retries < MAX_TOPOLOGY_RETRIES:
        request_reconcile(
            deps.state,
            deps.queue,
            cluster.name,
            now,
            reason="retry",
            detail_type="Topology Retry",
            summary=f"{missing} node(s) without topology data yet",
        )
    deps.metrics.emit(cluster.name, Metric.RECONCILE_SECONDS, time.monotonic() - started)
    return ReconcileReport(
        cluster=cluster.name,
        generation=request.generation,
        action=action,
        plan_sha256=rendered.sha256,
        delivery_reference=reference,
        nodes_without_topology=missing,
    )


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


def _claim_delivery(
    deps: ControllerDeps, cluster: ClusterConfig, state: ClusterState, rendered: RenderedPlan, now: datetime
) -> PendingDelivery:
    """Mark the delivery in flight before sending it, conditional on the state this reconcile read: two
    writers (the Lambda, an operator's ``topokeeper apply``) never deliver at once."""
    claim = PendingDelivery(
        handle=DeliveryHandle(
            channel=cluster.effective_channel,
            cluster=cluster.name,
            plan_sha256=rendered.sha256,
            reference="",  # set once the channel has accepted it
            target="",
            sent_at=now,
        ),
        generation=state.generation,
        triggers=state.triggers,
        trigger_count=state.trigger_count,
        previous_plan_sha256=state.applied_sha256,
        repair=state.repair_partitions,
    )
    try:
        deps.state.save(state.model_copy(update={"pending": claim}))
    except ConcurrentUpdate as error:
        raise Deferred(5, "the cluster's state changed while planning") from error
    return claim


def process_message(
    body: str, receipt_handle: str, deps: ControllerDeps, newest: Mapping[str, int]
) -> ReconcileReport | None:
    """One SQS record. Malformed, or failing for good (bad facts, a deleted cluster) -> the dead-letter
    queue with the reason; superseded within its batch -> dropped without reading state; deferred or
    failing for now -> hidden for a while, then retried."""
    try:
        request = ReconcileRequest.model_validate_json(body)
    except ValidationError as error:
        deps.queue.dead_letter(body, InputError.from_validation(error, prefix="message").args[0])
        return None
    if newest.get(request.cluster, 0) > request.generation:
        return ReconcileReport(cluster=request.cluster, generation=request.generation, action=Decision.SUPERSEDED.value)
    try:
        return reconcile(request, deps)
    except Deferred as deferred:
        deps.queue.defer(receipt_handle, deferred.seconds)
        raise
    except InputError as error:
        deps.queue.dead_letter(body, f"cannot plan {request.cluster}: {error}")
        return None
    except ClientError as error:
        if error.response.get("Error", {}).get("Code") in PERMANENT_ERRORS:
            deps.queue.dead_letter(body, f"{request.cluster}: {error}")
            return None
        deps.queue.defer(receipt_handle, RETRY_SECONDS)
        raise
    except Exception:
        deps.queue.defer(receipt_handle, RETRY_SECONDS)
        raise
