"""The contract between the use cases (``topokeeper.service``) and the outside world: every port
(a ``Protocol``) and every value that crosses one. Adapters implement the ports with boto3
(``topokeeper.adapters``); ``tests/fakes.py`` implements each in memory.

Nothing here talks to AWS: this module imports only the pure core and pydantic.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Iterable, Sequence
from datetime import datetime
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from topokeeper.domain.models import SlurmNodeRecord, empty_dict, empty_list

if TYPE_CHECKING:  # in signatures only: ingest, which never plans or renders, loads neither the engine nor render
    from topokeeper.engine.snapshot import AwsSnapshot
    from topokeeper.render.bundle import Bundle


class Outcome(StrEnum):
    """How an apply, dry-run or verify ended: the applier's own outcomes, then the channel's."""

    APPLIED = "applied"  # written, reconfigured, read back as planned
    UNCHANGED = "unchanged"  # already current: nothing written, no reconfigure
    WOULD_APPLY = "would_apply"  # dry-run: a change is needed (see diff)
    IN_SYNC = "in_sync"  # verify: live matches the plan
    DRIFT = "drift"  # verify: live differs from the plan
    REFUSED = "refused"  # bad hash, wrong format, unknown nodes or partitions: nothing written
    BAD_SIGNATURE = "bad_signature"  # not signed by the key the head node trusts: nothing written
    REPLAYED = "replayed"  # signed, but older than the last bundle the head node applied: nothing written
    STALE_BINDINGS = "stale_bindings"  # a node the plan named is bound to another address now: plan again
    ROLLED_BACK = "rolled_back"  # slurmctld rejected it; the previous config is restored and live
    RECOVERED = "recovered"  # verify, apply: a cut-off apply's files were repaired, slurmctld is down (start it)
    FAILED = "failed"  # the applier could not finish (error says why)
    # Channel outcomes, when the applier's own document never arrived:
    PENDING = "pending"
    TIMED_OUT = "timed_out"
    CANCELLED = "cancelled"
    UNDELIVERABLE = "undeliverable"
    AGENT_OUTDATED = "agent_outdated"  # the agent refused a bundle schema newer than it knows: upgrade it


log = logging.getLogger("topokeeper")


class Channel(StrEnum):
    SSM = "ssm"
    AGENT = "agent"


class ApplyResult(BaseModel):
    """The applier's JSON document (printed on stdout), or the channel's account of why there is none.

    Every field the applier (``headnode/output.py``, ``new_result``) and the agent (``agent_result``,
    ``bounded_result``) write is declared here. A field this version does not know (from a newer or
    older applier) is ignored and logged, never refused. ``applier_version`` must be present: it is
    null only in a document the channel or the agent wrote because the applier's own never came.
    """

    model_config = ConfigDict(extra="ignore")

    outcome: Outcome
    applier_version: str | None
    mode: Literal["apply", "dry-run", "verify"] | None = "apply"
    plan_sha256: str | None = None
    before_sha256: str | None = None
    after_sha256: str | None = None
    partitions_changed: list[str] = Field(default_factory=empty_list)
    reconfigured: bool = False
    reconfigure_exit_code: int | None = None
    # How an apply brought slurmctld to the new files: "incremental" (scontrol update NodeName=.. Topology=..,
    # no reconfigure), "whole_file" (scontrol reconfigure), None (nothing loaded).
    apply_path: Literal["incremental", "whole_file"] | None = None
    nodes_updated: int = 0  # nodes the live updates moved, placed or removed
    whole_file_reason: str | None = None  # why an apply that changed files could not take the incremental path
    readback: dict[str, dict[str, Any]] = Field(default_factory=empty_dict)  # per topology: units, matches, mismatches
    partition_topologies: dict[str, Any] = Field(default_factory=empty_dict)  # slurmctld's live assignment
    drift: list[dict[str, Any]] = Field(default_factory=empty_list)
    grouping_drift: bool | None = None  # verify: nodes grouped differently, not just named so (None: not said)
    diff: str | None = None  # dry-run and verify: unified diff of the files
    slurm_version: str | None = None  # as the head node's slurmctld reports it
    slurm_format: str | None = None
    config_dir: str | None = None
    scontrol: str | None = None  # the scontrol the applier used (head nodes keep Slurm under /opt/slurm)
    backup_dir: str | None = None
    # A cut-off apply the applier found and finished or undid first: phase, action, plan_sha256, errors.
    recovery: dict[str, Any] | None = None
    duration_seconds: float = 0.0
    error: str | None = None
    dropped: dict[str, int] = Field(default_factory=empty_dict)  # entries cut to fit SSM's stdout cap
    signature: Literal["verified", "unchecked"] | None = None  # the applier checked the bundle's signature
    generation: int | None = None  # the signed bundle's generation, when the signature was verified
    truncated: bool = False  # the agent sent only a summary to fit one event
    # slurmctld's node table: [NodeName, NodeAddr, NodeHostName, "partition,..."] (dropped.slurm_nodes: cut)
    slurm_nodes: list[list[str]] | None = None
    # Who else writes the live topology file ("parallelcluster": its generated topology.conf); apply refuses then.
    managed_by: Literal["parallelcluster"] | None = None
    powered_down: list[str] = Field(default_factory=empty_list)  # planned nodes that powered down since: written anyway
    # Nodes the apply would place that slurmctld already served there (placed at registration): not updated.
    nodes_placed_before: list[str] = Field(default_factory=empty_list)
    # Registering nodes not registered yet that the apply left to their slurmd (no scontrol update), for a while.
    nodes_left_to_registration: list[str] = Field(default_factory=empty_list)
    # ...and in how many seconds the first of their waits ends (each runs from the first apply that left the node).
    registration_wait_seconds: float | None = None
    # Nodes an earlier apply left to registration that this one placed (their wait ended, or they registered
    # without their topology): audited under this apply's route.
    nodes_placed_after_wait: list[str] = Field(default_factory=empty_list)
    # Planned nodes bound to another NodeAddr now, [NodeName, planned, live]: left where they were, every other
    # node applied (headnode/deferral.py); dropped.deferred counts a cut
    deferred: list[list[str]] = Field(default_factory=empty_list)
    # Where the whole document went when stdout could not carry it: {key, bytes, sha256, error} (SSM channel)
    full_result: dict[str, Any] | None = None

    @property
    def left_to_registration(self) -> int:
        """How many nodes the apply left to registration, those cut from the document (``dropped``) too."""
        return len(self.nodes_left_to_registration) + self.dropped.get("nodes_left_to_registration", 0)

    @property
    def saw_topology_owner(self) -> bool:
        """The applier read who writes the live topology file (it does so right after the node table): a null
        managed_by then means nobody else does, not that the document did not say."""
        return self.applier_version is not None and self.slurm_nodes is not None and not self.truncated

    def node_table(self) -> list[SlurmNodeRecord] | None:
        """The head node's whole node table, or None when it did not send one or had to cut it."""
        if self.slurm_nodes is None or self.dropped.get("slurm_nodes") or self.truncated:
            return None
        return [
            SlurmNodeRecord(
                name=name, address=address, hostname=hostname, partitions=[p for p in parts.split(",") if p]
            )
            for name, address, hostname, parts in (row[:4] for row in self.slurm_nodes if len(row) >= 4)
        ]

    @model_validator(mode="before")
    @classmethod
    def _log_unknown_fields(cls, data: Any) -> Any:
        if isinstance(data, dict):
            unknown = sorted(set(data) - set(cls.model_fields))
            if unknown:
                # Quoted and cut: a key is the sender's text, and must not forge or flood a log line.
                shown = ", ".join(repr(key)[:80] for key in unknown[:10])
                log.warning("ignoring result fields this version does not know: %s", shown)
        return data

    @classmethod
    def from_channel(cls, outcome: Outcome, error: str | None = None) -> ApplyResult:
        """The channel's own account, when the applier's document did not (or not yet) arrive."""
        return cls(outcome=outcome, applier_version=None, error=error)


