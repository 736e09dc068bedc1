"""One cluster's controller wired to the in-memory ports of ``tests/fakes.py``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tests.fakes import (
    FakeChannel,
    FakeClock,
    FakeFacts,
    MemoryAuditSink,
    MemoryMetrics,
    MemoryPlanStore,
    MemoryStateStore,
    MemoryWorkQueue,
    trigger,
)
from topokeeper.contract.config import Settings
from topokeeper.contract.ports import ApplyResult, Channel, ClusterState, ReconcileRequest
from topokeeper.service.ingest import IngestDeps
from topokeeper.service.reconcile import ControllerDeps
from topokeeper.service.result import ResultDeps

CLUSTER = "c1"
HEAD_NODE = "mi-0123456789abcdef0"  # an SSM hybrid managed node: HyperPod nodes take no Run Command


@dataclass
class Controller:
    mode: str = "enforce"
    orchestrator: str = "hyperpod"
    channel_kind: Channel = Channel.SSM
    debounce_seconds: float = 0
    max_wait_seconds: float = 300
    min_write_interval_seconds: float = 0
    clock: FakeClock = field(default_factory=FakeClock)
    state: MemoryStateStore = field(default_factory=MemoryStateStore)
    plans: MemoryPlanStore = field(default_factory=MemoryPlanStore)
    queue: MemoryWorkQueue = field(default_factory=MemoryWorkQueue)
    metrics: MemoryMetrics = field(default_factory=MemoryMetrics)
    audit: MemoryAuditSink = field(default_factory=MemoryAuditSink)
    facts: FakeFacts = field(default_factory=FakeFacts)
    ssm_results: dict[str, ApplyResult] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.channel = FakeChannel(self.clock, self.channel_kind)
        self.settings = Settings.model_validate(
            {
                "clusters": [
                    {
                        "name": CLUSTER,
                        "orchestrator": self.orchestrator,
                        "head_node": HEAD_NODE,
                        "mode": self.mode,
                        "channel": self.channel_kind.value,
                    }
                ],
                "debounce_seconds": self.debounce_seconds,
                "max_wait_seconds": self.max_wait_seconds,
                "min_write_interval_seconds": self.min_write_interval_seconds,
            }
        )

    @property
    def cluster(self) -> Any:
        return self.settings.clusters[0]

    def deps(self) -> ControllerDeps:
        return ControllerDeps(
            settings=self.settings,
            state=self.state,
            plans=self.plans,
            queue=self.queue,
            metrics=self.metrics,
            clock=self.clock,
            facts=lambda cluster: self.facts,
            channel=lambda cluster: self.channel,
        )

    def result_deps(self) -> ResultDeps:
        return ResultDeps(
            settings=self.settings,
            state=self.state,
            plans=self.plans,
            audit=self.audit,
            queue=self.queue,
            metrics=self.metrics,
            clock=self.clock,
            ssm_result=lambda cluster, command_id: self.ssm_results[command_id],
        )

    def ingest_deps(self, tags: dict[str, str] | None = None) -> IngestDeps:
        return IngestDeps(
            settings=self.settings,
            state=self.state,
            queue=self.queue,
            metrics=self.metrics,
            clock=self.clock,
            cluster_name_of_arn=lambda arn: CLUSTER if arn.endswith("/abcdefabcdef") else None,
            instance_tags=lambda instance_id: tags or {},
        )

    def change(self, event_id: str = "e-1") -> ReconcileRequest:
        """A change event as ingest records it; the request it would queue."""
        state = self.state.record_change(CLUSTER, trigger(event_id, self.clock.now()), self.clock.now())
        return ReconcileRequest(cluster=CLUSTER, generation=state.generation, since=state.reconciled_generation)

    def now_state(self) -> ClusterState:
        return self.state.get(CLUSTER)
