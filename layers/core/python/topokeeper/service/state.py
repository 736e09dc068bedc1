"""Helpers the use cases share over the state and queue ports (the ports themselves: ``topokeeper.contract.ports``)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Literal

from topokeeper.contract.config import ClusterConfig, Mode
from topokeeper.contract.errors import ConcurrentUpdate
from topokeeper.contract.ports import ApplyResult, ClusterState, ReconcileRequest, StateStore, Trigger, WorkQueue
from topokeeper.render.bundle import Bundle

Update = dict[str, object] | Callable[[ClusterState], dict[str, object]]


def save_fields(store: StateStore, cluster: str, update: Update, attempts: int = 5) -> ClusterState:
    """Set controller fields on the freshest state, retrying when another function saved in between.

    ``update`` may be a function of the fresh state, for fields that depend on it (compare-and-set).
    """
    failures = 0
    while True:
        fresh = store.get(cluster)
        fields = update(fresh) if callable(update) else update
        if not fields:
            return fresh
        try:
            return store.save(fresh.model_copy(update=fields))
        except ConcurrentUpdate:
            failures += 1
            if failures >= attempts:
                raise


def cluster_mode(cluster: ClusterConfig, state: ClusterState) -> Mode:
    """Verify once the head node reported a topology file another tool writes (ParallelCluster's generated
    topology.conf, whose apply the applier refuses: we never fight it), unless the cluster is configured to
    replace it (``replace_parallelcluster_topology``: its regeneration is then drift to repair); else the
    configured mode."""
    if state.managed_by is not None and not cluster.replace_parallelcluster_topology:
        return Mode.VERIFY
    return cluster.effective_mode


def for_delivery(cluster: ClusterConfig, bundle: Bundle) -> Bundle:
    """The bundle an apply delivers: it tells the applier when the cluster lets it replace ParallelCluster's
    topology file (signed with the rest, so no one else can tell it)."""
    if cluster.replace_parallelcluster_topology:
        return bundle.model_copy(update={"replace_managed": "parallelcluster"})
    return bundle


def topology_owner_fields(result: ApplyResult) -> dict[str, object]:
    """Who else writes the head node's topology file, as far as ``result`` says: kept once seen, cleared when a
    later document that looked says nobody does (ParallelCluster's file replaced or removed)."""
    if result.managed_by is not None:
        return {"managed_by": result.managed_by}
    return {"managed_by": None} if result.saw_topology_owner else {}


def queue_next_cycle(store: StateStore, queue: WorkQueue, cluster: str) -> ClusterState:
    """If changes are waiting that no queued message may cover, queue one (SQS deduplicates per cycle); the state
    read."""
    state = store.get(cluster)
    if state.has_unreconciled_changes:
        queue.send(ReconcileRequest(cluster=cluster, generation=state.generation, since=state.reconciled_generation))
    return state


OWN_TRIGGER_SOURCE = "topokeeper"  # a trigger topokeeper itself noticed (retry, drift, operator), not a cluster change


def request_reconcile(
    store: StateStore,
    queue: WorkQueue,
    cluster: str,
    now: datetime,
    *,
    reason: Literal["drift", "retry", "operator"],
    detail_type: str,
    summary: str,
) -> int:
    """Count a change that topokeeper itself noticed, and queue a reconcile for it."""
    trigger = Trigger(
        source=OWN_TRIGGER_SOURCE,
        detail_type=detail_type,
        event_id=f"{reason}-{now.isoformat()}",
        time=now,
        summary=summary,
    )
    state = store.record_change(cluster, trigger, now)
    queue.send(
        ReconcileRequest(cluster=cluster, generation=state.generation, since=state.reconciled_generation, reason=reason)
    )
    return state.generation
