"""The ports between the pure core and the outside world. Adapters implement them with boto3;
the simulator and tests implement them in memory."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field

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
    ROLLED_BACK = "rolled_back"  # slurmctld rejected it; the previous config is restored and live
    FAILED = "failed"  # the applier could not finish (error says why)
    # Channel outcomes, when the applier's own document never arrived:
    PENDING = "pending"
    TIMED_OUT = "timed_out"
    CANCELLED = "cancelled"
    UNDELIVERABLE = "undeliverable"


class Channel(StrEnum):
    SSM = "ssm"
    AGENT = "agent"


class ApplyResult(BaseModel):
    """The applier's JSON document (printed on stdout), or the channel's account of why there is none."""

    model_config = ConfigDict(extra="allow")

    outcome: Outcome
    mode: Literal["apply", "dry-run", "verify"] = "apply"
    plan_sha256: str | None = None
    before_sha256: str | None = None
    after_sha256: str | None = None
    partitions_changed: list[str] = Field(default_factory=list)
    reconfigured: bool = False
    error: str | None = None
    drift: list[dict[str, Any]] = Field(default_factory=list)


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

    def verify(self, bundle: Bundle) -> ApplyResult: ...


class FactsSource(Protocol):
    def read(self, cluster: str) -> AwsSnapshot: ...


class Clock(Protocol):
    def now(self) -> datetime: ...


METRICS_NAMESPACE = "topokeeper"
METRICS_DIMENSION = "cluster"


class Metric(StrEnum):
    """CloudWatch metrics (namespace ``topokeeper``, dimension ``cluster``); the stack alarms on them."""

    TOPOLOGY_UPDATES = "TopologyUpdates"  # partitions whose topology changed on the head node
    TOPOLOGY_DRIFT = "TopologyDrift"  # 1 when live or AWS differs from the desired plan, else 0
    NODES_WITHOUT_TOPOLOGY = "NodesWithoutTopology"
    APPLY_FAILURES = "ApplyFailures"
    RECONCILE_SECONDS = "ReconcileSeconds"
    EVENTS_COALESCED = "EventsCoalesced"  # changes that did not need a reconcile of their own
    LOGIN_TARGETS_HEALTHY = "LoginTargetsHealthy"  # running login nodes the balancer finds healthy
    LOGIN_TARGETS_DRIFT = "LoginTargetsDrift"  # targets one login sync had to register or deregister


class Metrics(Protocol):
    def emit(self, cluster: str, metric: Metric, value: float) -> None: ...
