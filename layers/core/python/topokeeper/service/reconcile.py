"""Reconcile: whether a message proceeds now (``decide``); a head-node cluster's reconcile (``reconcile_slurm``,
HyperPod Slurm and EC2/ParallelCluster): read the facts, plan, and deliver only when the content hash changed; and
the steps every orchestrator's reconcile shares (``service.controller`` dispatches through ``service.orchestrators``).

Level-triggered like a Kubernetes controller: a message says only that a cluster changed. A burst
collapses three ways: SQS deduplicates every change of a reconcile cycle into one message (see
``ReconcileRequest.since``); a message whose generation an earlier reconcile already covered, or that a
newer one in the same batch supersedes, is dropped; and the message waits for a quiet period
(``debounce_seconds``, bounded by ``max_wait_seconds``) and for ``min_write_interval`` since the last
write (half of it once the changes stopped, for a write that places every node: see ``decide``). Waiting
is a report with ``defer_seconds``: the message is hidden for that long with one ChangeMessageVisibility
(FIFO queues take no per-message delay), and the FIFO group keeps the cluster's later messages behind it.
A message waiting behind a delivery in flight is resumed by that delivery's result, so it spends two
receives at most, never the dead-letter queue's count.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from enum import StrEnum

from pydantic import BaseModel

from topokeeper.contract.config import ClusterConfig, Mode, Orchestrator, Settings
from topokeeper.contract.constants import (
    CLOUDTRAIL_DETAIL_TYPES,
    HYPERPOD_SOURCE,
    MANAGED_TOPOLOGY_SUMMARY,
    NODE_TABLE_REQUEST,
)
from topokeeper.contract.errors import ConcurrentUpdate, TopokeeperError
from topokeeper.contract.ports import (
    AuditSink,
    BundleSigner,
    Clock,
    ClusterState,
    DeliveryChannel,
    DeliveryHandle,
    FactsSource,
    KueueStore,
    Metric,
    Metrics,
    Outcome,
    PendingDelivery,
    PlanStore,
    ReconcileRequest,
    StateStore,
    Trigger,
    WorkQueue,
    log,
)
from topokeeper.engine.planner import plan
from topokeeper.engine.snapshot import AwsSnapshot, build_snapshot, unnamed_instances, with_node_table
from topokeeper.render.bundle import RenderedPlan, render
from topokeeper.service.live_writes import live_update_problem
from topokeeper.service.registration import (
    may_register,
    publish_registrations,
    registering_nodes,
    registers,
    with_registering,
)
from topokeeper.service.result import REGISTRATION_CHECK, REGISTRATION_CHECK_MARGIN, observed_fields
from topokeeper.service.signing import for_reading, next_generation, sign_bundle
from topokeeper.service.state import (
    OWN_TRIGGER_SOURCE,
    cluster_mode,
    for_delivery,
    queue_next_cycle,
    request_reconcile,
    save_fields,
)
from topokeeper.wire import REGISTRATION_WAIT_SECONDS, parse_slurm_version
from topokeeper.wire_updates import FIRST_INCREMENTAL_VERSION

MAX_TOPOLOGY_RETRIES = 30  # "not yet" topology data is asked again up to this many times per change
# ...and no sooner than this after the reconcile that found it missing, whatever the pacing settings: without a
# debounce and a write interval the retries would run back to back, all 30 spent in as many seconds.
TOPOLOGY_RETRY_SECONDS = 10
TOPOLOGY_RETRY = "Topology Retry"  # the detail type of the change a retry records
# A delivery with no result by then no longer blocks writes: SSM may wait up to its 600 s delivery
# timeout before running the applier, which may then run up to 600 s.
DELIVERY_TIMEOUT = timedelta(minutes=25)
CLAIM_RACE_SECONDS = 5  # another writer saved the state while this one planned: look again shortly
# Changes that stopped may be written this fraction of min_write_interval after the last write, and a message
# waiting for that looks again at most EARLY_WRITE_CHECKS times an interval.
EARLY_WRITE = 0.5
EARLY_WRITE_CHECKS = 10
# A write the head node applies live (no reconfigure) waits for no write interval, only this long after the last
# write (and the debounce): at most six commands a minute per cluster, whatever the settings.
MIN_LIVE_WRITE_SECONDS = 10
# ...and waits for the debounce's quiet spell at most this long (not max_wait_seconds, which spaces reconfigures
# too): a rolling scale-up is never quiet, and its nodes wait about half this plus the pipeline (plus EC2's report
# delay: 15 s keeps the p50 at a 30 s delay under 45 s, where 20 s gave 46 s). With MIN_LIVE_WRITE_SECONDS and one
# delivery in flight at a time: about four commands a minute while changes last.
LIVE_MAX_WAIT_SECONDS = 15
# With EARLY_WRITE_CHECKS, a delivery's two and a topology retry's TOPOLOGY_RETRY_SECONDS (1 s apart at most):
# under the queue's 50 receives.
DEBOUNCE_CHECKS = 20
# A registration wait's message looks at most this many times (10 s apart, as the default debounce does) whatever
# the debounce: once a second through the whole wait would have it dead-lettered before the wait ends.
REGISTRATION_WAIT_CHECKS = 33


class Decision(StrEnum):
    COVERED = "covered"  # an earlier reconcile already handled this generation
    SUPERSEDED = "superseded"  # a newer message for the cluster is in the same batch
    DEFERRED = "deferred"  # not now: try again in ``defer_seconds``
    PROCEED = "proceed"


@dataclass(frozen=True)
class Verdict:
    decision: Decision
    defer_seconds: float | None = None
    reason: str = ""
    behind_delivery: bool = False  # waiting for the delivery in flight, which resumes the message when done
    # Proceeding before the full min_write_interval (the changes stopped): the seconds left of it. A write that
    # would leave nodes without topology waits them out instead (``reconcile``).
    full_interval_in: float | None = None
    # Deferred by min_write_interval or the debounce: a write the head node applies live (no reconfigure) may go in
    # this many seconds, 0 now (``MIN_LIVE_WRITE_SECONDS``, ``LIVE_MAX_WAIT_SECONDS``); only a plan tells
    # (``held_back``). None: no such write.
    live_write_in: float | None = None
    debouncing: bool = False  # deferred by the debounce (a verify-mode reconcile waits for it: ``held_back``)


def _wait(seconds: float, reason: str, *, behind_delivery: bool = False) -> Verdict:
    return Verdict(Decision.DEFERRED, max(1.0, seconds), reason, behind_delivery)


def _only_own(state: ClusterState, detail_type: str) -> bool:
    """The open cycle holds only topokeeper's own ``detail_type`` and no change of the cluster (whose pacing is the
    settings' alone)."""
    return (
        bool(state.triggers)
        and state.trigger_count == len(state.triggers)
        and all(t.source == OWN_TRIGGER_SOURCE and t.detail_type == detail_type for t in state.triggers)
    )


