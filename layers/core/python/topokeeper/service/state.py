"""Helpers the use cases share over the state and queue ports (the ports themselves: ``topokeeper.ports``)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Literal

from topokeeper.config import ClusterConfig, Mode
from topokeeper.errors import ConcurrentUpdate
from topokeeper.ports import ClusterState, ReconcileRequest, StateStore, Trigger, WorkQueue

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
    topology.conf, whose apply the applier refuses: we never fight it); else the configured mode."""
    return Mode.VERIFY if state.managed_by is not None else cluster.effective_mode


def queue_next_cycle(store: StateStore, queue: WorkQueue, cluster: str) -> None:
    """If changes are waiting that no queued message may cover, queue one (SQS deduplicates per cycle)."""
    state = store.get(cluster)
    if state.has_unreconciled_changes:
        queue.send(ReconcileRequest(cluster=cluster, generation=state.generation, since=state.reconciled_generation))


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
