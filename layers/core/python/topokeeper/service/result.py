"""Result: a delivery outcome (SSM status event, or the head-node agent's report) -> state, audit, metrics.

Channel-agnostic past parsing: both channels carry the applier's own JSON document. Events that do
not belong to the delivery in flight (a verify command, a late duplicate) change no delivery state.
Which cluster a result is about comes from who could have sent it, never from the event's detail: the
agent's per-cluster event source, or the SSM command topokeeper itself issued.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal

from pydantic import BaseModel, ValidationError

from topokeeper.contract.config import ClusterConfig, Settings
from topokeeper.contract.constants import NODE_TABLE_REQUEST
from topokeeper.contract.errors import InputError, Retryable
from topokeeper.contract.event_schemas import (
    SSM_INVOCATION_DETAIL_TYPE,
    AgentResultDetail,
    SsmInvocationDetail,
    TopokeeperEvent,
)
from topokeeper.contract.ports import (
    ApplyResult,
    AuditRecord,
    AuditSink,
    Channel,
    Clock,
    ClusterState,
    Metric,
    Metrics,
    Outcome,
    PendingDelivery,
    PlanStore,
    StateStore,
    WorkQueue,
)
from topokeeper.domain.models import SlurmVersion
from topokeeper.service.audit import NOTHING_MOVED, build_records
from topokeeper.service.live import live_status
from topokeeper.service.live_writes import live_write_fields
from topokeeper.service.state import request_reconcile, save_fields, topology_owner_fields
from topokeeper.wire import (
    AGENT_DETAIL_TYPES,
    AGENT_SOURCE,
    AGENT_VERIFY_DETAIL_TYPE,
    REGISTRATION_WAIT_SECONDS,
    agent_source_cluster,
)

SUCCESS = frozenset({Outcome.APPLIED, Outcome.UNCHANGED})
# The head node refused the bundle as not authentic or not fresh: audited like any failure, and counted apart.
AUTHENTICITY_REFUSALS = frozenset({Outcome.BAD_SIGNATURE, Outcome.REPLAYED})
REGISTRATION_CHECK = "Registration Wait Ended"  # nodes left to their registration: the plan again when it ends
# After the head node's wait: its apply then places any left node not where the file says.
REGISTRATION_CHECK_MARGIN = timedelta(seconds=30)
TABLE_READ = "Slurm Node Table Read"  # the agent answered the reconcile's read of the node table: plan with it


@dataclass
class ResultDeps:
    settings: Settings
    state: StateStore
    plans: PlanStore
    audit: AuditSink
    queue: WorkQueue
    metrics: Metrics
    clock: Clock
    ssm_result: Callable[[ClusterConfig, str], ApplyResult]  # GetCommandInvocation for a command id


class ResultReport(BaseModel):
    status: Literal["recorded", "verify-recorded", "pending", "ignored", "refused", "outdated"]
    cluster: str | None = None
    outcome: Outcome | None = None
    audit_records: int = 0
    reason: str = ""
    verify_request: str | None = None  # the fresh verify this report answered (asked after HyperPod's own update)
    live: Literal["in_sync", "drift", "pending", "unknown"] | None = (
        None  # its verdict, when judged against the current plan
    )


def _slurm_version(result: ApplyResult) -> str | None:
    """The head node's own report of its Slurm version, if it is one (it decides the file format)."""
    reported = result.slurm_version
    if reported is None:
        return None
    try:
        SlurmVersion.parse(reported)
    except ValueError:
        return None
    return reported


def observed_fields(result: ApplyResult) -> dict[str, object]:
    """What a result tells about the head node whatever its outcome: its Slurm version and node table."""
    fields: dict[str, object] = {}
    version = _slurm_version(result)
    if version:
        fields["slurm_version"] = version
    table = result.node_table()
    if table is not None:
        fields["slurm_nodes"] = table
    fields.update(topology_owner_fields(result))  # decides the cluster's mode (service.state.cluster_mode)
    return fields


def _parse(model: type[BaseModel], event: TopokeeperEvent) -> Any:
    try:
        return model.model_validate(event.detail)
    except ValidationError as error:
        raise InputError.from_validation(error, prefix="detail") from error


def record_result(event: TopokeeperEvent, deps: ResultDeps) -> ResultReport:
    if event.source == "aws.ssm" and event.detail_type == SSM_INVOCATION_DETAIL_TYPE:
        return _record_command_result(event, deps)
    agent_report = event.detail_type in AGENT_DETAIL_TYPES
    if agent_report and event.source.startswith(AGENT_SOURCE):
        return _record_agent_report(event, deps)
    return ResultReport(status="ignored", reason=f"not a result event: {event.source} / {event.detail_type}")


