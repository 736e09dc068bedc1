"""In-memory implementations of every port in ``topokeeper.contract.ports``, for fast use-case tests.

Each fake keeps the contract its port documents (the state store's optimistic concurrency and its
split between change fields and controller fields, the queue's one-message-per-call bookkeeping), and
records what was asked of it so a test can assert on the calls. Nothing here touches AWS or the network.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

# NodeFactsCache: the operator CLI's own in-memory adapter serves as the fake (one implementation, not two).
from topokeeper.adapters.ec2 import MemoryNodeFactsCache  # noqa: F401
from topokeeper.contract.errors import ConcurrentUpdate, TopokeeperError
from topokeeper.contract.ports import (
    CHANGE_FIELDS,
    MAX_TRIGGERS,
    AnyAuditRecord,
    ApplyResult,
    Channel,
    ClusterState,
    DeliveryHandle,
    Metric,
    Outcome,
    ReconcileRequest,
    Trigger,
)
from topokeeper.engine.snapshot import AwsSnapshot
from topokeeper.render.bundle import Bundle

EPOCH = datetime(2026, 1, 5, 9, 0, tzinfo=UTC)


class FakeClock:
    def __init__(self, start: datetime = EPOCH) -> None:
        self.current = start

    def now(self) -> datetime:
        return self.current

    def advance(self, seconds: float) -> None:
        self.current += timedelta(seconds=seconds)


class MemoryStateStore:
    """Like the DynamoDB table: ``record_change`` owns the change fields, ``save`` writes only the
    controller fields and only over the version it read."""

    def __init__(self) -> None:
        self.states: dict[str, ClusterState] = {}
        self.events: set[str] = set()
        self.saves = 0
        self.published: dict[tuple[str, str], str] = {}  # (cluster, instance id) -> its entry's value digest

    def get(self, cluster: str) -> ClusterState:
        return self.states.get(cluster, ClusterState(cluster=cluster)).model_copy(deep=True)

    def save(self, state: ClusterState) -> ClusterState:
        stored = self.get(state.cluster)
        if stored.version != state.version:
            raise ConcurrentUpdate(f"cluster {state.cluster} state changed concurrently")
        controller = {name: getattr(state, name) for name in ClusterState.model_fields if name not in CHANGE_FIELDS}
        saved = stored.model_copy(update={**controller, "version": state.version + 1}, deep=True)
        self.states[state.cluster] = saved
        self.saves += 1
        return saved.model_copy(deep=True)

    def record_change(self, cluster: str, trigger: Trigger, now: datetime) -> ClusterState:
        stored = self.get(cluster)
        count = stored.trigger_count + 1
        changed = stored.model_copy(
            update={
                "generation": stored.generation + 1,
                "last_event_at": now,
                "first_pending_at": stored.first_pending_at or now,
                "trigger_count": count,
                "triggers": [*stored.triggers, trigger] if count <= MAX_TRIGGERS else stored.triggers,
            }
        )
        self.states[cluster] = changed
        return changed.model_copy(deep=True)

    def registrations(self, cluster: str) -> dict[str, str]:
        return {instance: digest for (name, instance), digest in self.published.items() if name == cluster}

    def record_registrations(self, cluster: str, published: dict[str, str], deleted: Collection[str]) -> None:
        self.published.update({(cluster, instance): digest for instance, digest in published.items()})
        for instance in deleted:
            self.published.pop((cluster, instance), None)

    def consume_triggers(self, cluster: str, generation: int) -> None:
        stored = self.get(cluster)
        if stored.generation == generation:
            self.states[cluster] = stored.model_copy(
                update={"triggers": [], "trigger_count": 0, "first_pending_at": None}
            )

    def seen(self, event_id: str) -> bool:
        return event_id in self.events

    def mark_seen(self, event_id: str, now: datetime) -> None:
        self.events.add(event_id)


class MemoryPlanStore:
    def __init__(self) -> None:
        self.bundles: dict[tuple[str, str], Bundle] = {}
        self.documents: dict[tuple[str, str], dict[str, Any]] = {}
        self.registrations: dict[tuple[str, str], str] = {}  # (cluster, instance id) -> entry text
        self.registration_puts = 0

    def put(self, cluster: str, bundle: Bundle, plan_document: str) -> str:
        self.bundles[(cluster, bundle.plan_sha256)] = bundle
        self.documents[(cluster, bundle.plan_sha256)] = json.loads(plan_document)
        return f"plans/{cluster}/{bundle.plan_sha256}/"

    def bundle(self, cluster: str, sha256: str) -> Bundle:
        return self.bundles[(cluster, sha256)]

    def plan_document(self, cluster: str, sha256: str) -> dict[str, Any]:
        return self.documents[(cluster, sha256)]

    def put_registrations(self, cluster: str, entries: dict[str, str]) -> None:
        self.registration_puts += len(entries)
        self.registrations.update({(cluster, instance): text for instance, text in entries.items()})

    def delete_registrations(self, cluster: str, instance_ids: Collection[str]) -> None:
        for instance in instance_ids:
            self.registrations.pop((cluster, instance), None)


class MemoryWorkQueue:
    """Records every call; ``visible_after`` is each receipt's last deferral (None once resumed)."""

    def __init__(self) -> None:
        self.sent: list[ReconcileRequest] = []
        self.deferrals: list[tuple[str, float]] = []
        self.resumed: list[str] = []
        self.dead_letters: list[tuple[str, str]] = []

    def send(self, request: ReconcileRequest) -> None:
        self.sent.append(request)

    def defer(self, receipt_handle: str, seconds: float) -> None:
        self.deferrals.append((receipt_handle, seconds))

    def resume(self, receipt_handle: str) -> None:
        self.resumed.append(receipt_handle)

    def dead_letter(self, body: str, reason: str) -> None:
        self.dead_letters.append((body, reason))