def _to_write(state: ClusterState, rendered: RenderedPlan, now: datetime) -> bool:
    """Whether the head node is to get the plan: a new one, or the same again for a repair, a deferred node, or
    the nodes left to their registration once their wait has ended."""
    registration_due = state.registration_check_at is not None and now >= state.registration_check_at
    return (
        rendered.sha256 != state.applied_sha256
        or bool(state.repair_partitions or state.deferred_partitions)
        or registration_due
    )


def _may_write_live(state: ClusterState) -> bool:
    """Whether the head node might apply the next plan live, as far as the state tells without a plan: its last
    plan and version are known, the version is one the live path is proven on, and it took that path last time.
    Spares a cluster that always reconfigures (24.11) a plan at every debounce check."""
    if state.applied_sha256 is None or state.slurm_version is None or state.live_write_refused:
        return False
    return not state.repair_partitions and parse_slurm_version(state.slurm_version)[:2] >= FIRST_INCREMENTAL_VERSION


def decide(state: ClusterState, request: ReconcileRequest, now: datetime, settings: Settings) -> Verdict:
    """Whether to reconcile now, or how long to wait."""
    # A message stands for every change of its cycle (later ones are deduplicated into it by SQS), so it
    # reconciles whatever the state is now; only a cycle that an earlier reconcile closed is done.
    if request.generation <= state.reconciled_generation:
        return Verdict(Decision.COVERED)
    if state.pending is not None and now - state.pending.handle.sent_at < DELIVERY_TIMEOUT:
        remaining = DELIVERY_TIMEOUT - (now - state.pending.handle.sent_at)
        return _wait(remaining.total_seconds(), "a delivery is in flight", behind_delivery=True)
    if (own := _own_wait(state, now, settings)) is not None:
        return own
    quiet = float("inf") if state.last_event_at is None else (now - state.last_event_at).total_seconds()
    if state.first_pending_at is not None:
        waited = (now - state.first_pending_at).total_seconds()
        if quiet < settings.debounce_seconds and waited < settings.max_wait_seconds:
            # Back when it is quiet or when the oldest change has waited long enough, whichever comes first;
            # not more often than DEBOUNCE_CHECKS times a max wait (each return is a receive).
            wait = max(settings.debounce_seconds - quiet, settings.max_wait_seconds / DEBOUNCE_CHECKS)
            wait = min(wait, settings.max_wait_seconds - waited)
            debounced = replace(_wait(wait, "debounce: changes are still arriving"), debouncing=True)
            if not _may_write_live(state):
                return debounced
            live_in = min(settings.max_wait_seconds, LIVE_MAX_WAIT_SECONDS) - waited
            if state.last_write_at is not None:
                since = (now - state.last_write_at).total_seconds()
                live_in = max(live_in, min(settings.min_write_interval_seconds, MIN_LIVE_WRITE_SECONDS) - since)
            return replace(debounced, live_write_in=max(0.0, live_in))
    if state.last_write_at is None:
        return Verdict(Decision.PROCEED)
    since_write = (now - state.last_write_at).total_seconds()
    interval = settings.min_write_interval_seconds
    if since_write >= interval:
        return Verdict(Decision.PROCEED)
    # Changes that stopped (quiet for the debounce) may be written after part of the interval: a burst gets its
    # second write when it ends, not a whole interval after its first; writes stay within 1 / EARLY_WRITE of
    # an interval apart whatever the spacing of the changes.
    early = interval * EARLY_WRITE
    if since_write >= early and quiet >= settings.debounce_seconds:
        return Verdict(Decision.PROCEED, full_interval_in=interval - since_write)
    # Back at the first moment a quiet spell could allow it, though not more often than EARLY_WRITE_CHECKS
    # times an interval (each return is a receive), and never later than the full interval.
    wait = max(early - since_write, settings.debounce_seconds - quiet)
    if since_write >= early:
        wait = max(wait, interval / EARLY_WRITE_CHECKS)
    paced = _wait(min(wait, interval - since_write), "minimum interval between writes")
    return replace(paced, live_write_in=max(0.0, min(interval, MIN_LIVE_WRITE_SECONDS) - since_write))