def _record_command_result(event: TopokeeperEvent, deps: ResultDeps) -> ResultReport:
    """The cluster is the one whose delivery in flight is this command: aws.ssm events cannot be forged, and
    a command someone else ran on the same head node is nobody's delivery."""
    invocation = _parse(SsmInvocationDetail, event)
    candidates = [c for c in deps.settings.clusters if c.head_node == invocation.instance_id]
    if not candidates:
        return ResultReport(status="ignored", reason=f"{invocation.instance_id} is not a managed head node")
    for cluster in candidates:
        state = deps.state.get(cluster.name)
        if state.pending is not None and state.pending.handle.reference == invocation.command_id:
            result = _command_result(cluster, invocation.command_id, deps)
            return finish_delivery(cluster, state, state.pending, result, deps)
    for cluster in candidates:
        # A claim whose command id was never saved (the reconcile died after SendCommand): this command
        # is its delivery if it applied the claimed plan. Without this its apply would go unaudited.
        state = deps.state.get(cluster.name)
        if state.pending is not None and not state.pending.handle.reference:
            result = _command_result(cluster, invocation.command_id, deps)
            if _unsaved_claim_of(state.pending, result):
                handle = state.pending.handle.model_copy(update={"reference": invocation.command_id})
                return finish_delivery(
                    cluster, state, state.pending.model_copy(update={"handle": handle}), result, deps
                )
    return ResultReport(
        status="ignored",
        cluster=candidates[0].name if len(candidates) == 1 else None,
        reason="not the delivery in flight",
    )


def _command_result(cluster: ClusterConfig, command_id: str, deps: ResultDeps) -> ApplyResult:
    result = deps.ssm_result(cluster, command_id)
    if result.outcome is Outcome.PENDING:
        # GetCommandInvocation is eventually consistent behind the terminal event: fail, so the
        # asynchronous invocation is retried, rather than lose the result.
        raise Retryable(f"command {command_id} still reads {result.error or 'pending'}")
    return result


def _unsaved_claim_of(pending: PendingDelivery, result: ApplyResult) -> bool:
    """A claim whose reference (command id, S3 version id) the reconcile never saved, because it died after
    sending: a result that applied the claimed plan is that claim's delivery."""
    return not pending.handle.reference and result.mode == "apply" and result.plan_sha256 == pending.handle.plan_sha256


def _same_delivery(fresh: PendingDelivery, finishing: PendingDelivery) -> bool:
    """The delivery in flight, or the claim it was sent for with its command id unsaved."""
    if fresh.handle.reference:
        return fresh.handle.reference == finishing.handle.reference
    return fresh.handle == finishing.handle.model_copy(update={"reference": ""})


def _record_agent_report(event: TopokeeperEvent, deps: ResultDeps) -> ResultReport:
    """The source names the cluster (each agent's policy allows only its own); the detail must agree."""
    source_cluster = agent_source_cluster(event.source)
    if source_cluster is None:
        return _legacy_report(event, deps)
    report = _parse(AgentResultDetail, event)
    cluster = _agent_cluster(deps.settings, source_cluster)
    if cluster is None:
        return ResultReport(status="ignored", reason=f"no agent cluster {source_cluster} (source {event.source})")
    if report.cluster != cluster.name:
        deps.metrics.emit(cluster.name, Metric.FORGED_REPORTS, 1)
        return ResultReport(
            status="refused",
            cluster=cluster.name,
            reason=f"forged report: source {event.source} may only report on {cluster.name}, not {report.cluster!r}",
        )
    if report.result.outcome is Outcome.AGENT_OUTDATED:
        deps.metrics.emit(cluster.name, Metric.AGENT_OUTDATED, 1)
    state = deps.state.get(cluster.name)
    if event.detail_type == AGENT_VERIFY_DETAIL_TYPE:
        # The node table is kept once, in slurm_nodes, not again inside last_verify.
        kept = report.result.model_copy(update={"slurm_nodes": None})
        verified = {"last_verify": kept, "last_verify_at": deps.clock.now(), **observed_fields(report.result)}
        save_fields(deps.state, cluster.name, verified)
        if (report.verify_request or "").startswith(NODE_TABLE_REQUEST) and "slurm_nodes" in verified:
            summary = f"node table read {report.verify_request}"
            now = deps.clock.now()
            request_reconcile(
                deps.state, deps.queue, cluster.name, now, reason="retry", detail_type=TABLE_READ, summary=summary
            )
        live = _fresh_verify(cluster, state, report, deps)
        return ResultReport(
            status="verify-recorded",
            cluster=cluster.name,
            outcome=report.result.outcome,
            verify_request=report.verify_request,
            live=live,
            reason="" if report.verify_request is None or live else "a fresh verify for another plan: not judged",
        )
    pending = state.pending
    if pending is not None and report.reference and _unsaved_claim_of(pending, report.result):
        # The reconcile died after PutObject: without this the agent's apply would go unaudited.
        handle = pending.handle.model_copy(update={"reference": report.reference})
        return finish_delivery(cluster, state, pending.model_copy(update={"handle": handle}), report.result, deps)
    if pending is None or pending.handle.reference not in report.references:
        return ResultReport(status="ignored", cluster=cluster.name, reason="not the delivery in flight")
    return finish_delivery(cluster, state, pending, report.result, deps)