class DeliveryHandle(BaseModel):
    """A delivery in flight: the SSM command id, or the S3 version of the agent's desired bundle."""

    model_config = ConfigDict(frozen=True)

    channel: Channel
    cluster: str
    plan_sha256: str
    reference: str
    target: str
    sent_at: datetime


class DeliveryChannel(Protocol):
    def deliver(self, bundle: Bundle) -> DeliveryHandle: ...

    def verify(self, bundle: Bundle, *, request: str | None = None) -> ApplyResult:
        """The live state compared with ``bundle``. ``request`` (an id): the live state just changed, so the
        answer must be fresh; a channel that cannot answer at once asks the head node and answers PENDING."""
        ...


class BundleSigner(Protocol):
    """The stack's asymmetric KMS key (RSA_3072, RSASSA_PKCS1_V1_5_SHA_256)."""

    @property
    def key_id(self) -> str: ...

    def sign_digest(self, digest: bytes) -> bytes:
        """The PKCS#1 v1.5 signature of a SHA-256 digest (KMS Sign, MessageType DIGEST)."""
        ...

    def public_key(self) -> bytes:
        """The DER SubjectPublicKeyInfo (KMS GetPublicKey), which head nodes trust."""
        ...


class FactsSource(Protocol):
    def read(self, cluster: str) -> AwsSnapshot: ...