def _own_wait(state: ClusterState, now: datetime, settings: Settings) -> Verdict | None:
    """The wait of a cycle that holds only topokeeper's own retry (EC2 asked again, a registration wait)."""
    if (
        state.registration_check_at is not None
        and now < state.registration_check_at
        and _only_own(state, REGISTRATION_CHECK)
    ):
        # As a topology retry waits: a change arriving meanwhile is looked at within the debounce, though not more
        # often than REGISTRATION_WAIT_CHECKS times a wait (each look is a receive).
        whole = REGISTRATION_WAIT_SECONDS + REGISTRATION_CHECK_MARGIN.total_seconds()
        look = max(1.0, settings.debounce_seconds, whole / REGISTRATION_WAIT_CHECKS)
        wait = min((state.registration_check_at - now).total_seconds(), look)
        return _wait(wait, "registration wait: the nodes left to their slurmd are looked at when it ends")
    if state.first_pending_at is not None and _only_own(state, TOPOLOGY_RETRY):
        asked = (now - state.first_pending_at).total_seconds()
        # A stamp from a clock ahead of this one (``topokeeper apply`` on an operator's machine) tells nothing
        # of how long ago EC2 was asked: no wait, rather than one for the skew or receives until it passed.
        if 0 <= asked < TOPOLOGY_RETRY_SECONDS:
            # The cycle's message also carries a change that arrives meanwhile (deduplicated into it, its FIFO
            # group behind it): it looks again as often as the debounce would, so that change waits no longer
            # than the settings say (at most TOPOLOGY_RETRY_SECONDS receives).
            wait = min(TOPOLOGY_RETRY_SECONDS - asked, max(1.0, settings.debounce_seconds))
            return _wait(wait, "topology retry: EC2 is asked again in a moment")
    return None


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
    signer: BundleSigner | None = None  # the stack's KMS key; None delivers unsigned bundles (tests, old stacks)
    # EKS clusters only: their Kueue files and the audit of each change (service/eks.py).
    kueue: KueueStore | None = None
    audit: AuditSink | None = None
    # Channel-ssm clusters with placement_metrics: the head node's placement-facts document (the drift check's).
    placement_facts: Callable[[ClusterConfig], object] | None = None