class MemoryKueueStore:
    """The plan bucket's EKS side: files per (cluster, sha256), and which plan ``latest`` names."""

    def __init__(self) -> None:
        self.files: dict[tuple[str, str], dict[str, str]] = {}
        self.latest: dict[str, str] = {}
        self.puts = 0

    def put_kueue(self, cluster: str, sha256: str, files: dict[str, str]) -> str:
        self.files[(cluster, sha256)] = dict(files)
        self.latest[cluster] = sha256
        self.puts += 1
        return f"kueue/{cluster}/{sha256}/"

    def kueue_file(self, cluster: str, sha256: str, name: str) -> str:
        return self.files[(cluster, sha256)][name]


class MemoryAuditSink:
    def __init__(self) -> None:
        self.records: dict[str, AnyAuditRecord] = {}

    def publish(self, records: Sequence[AnyAuditRecord]) -> int:
        new = [record for record in records if record.audit_id not in self.records]
        self.records.update((record.audit_id, record) for record in new)
        return len(new)


class MemoryMetrics:
    def __init__(self) -> None:
        self.points: list[tuple[str, Metric, float]] = []
        self.partition_points: list[tuple[str, str, Metric, float]] = []  # (cluster, partition, metric, value)

    def emit(self, cluster: str, metric: Metric, value: float, partition: str | None = None) -> None:
        if partition is not None:
            self.partition_points.append((cluster, partition, metric, value))
            return
        self.points.append((cluster, metric, value))

    def values(self, metric: Metric) -> list[float]:
        return [value for _, emitted, value in self.points if emitted is metric]


class CountingRateLimiter:
    def __init__(self) -> None:
        self.acquired = 0

    def acquire(self) -> None:
        self.acquired += 1


class FakeChannel:
    """A head node that accepts every delivery unless ``fail_with`` is set, and answers every verify
    with ``verify_result``. References are numbered: SSM command ids, or the agent's S3 version ids."""

    def __init__(self, clock: FakeClock, kind: Channel = Channel.SSM) -> None:
        self.clock = clock
        self.kind = kind
        self.delivered: list[Bundle] = []
        self.verified = 0
        self.requests: list[str | None] = []  # each verify's request id
        self.fail_with: BaseException | None = None
        self.verify_result = ApplyResult(outcome=Outcome.IN_SYNC, applier_version="1.0.0")

    def deliver(self, bundle: Bundle) -> DeliveryHandle:
        if self.fail_with is not None:
            raise self.fail_with
        self.delivered.append(bundle)
        return DeliveryHandle(
            channel=self.kind,
            cluster=bundle.cluster_name,
            plan_sha256=bundle.plan_sha256,
            reference=self.reference(len(self.delivered)),
            target="i-0123456789abcdef0",
            sent_at=self.clock.now(),
        )

    def reference(self, number: int) -> str:
        return f"0e8d3c0e-71f7-4491-898f-{number:012x}" if self.kind is Channel.SSM else f"version-{number}"

    def verify(self, bundle: Bundle, *, request: str | None = None) -> ApplyResult:
        self.verified += 1
        self.requests.append(request)
        if isinstance(self.fail_with, TopokeeperError):
            raise self.fail_with
        return self.verify_result


class FakeFacts:
    """A HyperPod cluster of p5 nodes, four per leaf switch; ``moved`` puts a node under another leaf."""

    def __init__(self, nodes: int = 8, partition: str = "gpu") -> None:
        self.nodes = nodes
        self.partition = partition
        self.leaf_of: dict[int, int] = {index: index // 4 for index in range(nodes)}
        self.reads = 0

    def move(self, index: int, leaf: int) -> None:
        self.leaf_of[index] = leaf

    def read(self, cluster: str) -> AwsSnapshot:
        self.reads += 1
        group = f"{self.partition}-group"
        ids = [f"i-{index:017x}" for index in range(1, self.nodes + 1)]
        return AwsSnapshot.model_validate(
            {
                "describe_cluster": {
                    "ClusterName": cluster,
                    "ClusterArn": "arn:aws:sagemaker:us-east-1:111122223333:cluster/abcdefabcdef",
                    "InstanceGroups": [
                        {
                            "InstanceGroupName": group,
                            "InstanceType": "ml.p5.48xlarge",
                            "SlurmConfig": {"NodeType": "Compute", "PartitionNames": [self.partition]},
                        }
                    ],
                },
                "nodes": [
                    {
                        "InstanceGroupName": group,
                        "InstanceId": instance_id,
                        "InstanceType": "ml.p5.48xlarge",
                        "InstanceStatus": {"Status": "Running"},
                        "PrivateDnsHostname": f"ip-10-0-0-{index}",
                        "PrivatePrimaryIp": f"10.0.0.{index}",
                    }
                    for index, instance_id in enumerate(ids)
                ],
                "instance_topology": [
                    {
                        "InstanceId": instance_id,
                        "InstanceType": "p5.48xlarge",
                        "NetworkNodes": ["nn-spine", "nn-block", f"nn-leaf-{self.leaf_of[index]}"],
                    }
                    for index, instance_id in enumerate(ids)
                ],
            }
        )


def trigger(event_id: str, now: datetime) -> Trigger:
    return Trigger(source="aws.sagemaker", detail_type="test", event_id=event_id, time=now)