class Clock(Protocol):
    def now(self) -> datetime: ...


METRICS_NAMESPACE = "topokeeper"
METRICS_DIMENSION = "cluster"
METRICS_PARTITION_DIMENSION = "partition"


class Metric(StrEnum):
    """CloudWatch metrics (namespace ``topokeeper``, dimension ``cluster``); the stack alarms on them."""

    TOPOLOGY_UPDATES = "TopologyUpdates"  # partitions whose topology changed on the head node
    TOPOLOGY_DRIFT = "TopologyDrift"  # 1 when live or AWS differs from the desired plan, else 0
    NODES_WITHOUT_TOPOLOGY = "NodesWithoutTopology"
    APPLY_FAILURES = "ApplyFailures"
    RECONCILE_SECONDS = "ReconcileSeconds"
    EVENTS_COALESCED = "EventsCoalesced"  # changes that did not need a reconcile of their own
    AGENT_OUTDATED = "AgentOutdated"  # an agent report says the head node's agent must be upgraded
    FORGED_REPORTS = "ForgedReports"  # agent reports refused: about another cluster than their source's
    BUNDLE_REFUSALS = "BundleRefusals"  # bundles the head node refused as bad_signature or replayed
    LOGIN_TARGETS_HEALTHY = "LoginTargetsHealthy"  # running login nodes the balancer finds healthy
    LOGIN_TARGETS_DRIFT = "LoginTargetsDrift"  # targets one login sync had to register or deregister
    MANAGED_TOPOLOGY_UPDATES = "ManagedTopologyUpdates"  # HyperPod's own UpdatePartitionTopology records
    # EKS: nodes with no network layers, or fewer than their flavor's Kueue Topology needs
    NODES_WITHOUT_TOPOLOGY_DATA = "NodesWithoutTopologyData"
    # Per partition (dimension ``partition`` too), for clusters with ``placement_metrics`` (docs/placement.md):
    LARGEST_PLACEABLE_JOB_NODES = "LargestPlaceableJobNodes"  # the largest job one leaf or block can start now
    JOBS_SPREAD_BEYOND_NEED = "JobsSpreadBeyondNeed"  # running jobs over more leaves or blocks than their size needs
    TOPOLOGY_PENDING_SECONDS = "TopologyPendingSeconds"  # the longest wait of a job pending on topology (0: none)
    PLACEMENT_FACTS_FAILURES = "PlacementFactsFailures"  # the head node's placement facts could not be read


class Metrics(Protocol):
    def emit(self, cluster: str, metric: Metric, value: float, partition: str | None = None) -> None:
        """``partition``: a second dimension (``METRICS_PARTITION_DIMENSION``), for the per-partition metrics."""
        ...


class RateLimiter(Protocol):
    def acquire(self) -> None:
        """Block until this caller may make one more DescribeInstanceTopology call."""
        ...