class ReconcileReport(BaseModel):
    cluster: str
    generation: int
    action: str  # covered | superseded | deferred | ignored | unchanged | delivered | planned-only | published (EKS)
    plan_sha256: str | None = None
    delivery_reference: str | None = None
    nodes_without_topology: int = 0
    undescribed: int = 0  # instances discovery did not reach in this invocation: a continuation is queued
    defer_seconds: float | None = None  # deferred: hide the message this long
    reason: str = ""  # deferred: why; planned-only: why verify when the config did not say so
    behind_delivery: bool = False  # deferred behind a delivery in flight, whose result resumes the message
    managed_updates: list[Trigger] = []  # HyperPod's own topology changes this reconcile took: verify them now


def is_managed_topology_update(trigger: Trigger) -> bool:
    """Whether a recorded trigger is HyperPod's own topology change (it asks for an immediate verify)."""
    return (
        trigger.source == HYPERPOD_SOURCE
        and trigger.detail_type in CLOUDTRAIL_DETAIL_TYPES
        and trigger.summary.startswith(MANAGED_TOPOLOGY_SUMMARY)
    )


def plan_cluster(cluster: ClusterConfig, state: ClusterState, facts: FactsSource) -> RenderedPlan:
    """Facts -> rendered plan; the head node's own Slurm version wins over the configured one."""
    return plan_facts(cluster, state, facts.read(cluster.name))


def plan_facts(cluster: ClusterConfig, state: ClusterState, raw: AwsSnapshot) -> RenderedPlan:
    """Read facts -> rendered plan. On EC2 the head node's node table names the nodes (ParallelCluster binds
    ``<queue>-st|dy-<cr>-<n>`` by NodeAddr)."""
    version = state.slurm_version or cluster.slurm_version
    return render(plan(build_snapshot(_named_by_table(cluster, state, raw), cluster.planner_config, version)))


def _named_by_table(cluster: ClusterConfig, state: ClusterState, raw: AwsSnapshot) -> AwsSnapshot:
    if cluster.orchestrator is Orchestrator.EC2 and state.slurm_nodes is not None and raw.slurm.nodes is None:
        return with_node_table(raw, state.slurm_nodes)
    return raw


def read_node_table(
    deps: ControllerDeps, cluster: ClusterConfig, state: ClusterState, raw: AwsSnapshot, rendered: RenderedPlan
) -> tuple[dict[str, object], RenderedPlan, bool]:
    """On EC2 the head node's node table names the nodes. With none stored, or with an instance that matches no
    NodeAddr and is new since the table was last read for unnamed instances, read it first (the applier's
    read-only verify: no write, no reconfigure) and plan with it. An instance still unnamed after that read is
    left out (the plan's warnings say so) and asks for no other read. An answer that comes later (the agent's)
    plans again when it arrives (``NODE_TABLE_REQUEST``). Returns the state fields the read learned (saved with
    the reconcile's own, on the state it read), the plan, and True when there is no table yet and it is on its way.
    """
    if cluster.orchestrator is not Orchestrator.EC2:
        return {}, rendered, False
    unnamed = unnamed_instances(_named_by_table(cluster, state, raw), cluster.planner_config)
    if state.slurm_nodes is not None and set(unnamed) <= set(state.table_read_for):
        return {}, rendered, False
    fields: dict[str, object] = {}
    for _ in range(2):  # once more when the read was refused only for the Slurm format it just told us
        key = "\n".join([cluster.name, str(state.generation), str(state.slurm_version), *unnamed]).encode()
        request = NODE_TABLE_REQUEST + hashlib.sha256(key).hexdigest()[:20]
        bundle = for_reading(rendered.bundle, state.bundle_generation, deps.signer, deps.clock.now())
        answer = deps.channel(cluster).verify(bundle, request=request)
        learned = observed_fields(answer)
        learned_version = learned.get("slurm_version", state.slurm_version) != state.slurm_version
        fields.update(learned)
        state = state.model_copy(update=fields)
        rendered = plan_facts(cluster, state, raw)
        if state.slurm_nodes is not None or answer.outcome is not Outcome.REFUSED or not learned_version:
            break
    # Remembered: the instances the table left unnamed (not asked about again), not all it was read for (on a
    # first read, every instance: the state item would grow with the cluster). Without a table, the next reads.
    named = state.slurm_nodes is not None
    fields["table_read_for"] = (
        unnamed_instances(_named_by_table(cluster, state, raw), cluster.planner_config) if named else []
    )
    return fields, rendered, state.slurm_nodes is None and answer.outcome is Outcome.PENDING