def _fresh_verify(
    cluster: ClusterConfig, state: ClusterState, report: AgentResultDetail, deps: ResultDeps
) -> Literal["in_sync", "drift", "pending", "unknown"] | None:
    """A verify the backend asked for when HyperPod changed the topology itself: its verdict is the drift
    metric now (the scheduled check also compares the plan with AWS; this one judges the head node only).
    None: no request, or answered for another plan than the current one."""
    if report.verify_request is None:
        return None
    if state.desired_sha256 is None or report.result.plan_sha256 != state.desired_sha256:
        return None
    live = live_status(report.result, cluster.effective_mode)
    if live != "unknown":
        deps.metrics.emit(cluster.name, Metric.TOPOLOGY_DRIFT, 1 if live == "drift" else 0)
    return live


def _agent_cluster(settings: Settings, name: str) -> ClusterConfig | None:
    """Only clusters served by an agent have an agent policy, hence a source that can be trusted."""
    return next((c for c in settings.clusters if c.name == name and c.effective_channel is Channel.AGENT), None)


class _LegacyAgentReport(BaseModel):
    """What every agent release has sent: enough to name the agent that needs the upgrade (older results
    lack fields today's ApplyResult requires, so the result itself is not read)."""

    cluster: str


def _legacy_report(event: TopokeeperEvent, deps: ResultDeps) -> ResultReport:
    """An agent from before per-cluster sources: nothing proves which cluster sent it, so it records
    nothing and only says that the agent it claims to be needs the upgrade."""
    if event.source != AGENT_SOURCE:
        return ResultReport(status="ignored", reason=f"not an agent source: {event.source}")
    report: _LegacyAgentReport = _parse(_LegacyAgentReport, event)
    cluster = _agent_cluster(deps.settings, report.cluster)
    if cluster is None:
        return ResultReport(status="ignored", reason=f"no agent cluster {report.cluster} (legacy source)")
    deps.metrics.emit(cluster.name, Metric.AGENT_OUTDATED, 1)
    return ResultReport(
        status="outdated",
        cluster=cluster.name,
        reason=f"an agent reporting as {event.source} predates per-cluster sources: re-run the install script",
    )


def moved_on_head_node(result: ApplyResult) -> bool:
    """Whether a delivery may have moved nodes on the head node: not when the head node refused it, rolled it
    back or never got it, nor when it failed with its files and live topology as they were (its own document
    says so). A channel's outcome (timed out, cancelled) cannot say: it may have."""
    if result.outcome in NOTHING_MOVED:
        return False
    untouched = result.before_sha256 is not None and result.before_sha256 == result.after_sha256
    loaded = result.reconfigured or result.nodes_updated > 0
    return not (result.outcome is Outcome.FAILED and result.applier_version is not None and untouched and not loaded)


def _audit_records(
    cluster: ClusterConfig,
    pending: PendingDelivery,
    result: ApplyResult,
    deps: ResultDeps,
    desired: dict[str, Any],
    *,
    now: datetime,
) -> list[AuditRecord]:
    """What the delivery did to each partition on the head node (nothing to audit when unchanged)."""
    if result.outcome is Outcome.UNCHANGED:
        return []
    previous = (
        deps.plans.plan_document(cluster.name, pending.previous_plan_sha256) if pending.previous_plan_sha256 else None
    )
    return build_records(
        cluster_name=cluster.name,
        previous=previous,
        desired=desired,
        delivery=pending,
        outcome=result.outcome,
        error=result.error,
        completed_at=now,
        result=result,
        moved=moved_on_head_node(result),
        deferred={row[0] for row in result.deferred if row},
    )


def _retry(
    result: ApplyResult, state: ClusterState, learned: object, deferred: set[str], *, replan_bindings: bool
) -> tuple[str, str] | None:
    """A plan rendered for the other Slurm format is refused; now that the head node told us its version
    (``learned``), plan again once. A node re-bound between plan and apply (a dynamic node resumed on another
    instance): plan again with the table this result brought. Other failures wait for the next change or the
    drift schedule. (detail type, summary) of the reconcile to queue, or None."""
    if result.outcome is Outcome.REFUSED and learned not in (None, state.slurm_version):
        return "Slurm Version Learned", f"head node runs Slurm {learned}"
    if replan_bindings:
        listed = ", ".join(sorted(deferred)[:5])
        why = result.error or f"{len(deferred)} node(s) re-bound since the plan deferred: {listed}"
        return "Slurm Node Bindings Changed", why[:200]
    return None