class ReconcileRequest(BaseModel):
    """The SQS FIFO message from ingest to reconcile: only *that* a cluster changed, never what.

    ``since`` is the cluster's reconciled generation when the message was sent. It is the message's
    deduplication id (with the cluster), so SQS keeps one message per reconcile cycle: every change until
    the next reconcile is already covered by the message waiting in the queue.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")
    cluster: str
    generation: int = Field(ge=1)
    since: int = Field(0, ge=0)
    reason: Literal["event", "drift", "retry", "operator"] = "event"

    @property
    def deduplication_id(self) -> str:
        return f"{self.cluster}:after:{self.since}"


class WorkQueue(Protocol):
    def send(self, request: ReconcileRequest) -> None: ...

    def defer(self, receipt_handle: str, seconds: float) -> None:
        """Hide a received message for ``seconds`` (one call; the queue caps it at what SQS allows)."""
        ...

    def resume(self, receipt_handle: str) -> None:
        """Make a deferred message visible now; a handle that is no longer in flight is ignored."""
        ...

    def dead_letter(self, body: str, reason: str) -> None: ...


MAX_TRIGGERS = 20  # the events kept to explain a change; a 1,000-event burst keeps a count beyond that


class Trigger(BaseModel):
    """An event that caused (part of) a reconcile, as the audit record names it."""

    model_config = ConfigDict(frozen=True)
    source: str
    detail_type: str
    event_id: str
    time: datetime
    summary: str = ""


class NodeMove(BaseModel):
    """A node whose leaf switch or block changes: between two plans, or from the live topology (``before``)
    to the plan (a drift repair). None: in no leaf or block (a node that joins or leaves)."""

    model_config = ConfigDict(frozen=True)
    node: str
    before: str | None
    after: str | None


class PendingDelivery(BaseModel):
    """A delivery claimed (``handle.reference`` empty until the channel accepts it) or in flight."""

    handle: DeliveryHandle
    generation: int
    triggers: list[Trigger] = Field(default_factory=empty_list)
    trigger_count: int = 0
    previous_plan_sha256: str | None = None
    repair: list[str] = Field(default_factory=empty_list)  # partitions rewritten because the live topology drifted
    repair_moves: list[NodeMove] = Field(default_factory=empty_list)  # the live drift those rewrites undo
    waiting_receipt: str | None = None  # the reconcile message deferred behind this delivery, resumed by its result
    bundle_generation: int | None = None  # the generation its bundle is signed with
    # Its plan's instances have registration entries (service/registration.py): a node the head node finds already
    # placed as planned was placed at registration.
    registration: bool = False


class ClusterState(BaseModel):
    """What the controller knows about one cluster between invocations."""

    cluster: str
    generation: int = 0  # bumped by every change event
    reconciled_generation: int = 0  # the newest generation a reconcile has fully handled
    last_event_at: datetime | None = None
    first_pending_at: datetime | None = None  # oldest change not yet reconciled (bounds the debounce)
    triggers: list[Trigger] = Field(default_factory=empty_list)
    trigger_count: int = 0
    desired_sha256: str | None = None
    applied_sha256: str | None = None
    last_write_at: datetime | None = None
    pending: PendingDelivery | None = None
    slurm_version: str | None = None  # as the head node reported it
    topology_retries: int = 0
    repair_partitions: list[str] = Field(default_factory=empty_list)  # live drift to repair on the next write
    repair_moves: list[NodeMove] = Field(default_factory=empty_list)  # nodes found in another leaf or block live
    # Partitions of nodes an apply deferred (re-bound since its plan): written again, paced as the change it is.
    deferred_partitions: list[str] = Field(default_factory=empty_list)
    last_verify: ApplyResult | None = None
    last_verify_at: datetime | None = None
    bundle_generation: int = 0  # the last generation signed for delivery: only grows (service/signing.py)
    # The head node's node table as last reported (apply, verify): ParallelCluster's names are planned from it.
    slurm_nodes: list[SlurmNodeRecord] | None = None
    # The instances the reconcile last read the node table for (none of its NodeAddrs named them): one still
    # unnamed is left out, not asked about again; only an instance new since then asks for another read.
    table_read_for: list[str] = Field(default_factory=empty_list)
    # Set once a head node reported a topology file another tool writes: the cluster is verify from then on.
    managed_by: str | None = None
    # The head node reconfigured for a change it could have applied live (its reason): writes are paced as
    # reconfigures until an apply takes the live path again (service/live_writes.py).
    live_write_refused: str | None = None
    # The head node left nodes to their slurmd's registration: when their wait ends, the plan is delivered again,
    # so one whose slurmd came without its topology is placed then, not at the next change (service/result.py).
    registration_check_at: datetime | None = None
    version: int = 0  # optimistic concurrency

    @field_validator("last_verify", mode="before")
    @classmethod
    def _stored_before_applier_version(cls, value: Any) -> Any:
        # State saved before ``applier_version`` was required: read it as "not said", never refuse the state.
        if isinstance(value, dict) and "applier_version" not in value:
            return {**value, "applier_version": None}
        return value

    @property
    def has_unreconciled_changes(self) -> bool:
        return self.generation > self.reconciled_generation


# The fields ``StateStore.record_change`` owns (ingest's atomic counter); ``save`` writes all the others,
# the controller's, guarded by ``version``: the two writers never clobber each other.
CHANGE_FIELDS = frozenset(
    {"cluster", "generation", "last_event_at", "first_pending_at", "triggers", "trigger_count", "version"}
)


class StateStore(Protocol):
    def get(self, cluster: str) -> ClusterState: ...

    def save(self, state: ClusterState) -> ClusterState:
        """Write ``state`` if nobody else wrote since it was read (raises ``ConcurrentUpdate``)."""
        ...

    def record_change(self, cluster: str, trigger: Trigger, now: datetime) -> ClusterState:
        """Atomically bump the generation and remember the trigger (the first ``MAX_TRIGGERS`` of a cycle)."""
        ...

    def consume_triggers(self, cluster: str, generation: int) -> None:
        """Forget the triggers a reconcile took, unless newer changes arrived meanwhile."""
        ...

    def seen(self, event_id: str) -> bool:
        """Whether an event was already ingested (EventBridge may deliver an event more than once)."""
        ...

    def mark_seen(self, event_id: str, now: datetime) -> None: ...

    def registrations(self, cluster: str) -> dict[str, str]:
        """{instance id: digest of its entry's value} of the registration entries published and not yet deleted
        (service/registration.py): one small record per entry, so a reconcile puts only what is missing or changed."""
        ...

    def record_registrations(self, cluster: str, published: dict[str, str], deleted: Collection[str]) -> None:
        """Remember the entries just ``published`` ({instance id: value digest}) and forget the ``deleted``."""
        ...


class PlanStore(Protocol):
    def put(self, cluster: str, bundle: Bundle, plan_document: str) -> str: ...

    def bundle(self, cluster: str, sha256: str) -> Bundle: ...

    def plan_document(self, cluster: str, sha256: str) -> dict[str, Any]: ...

    # Registration entries, {instance id: entry JSON text} (service/registration.py; keys: wire.registration_key).
    def put_registrations(self, cluster: str, entries: dict[str, str]) -> None: ...

    def delete_registrations(self, cluster: str, instance_ids: Collection[str]) -> None: ...


class NodeFactsCache(Protocol):
    def get_many(self, cluster: str, instance_ids: Iterable[str]) -> dict[str, dict[str, object]]: ...

    def put_many(self, cluster: str, items: dict[str, dict[str, object]], now: datetime) -> None: ...


PlacementRoute = Literal["registration", "update", "file"]


# The ``UpdatePartitionTopology`` record, schema ``topokeeper.audit/1`` (tests pin its JSON schema).
class AuditRecord(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    schema_: Literal["topokeeper.audit/1"] = Field("topokeeper.audit/1", alias="schema")
    event_name: Literal["UpdatePartitionTopology"] = "UpdatePartitionTopology"
    audit_id: str
    cluster_name: str
    cluster_arn: str | None
    partition: str
    reason: Literal["plan-change", "drift-repair"]
    kind: Literal["tree", "block", "flat"]
    topology: str | None
    before_sha256: str | None
    after_sha256: str
    plan_sha256: str
    previous_plan_sha256: str | None
    nodes_added: list[str]
    nodes_removed: list[str]
    nodes_added_count: int
    nodes_removed_count: int
    # Nodes whose leaf switch or block changes (a replacement in another UltraServer, a hand edit undone).
    nodes_moved: list[NodeMove] = Field(default_factory=empty_list)
    nodes_moved_count: int = 0
    # Nodes bound to another NodeAddr than the plan assumed when it landed: left where they were, placed by the
    # next plan (every other node of the partition was applied).
    nodes_deferred: list[str] = Field(default_factory=empty_list)
    nodes_deferred_count: int = 0
    node_count: int
    switch_count: int
    block_count: int
    triggers: list[Trigger]
    trigger_count: int
    channel: str
    delivery_reference: str
    target: str
    outcome: Outcome
    error: str | None
    # What the planner could not do as asked (the plan's and this partition's warnings), e.g. instances
    # DescribeInstanceTopology does not see, planned without network topology.
    warnings: list[str] = Field(default_factory=empty_list)
    # Before Slurm 25.05 one cluster-wide topology serves every partition: how this partition was folded into it.
    folds: list[str] = Field(default_factory=empty_list)
    # Which route placed the nodes this record adds or moves: "registration" (slurmd registered with the plan's
    # topology, which the head node found live before it acted, or the head node left the node to its slurmd's
    # registration; one whose wait ends before it registers is in the record of the apply that then places it),
    # "update" (scontrol update), "file" (the files and a reconfigure); none when nothing was loaded. Lists are cut
    # at MAX_LISTED_NODES, counts are exact.
    placed_by: dict[PlacementRoute, list[str]] = Field(default_factory=empty_dict)
    placed_by_count: dict[PlacementRoute, int] = Field(default_factory=empty_dict)
    generation: int
    requested_at: datetime
    completed_at: datetime

    def document(self) -> dict[str, Any]:
        return self.model_dump(mode="json", by_alias=True)


class KueueAuditRecord(BaseModel):
    """``UpdateKueueTopology``: the Kueue objects and node labels of an EKS cluster changed (plan bucket)."""

    # Built on first use: only an EKS cluster's reconcile writes one, and every function imports this module.
    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    schema_: Literal["topokeeper.audit/1"] = Field("topokeeper.audit/1", alias="schema")
    event_name: Literal["UpdateKueueTopology"] = "UpdateKueueTopology"
    audit_id: str
    cluster_name: str
    cluster_arn: str | None
    plan_sha256: str
    previous_plan_sha256: str | None
    location: str  # the plan bucket prefix holding the files
    objects: list[str]  # every object now, "Kind/name"
    objects_changed: list[str]  # added, changed or removed since the previous plan ("Kind/name")
    nodes_added: list[str]
    nodes_removed: list[str]
    nodes_relabeled: list[str]  # nodes whose topology labels changed (moved in the network)
    nodes_added_count: int
    nodes_removed_count: int
    nodes_relabeled_count: int
    node_count: int
    nodes_without_topology_data: list[str]
    nodes_without_topology_data_count: int
    warnings: list[str] = Field(default_factory=empty_list)
    triggers: list[Trigger]
    trigger_count: int
    generation: int
    completed_at: datetime

    def document(self) -> dict[str, Any]:
        return self.model_dump(mode="json", by_alias=True)


class KueueStore(Protocol):
    """The EKS side of the plan bucket: content-addressed Kueue files per cluster."""

    def put_kueue(self, cluster: str, sha256: str, files: dict[str, str]) -> str:
        """Write the files (and point ``latest`` at them); return the prefix."""
        ...

    def kueue_file(self, cluster: str, sha256: str, name: str) -> str: ...


class AuditSink(Protocol):
    def publish(self, records: Sequence[AnyAuditRecord]) -> int:
        """Store, publish and log new records; return how many were new (retries are skipped)."""
        ...


# The login endpoint's ports (service/login.py): login nodes, the balancer's target group, the ledger of the
# targets topokeeper registered, and the audit of each change.


class LoginNode(BaseModel):
    model_config = ConfigDict(frozen=True, defer_build=True)  # built on first use: login endpoints only
    node_id: str
    private_ip: str | None
    status: str


class LoginNodeSource(Protocol):
    def login_nodes(self, cluster: str) -> list[LoginNode] | None:
        """The login group's nodes with their IPs, or None when the cluster has no login group."""
        ...


class LoginTargetGroup(Protocol):
    def states(self, target_group_arn: str) -> dict[str, str]:
        """Every registered target's IP and its ELBv2 health state (initial, healthy, unhealthy, draining, ...)."""
        ...

    def register(self, target_group_arn: str, ips: Sequence[str]) -> None: ...

    def deregister(self, target_group_arn: str, ips: Sequence[str]) -> None: ...


class LoginTargetLedger(Protocol):
    """The IPs topokeeper registered in a target group: the only ones it may deregister."""

    def managed(self, cluster: str) -> frozenset[str]: ...

    def record(self, cluster: str, ips: frozenset[str]) -> None: ...


class LoginAuditRecord(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)  # built on first use: login endpoints

    schema_: Literal["topokeeper.audit/1"] = Field("topokeeper.audit/1", alias="schema")
    event_name: Literal["UpdateLoginTargets"] = "UpdateLoginTargets"
    audit_id: str
    cluster_name: str
    target_group_arn: str
    registered: list[str]
    deregistered: list[str]
    targets: list[str]
    target_count: int
    login_nodes: dict[str, str]  # IP -> node id of the running login nodes
    completed_at: datetime

    def document(self) -> dict[str, object]:
        return self.model_dump(mode="json", by_alias=True)


class LoginInstallRecord(BaseModel):
    """The host identity installer sent to one launch of an EC2 login node (tag-scoped SendCommand)."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)  # built on first use, as above

    schema_: Literal["topokeeper.audit/1"] = Field("topokeeper.audit/1", alias="schema")
    event_name: Literal["InstallLoginHostIdentity"] = "InstallLoginHostIdentity"
    audit_id: str
    cluster_name: str
    instance_id: str
    launch_time: datetime
    private_ip: str | None
    document_name: str
    command_id: str
    completed_at: datetime  # when the command was sent; its outcome is SSM's (ListCommandInvocations)

    def document(self) -> dict[str, object]:
        return self.model_dump(mode="json", by_alias=True)


class LoginAudit(Protocol):
    def publish_login(self, record: LoginAuditRecord | LoginInstallRecord) -> None: ...


class LaunchedInstance(BaseModel):
    """What DescribeInstances says of the instance an EC2 state-change event names."""

    model_config = ConfigDict(frozen=True, defer_build=True)  # built on first use: EC2 login nodes only
    instance_id: str
    state: str  # EC2's: pending, running, ...
    launch_time: datetime
    tags: dict[str, str]
    private_ip: str | None


class HostIdentitySender(Protocol):
    def send(self, instance_ids: list[str], script: str, cluster: str) -> list[str]:
        """Send the installer to the instances; return the command ids."""
        ...


class InstallClaim(StrEnum):
    CLAIMED = "claimed"  # this invocation sends
    SENT = "sent"  # an earlier invocation sent for this launch
    IN_FLIGHT = "in-flight"  # another invocation holds the claim and may still send


class LoginInstallLedger(Protocol):
    """One entry per instance launch: the installer is sent once per launch."""

    def claim(self, cluster: str, instance_id: str, launch_time: datetime, now: datetime) -> InstallClaim: ...

    def sent(self, cluster: str, instance_id: str, launch_time: datetime, command_id: str, now: datetime) -> None: ...

    def release(self, cluster: str, instance_id: str, launch_time: datetime, now: datetime) -> None: ...


# Every record the audit trail stores and publishes (its ``event_name`` is the EventBridge detail-type).
AnyAuditRecord = AuditRecord | KueueAuditRecord | LoginAuditRecord | LoginInstallRecord