def missing_topology(rendered: RenderedPlan) -> int:
    """Nodes of topology-capable types that EC2 has not described yet (asked again later)."""
    return sum(len(p.nodes_without_topology) for p in rendered.plan.partitions)


def topology_retries(state: ClusterState, missing: int, undescribed: int) -> int:
    """The retries spent on topology not reported yet, counted per change: a reconcile of a change in the
    cluster (not only topokeeper's own retries) starts again at one. A discovery cut short is progress, not
    a retry: it continues until every instance was asked."""
    if not missing:
        return 0
    changed = any(trigger.source != OWN_TRIGGER_SOURCE for trigger in state.triggers)
    return (0 if changed else state.topology_retries) + int(not undescribed)


def count_coalesced(deps: ControllerDeps, cluster: str, state: ClusterState) -> None:
    """Every change since the last reconcile is handled by this one: all but one needed no reconcile of its own."""
    coalesced = state.generation - state.reconciled_generation - 1
    if coalesced > 0:
        deps.metrics.emit(cluster, Metric.EVENTS_COALESCED, coalesced)


def early_but_incomplete(verdict: Verdict, missing: int, elapsed: timedelta) -> Verdict | None:
    """An early write (before the full interval) that would leave nodes without topology: EC2 has not reported
    them yet, and writing now would need another write when it does. It waits for the full interval instead,
    whose write places what is there. None: go on."""
    if verdict.full_interval_in is None or not missing:
        return None
    reason = f"minimum interval between writes: {missing} node(s) without topology data yet"
    return _wait(verdict.full_interval_in - elapsed.total_seconds(), reason)


def held_back(
    deps: ControllerDeps, cluster: ClusterConfig, state: ClusterState, verdict: Verdict, rendered: RenderedPlan
) -> Verdict | None:
    """``verdict``'s wait (the write interval's, for a plan decided before it passed: ``Verdict.live_write_in``; or
    an early write's for nodes EC2 has not reported), unless writing ``rendered`` costs slurmctld no reconfigure:
    nothing to write, nothing written (verify), or a change the head node applies live (the interval spaces
    reconfigures). None: go on."""
    if verdict.decision is not Decision.DEFERRED:
        return None
    if cluster_mode(cluster, state) is Mode.VERIFY:
        return verdict if verdict.debouncing else None  # nothing written: only the debounce spares the reads
    if rendered.sha256 == state.applied_sha256 and not state.repair_partitions and not state.deferred_partitions:
        return None
    # A deferred node's follow-up is not a repair: the head node places it live where the plans' rule allows.
    if state.repair_partitions or state.applied_sha256 is None or state.slurm_version is None:
        return verdict  # a repair reloads the files; without the head node's last plan and version, no telling
    if state.live_write_refused:
        return verdict  # the head node reconfigured instead last time: paced as it will likely do it again
    previous = deps.plans.bundle(cluster.name, state.applied_sha256)
    return verdict if live_update_problem(previous, rendered.bundle, state.slurm_version) else None


def publish_entries(deps: ControllerDeps, cluster: ClusterConfig, state: ClusterState) -> None:
    """The registration entries alone, for a reconcile the write interval defers before it plans: they cost
    slurmctld nothing, and a new instance's node may boot meanwhile. Facts are read only where entries may be
    published; a failure leaves them to the reconcile that follows (the message is deferred all the same)."""
    if not may_register(cluster, state):
        return
    try:
        raw = deps.facts(cluster).read(cluster.name)
        rendered = plan_facts(cluster, state, raw)
    except TopokeeperError as error:
        log.warning("registration entries of %s not published before the write interval: %s", cluster.name, error)
        return
    publish_registrations(cluster, state, raw, rendered, plans=deps.plans, ledger=deps.state)


