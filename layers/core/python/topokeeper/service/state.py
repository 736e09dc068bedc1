"""Per-cluster controller state, and the ports that keep it, the plans, the queue and the audit trail."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from datetime import datetime
from typing import Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field

from topokeeper.errors import ConcurrentUpdate
from topokeeper.events import ReconcileRequest
from topokeeper.ports import ApplyResult, DeliveryHandle
from topokeeper.render.bundle import Bundle

MAX_TRIGGERS = 20  # the events kept to explain a change; a 1,000-event burst keeps a count beyond that


class Trigger(BaseModel):
    """An event that caused (part of) a reconcile, as the audit record names it."""

    model_config = ConfigDict(frozen=True)
    source: str
    detail_type: str
    event_id: str
    time: datetime
    summary: str = ""


class PendingDelivery(BaseModel):
    handle: DeliveryHandle
    generation: int
    triggers: list[Trigger] = Field(default_factory=list)
    trigger_count: int = 0
    previous_plan_sha256: str | None = None
    repair: list[str] = Field(default_factory=list)  # partitions rewritten because the live topology drifted


class ClusterState(BaseModel):
    """What the controller knows about one cluster between invocations."""

    cluster: str
    generation: int = 0  # bumped by every change event
    reconciled_generation: int = 0  # the newest generation a reconcile has fully handled
    last_event_at: datetime | None = None
    first_pending_at: datetime | None = None  # oldest change not yet reconciled (bounds the debounce)
    triggers: list[Trigger] = Field(default_factory=list)
    trigger_count: int = 0
    desired_sha256: str | None = None
    applied_sha256: str | None = None
    last_write_at: datetime | None = None
    pending: PendingDelivery | None = None
    slurm_version: str | None = None  # as the head node reported it
    topology_retries: int = 0
    repair_partitions: list[str] = Field(default_factory=list)  # live drift to repair on the next write
    last_verify: ApplyResult | None = None
    last_verify_at: datetime | None = None
    version: int = 0  # optimistic concurrency

    @property
    def has_unreconciled_changes(self) -> bool:
        return self.generation > self.reconciled_generation


class StateStore(Protocol):
    def get(self, cluster: str) -> ClusterState: ...

    def save(self, state: ClusterState) -> ClusterState:
        """Write ``state`` if nobody else wrote since it was read (raises ``ConcurrentUpdate``)."""
        ...

    def record_change(self, cluster: str, trigger: Trigger, now: datetime) -> ClusterState:
        """Atomically bump the generation and remember the trigger."""
        ...

    def consume_triggers(self, cluster: str, generation: int) -> None:
        """Forget the triggers a reconcile took, unless newer changes arrived meanwhile."""
        ...

    def seen(self, event_id: str) -> bool:
        """Whether an event was already ingested (EventBridge may deliver an event more than once)."""
        ...

    def mark_seen(self, event_id: str, now: datetime) -> None: ...


class PlanStore(Protocol):
    def put(self, cluster: str, bundle: Bundle, plan_document: str) -> str: ...

    def bundle(self, cluster: str, sha256: str) -> Bundle: ...

    def plan_document(self, cluster: str, sha256: str) -> dict[str, object]: ...


class WorkQueue(Protocol):
    def send(self, request: ReconcileRequest) -> None: ...

    def defer(self, receipt_handle: str, seconds: float) -> None: ...

    def dead_letter(self, body: str, reason: str) -> None: ...


class NodeFactsCache(Protocol):
    def get_many(self, cluster: str, instance_ids: Iterable[str]) -> dict[str, dict[str, object]]: ...

    def put_many(self, cluster: str, items: dict[str, dict[str, object]], now: datetime) -> None: ...


Update = dict[str, object] | Callable[[ClusterState], dict[str, object]]


def save_fields(store: StateStore, cluster: str, update: Update, attempts: int = 5) -> ClusterState:
    """Set controller fields on the freshest state, retrying when another function saved in between.

    ``update`` may be a function of the fresh state, for fields that depend on it (compare-and-set).
    """
    failures = 0
    while True:
        fresh = store.get(cluster)
        fields = update(fresh) if callable(update) else update
        try:
            return store.save(fresh.model_copy(update=fields))
        except ConcurrentUpdate:
            failures += 1
            if failures >= attempts:
                raise


def queue_next_cycle(store: StateStore, queue: WorkQueue, cluster: str) -> None:
    """If changes are waiting that no queued message may cover, queue one (SQS deduplicates per cycle)."""
    state = store.get(cluster)
    if state.has_unreconciled_changes:
        queue.send(ReconcileRequest(cluster=cluster, generation=state.generation, since=state.reconciled_generation))


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
        source="topokeeper", detail_type=detail_type, event_id=f"{reason}-{now.isoformat()}", time=now, summary=summary
    )
    state = store.record_change(cluster, trigger, now)
    queue.send(
        ReconcileRequest(cluster=cluster, generation=state.generation, since=state.reconciled_generation, reason=reason)
    )
    return state.generation