def _registration_check_at(result: ApplyResult, now: datetime) -> datetime | None:
    """When the plan is to come again for the nodes a successful apply left to registration: when the head node's
    first wait ends (a write within a wait leaves its nodes until then, not a whole wait more); a head node that
    does not say: a whole wait. Never beyond one, whatever the document says. None: no node was left."""
    if result.outcome not in SUCCESS or not result.left_to_registration:
        return None
    said = result.registration_wait_seconds
    wait = REGISTRATION_WAIT_SECONDS if said is None else min(max(0.0, said), REGISTRATION_WAIT_SECONDS)
    return now + timedelta(seconds=wait) + REGISTRATION_CHECK_MARGIN


def finish_delivery(
    cluster: ClusterConfig, state: ClusterState, pending: PendingDelivery, result: ApplyResult, deps: ResultDeps
) -> ResultReport:
    if result.outcome is Outcome.PENDING:
        return ResultReport(status="pending", cluster=cluster.name, outcome=result.outcome)
    now = deps.clock.now()
    deferred = {row[0] for row in result.deferred if row}
    desired = None
    if result.outcome is not Outcome.UNCHANGED or deferred:
        desired = deps.plans.plan_document(cluster.name, pending.handle.plan_sha256)
    records = _audit_records(cluster, pending, result, deps, desired, now=now) if desired is not None else []
    published = deps.audit.publish(records)

    observed = observed_fields(result)
    update: dict[str, object] = dict(observed)
    # Stale bindings are planned again with the table the result brought; a cut one (over the applier's 200
    # rows) would bind the stored, stale table again and be refused again, in a loop: a failure instead.
    replan_bindings = result.outcome is Outcome.STALE_BINDINGS and "slurm_nodes" in observed
    # Applied but for nodes re-bound since the plan: their partitions are written again even when the next plan is
    # the same (the head node does not have all of it), planned at once when the table came whole.
    waiting = sorted(p["name"] for p in (desired or {}).get("partitions", []) if deferred & set(p["nodes"]))
    if result.outcome in SUCCESS and waiting:
        replan_bindings = "slurm_nodes" in observed
    if result.outcome in SUCCESS:
        update["applied_sha256"] = pending.handle.plan_sha256
        version = str(observed.get("slurm_version") or state.slurm_version or "") or None
        update.update(live_write_fields(deps.plans, cluster.name, pending, result, version))
        if result.outcome is Outcome.APPLIED:
            deps.metrics.emit(cluster.name, Metric.TOPOLOGY_UPDATES, len(records))
    elif not replan_bindings:  # a failure, unless the plan is redone at once (below)
        deps.metrics.emit(cluster.name, Metric.APPLY_FAILURES, 1)
        if result.outcome in AUTHENTICITY_REFUSALS:
            deps.metrics.emit(cluster.name, Metric.BUNDLE_REFUSALS, 1)

    receipts: list[str] = []  # the reconcile message deferred behind this delivery
    # Nodes left to registration: the plan again when their wait ends, unless it is planned again at once (below).
    check_at = None if replan_bindings else _registration_check_at(result, now)
    checks: list[datetime] = []  # ...set only by the delivery in flight: a newer one cleared it for its own result

    def finished(fresh: ClusterState) -> dict[str, object]:
        receipts.clear()
        checks.clear()
        # Only the delivery still in flight is finished: a late result of an older one must not undo a newer.
        if fresh.pending is None or not _same_delivery(fresh.pending, pending):
            return observed
        if fresh.pending.waiting_receipt:
            receipts.append(fresh.pending.waiting_receipt)
        fields: dict[str, object] = {**update, "pending": None}
        if check_at is not None:
            checks.append(check_at)
            fields["registration_check_at"] = check_at
        if result.outcome in SUCCESS and waiting:
            fields["deferred_partitions"] = sorted({*fresh.deferred_partitions, *waiting})
        return fields

    save_fields(deps.state, cluster.name, finished)
    for receipt in receipts:
        deps.queue.resume(receipt)

    retry = _retry(result, state, update.get("slurm_version"), deferred, replan_bindings=replan_bindings)
    if retry is None and checks:
        left = result.left_to_registration
        retry = (
            REGISTRATION_CHECK,
            f"{left} node(s) left to their registration: placed where the file says if not by {checks[0]}",
        )
    if retry is not None:
        request_reconcile(
            deps.state, deps.queue, cluster.name, now, reason="retry", detail_type=retry[0], summary=retry[1]
        )
    return ResultReport(status="recorded", cluster=cluster.name, outcome=result.outcome, audit_records=published)