def reconcile_slurm(
    cluster: ClusterConfig, state: ClusterState, request: ReconcileRequest, deps: ControllerDeps, verdict: Verdict
) -> ReconcileReport:
    """A cluster with a head node (HyperPod Slurm, EC2/ParallelCluster), once ``reconcile`` decided to proceed
    (``verdict``): plan from the facts now, and deliver when the plan is not what the head node has."""
    started = time.monotonic()
    now = deps.clock.now()
    raw = deps.facts(cluster).read(cluster.name)
    rendered = plan_facts(cluster, state, raw)
    incomplete = early_but_incomplete(verdict, missing_topology(rendered), deps.clock.now() - now)
    # The wait spares a second reconfigure for the nodes EC2 reports later: a live write need not.
    if incomplete is not None and held_back(deps, cluster, state, incomplete, rendered) is not None:
        publish_registrations(cluster, state, raw, rendered, plans=deps.plans, ledger=deps.state)  # not write-paced
        return deferred_report(cluster.name, request, incomplete)
    # What the read learned is saved with this reconcile's fields (the claim too), conditional on the state read.
    learned, rendered, awaiting_table = read_node_table(deps, cluster, state, raw, rendered)
    state = state.model_copy(update=learned)
    entries = publish_registrations(cluster, state, raw, rendered, plans=deps.plans, ledger=deps.state)  # not paced
    if not awaiting_table and (paced := held_back(deps, cluster, state, verdict, rendered)) is not None:
        if learned:
            save_fields(deps.state, cluster.name, learned)
        return deferred_report(cluster.name, request, _wait(paced.defer_seconds or 0, paced.reason))
    count_coalesced(deps, cluster.name, state)
    if rendered.sha256 != state.desired_sha256:  # plans are content-addressed: one put per new plan
        deps.plans.put(cluster.name, rendered.bundle, rendered.files()["plan.json"])
    missing = missing_topology(rendered)
    deps.metrics.emit(cluster.name, Metric.NODES_WITHOUT_TOPOLOGY, missing)

    update: dict[str, object] = {
        **learned,
        "reconciled_generation": state.generation,
        "desired_sha256": rendered.sha256,
        "topology_retries": topology_retries(state, missing, raw.undescribed),
    }
    action, reference, reason = "unchanged", None, ""
    claimed: PendingDelivery | None = None
    if cluster_mode(cluster, state) is Mode.VERIFY:
        action = "planned-only"
        if state.managed_by is not None:
            reason = f"verify mode: the head node's topology file is generated by {state.managed_by}"
    elif awaiting_table:
        # Host names are no Slurm node's name there: slurmctld would refuse the write. The read's answer replans.
        action, reason = "planned-only", "waiting for the head node's node table"
    elif _to_write(state, rendered, now):
        delivery = _claim_delivery(deps, cluster, state, rendered, now)
        if delivery is None:
            return deferred_report(
                cluster.name, request, _wait(CLAIM_RACE_SECONDS, "the cluster's state changed while planning")
            )
        handle = _send(deps, cluster, rendered, delivery, tuple(registering_nodes(rendered.bundle, raw, entries)))
        action, reference = "delivered", handle.reference
        claimed, update["pending"] = delivery, delivery.model_copy(update={"handle": handle})
        update["last_write_at"] = now
        update["registration_check_at"] = None  # its result sets another if nodes are still left

    def record(fresh: ClusterState) -> dict[str, object]:
        fields = {**update, **_written_again(state, fresh)}
        if claimed is not None:
            if fresh.pending is not None and fresh.pending.handle == claimed.handle:
                # Keep what others added to the claim meanwhile (a message waiting behind it).
                fields["pending"] = fresh.pending.model_copy(update={"handle": handle})
            else:
                fields.pop("pending")  # its result came first and finished it, or another writer took over
                fields.pop("registration_check_at")  # ...and that result's own registration wait stands
        return fields

    save_fields(deps.state, cluster.name, record)
    close_cycle(deps, cluster.name, state, now=now, missing=missing, started=started, undescribed=raw.undescribed)
    return ReconcileReport(
        cluster=cluster.name,
        generation=request.generation,
        action=action,
        plan_sha256=rendered.sha256,
        delivery_reference=reference,
        nodes_without_topology=missing,
        undescribed=raw.undescribed,
        reason=reason,
        managed_updates=[t for t in state.triggers if is_managed_topology_update(t)],
    )


def _send(
    deps: ControllerDeps,
    cluster: ClusterConfig,
    rendered: RenderedPlan,
    delivery: PendingDelivery,
    registering: tuple[str, ...] = (),
) -> DeliveryHandle:
    """Sign the claimed plan's bundle (when the stack has a key), listing the nodes with entries, and deliver it."""
    try:
        bundle = with_registering(for_delivery(cluster, rendered.bundle), registering)
        if deps.signer is not None:
            bundle = sign_bundle(bundle, delivery.bundle_generation or 1, "apply", deps.signer)
        return deps.channel(cluster).deliver(bundle)
    except TopokeeperError:
        # AWS answered with an error (or the channel refused before sending): no command exists, so
        # nothing will ever finish this claim. Any other failure (a read timeout after SendCommand) may
        # have delivered: the claim stays until a result for its plan finishes it or the delivery
        # timeout passes, rather than risk two applies at once.
        _release_claim(deps, cluster.name, delivery)
        raise


def close_cycle(
    deps: ControllerDeps,
    cluster: str,
    state: ClusterState,
    *,
    now: datetime,
    missing: int,
    started: float,
    undescribed: int = 0,
) -> None:
    """After a reconcile saved its state: forget its triggers, queue what arrived meanwhile, continue a
    discovery cut short by its deadline (without spending a topology retry), ask again for topology data not
    reported yet, come back when a registration wait still running ends (its own trigger was among those
    forgotten), and time it."""
    deps.state.consume_triggers(cluster, state.generation)
    # Changes that arrived while this ran were deduplicated into this cycle's message: queue the next.
    check_at = queue_next_cycle(deps.state, deps.queue, cluster).registration_check_at
    again: tuple[str, str] | None = None
    if undescribed:
        again = (
            "Discovery Continues",
            f"{undescribed} instance(s) not described yet: the next reconcile continues from the cache",
        )
    elif missing and state.topology_retries < MAX_TOPOLOGY_RETRIES:
        again = (TOPOLOGY_RETRY, f"{missing} node(s) without topology data yet")
    elif check_at is not None and now < check_at:
        # One own trigger per cycle, so that its wait holds (``_own_wait``): a retry's reconcile asks this again.
        again = (REGISTRATION_CHECK, f"the registration wait still runs: the plan again at {check_at}")
    if again is not None:
        request_reconcile(deps.state, deps.queue, cluster, now, reason="retry", detail_type=again[0], summary=again[1])
    deps.metrics.emit(cluster, Metric.RECONCILE_SECONDS, time.monotonic() - started)


def deferred_report(cluster: str, request: ReconcileRequest, verdict: Verdict) -> ReconcileReport:
    return ReconcileReport(
        cluster=cluster,
        generation=request.generation,
        action=Decision.DEFERRED.value,
        defer_seconds=verdict.defer_seconds,
        reason=verdict.reason,
        behind_delivery=verdict.behind_delivery,
    )


def _written_again(state: ClusterState, fresh: ClusterState) -> dict[str, object]:
    """The repairs and deferred nodes' partitions that ``state`` held, done by this reconcile: what ``fresh`` holds
    beyond them (marked meanwhile) is left for the next."""
    repaired, placed = set(state.repair_partitions), set(state.deferred_partitions)
    fields: dict[str, object] = {
        "repair_partitions": [p for p in fresh.repair_partitions if p not in repaired],
        "deferred_partitions": [p for p in fresh.deferred_partitions if p not in placed],
    }
    if repaired:
        fields["repair_moves"] = [move for move in fresh.repair_moves if move not in state.repair_moves]
    return fields


def _claim_delivery(
    deps: ControllerDeps, cluster: ClusterConfig, state: ClusterState, rendered: RenderedPlan, now: datetime
) -> PendingDelivery | None:
    """Mark the delivery in flight before sending it, conditional on the state this reconcile read: two
    writers (the Lambda, an operator's ``topokeeper apply``) never deliver at once. None: another won."""
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
        repair=sorted({*state.repair_partitions, *state.deferred_partitions}),  # audited as rewritten, as before
        bundle_generation=next_generation(state.bundle_generation, now),
        repair_moves=state.repair_moves,
        registration=registers(cluster, state, rendered),
    )
    try:
        # Conditional on the state read: a generation is never handed out twice.
        deps.state.save(state.model_copy(update={"pending": claim, "bundle_generation": claim.bundle_generation}))
    except ConcurrentUpdate:
        return None
    return claim


def _release_claim(deps: ControllerDeps, cluster: str, claim: PendingDelivery) -> None:
    """Forget a claim whose send failed, only if it is still ours (compare-and-set)."""
    save_fields(
        deps.state,
        cluster,
        lambda fresh: {"pending": None} if fresh.pending is not None and fresh.pending.handle == claim.handle else {},
    )
