"""Ingest: any event -> "cluster X changed" -> generation bump -> one FIFO message for that cluster.

Level-triggered: the event's content is never trusted for the topology, only for *which* cluster to
look at. Redelivered events (same id) are dropped; events for clusters we do not manage are ignored.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ValidationError

from topokeeper.config import Orchestrator, Settings
from topokeeper.errors import InputError
from topokeeper.events import (
    CLOUDTRAIL_DETAIL_TYPE,
    EC2_STATE_DETAIL_TYPE,
    HYPERPOD_DETAIL_TYPES,
    CloudTrailDetail,
    ClusterEventDetail,
    ClusterStateDetail,
    Ec2StateDetail,
    NodeHealthDetail,
    TopokeeperEvent,
)
from topokeeper.ports import Clock, ClusterState, Metric, Metrics, ReconcileRequest, StateStore, Trigger, WorkQueue


@dataclass
class IngestDeps:
    settings: Settings
    state: StateStore
    queue: WorkQueue
    metrics: Metrics
    clock: Clock
    cluster_name_of_arn: Callable[[str], str | None]  # DescribeCluster: CloudTrail may carry an ARN
    instance_tags: Callable[[str], dict[str, str]]  # EC2 state-change events carry only an instance id


class IngestResult(BaseModel):
    status: Literal["queued", "duplicate", "ignored"]
    cluster: str | None = None
    generation: int | None = None
    reason: str = ""


def _detail(model: type[BaseModel], event: TopokeeperEvent) -> Any:
    try:
        return model.model_validate(event.detail)
    except ValidationError as error:
        raise InputError.from_validation(error, prefix="detail") from error


def cluster_reference(event: TopokeeperEvent, deps: IngestDeps) -> tuple[str | None, str]:
    """The cluster name (or ARN) the event is about, and a short summary for the audit trail."""
    detail_type = event.detail_type
    if event.source == "aws.sagemaker" and detail_type == HYPERPOD_DETAIL_TYPES[0]:
        state = _detail(ClusterStateDetail, event)
        return state.ClusterName, f"cluster {state.ClusterStatus or 'changed'}"
    if event.source == "aws.sagemaker" and detail_type == HYPERPOD_DETAIL_TYPES[1]:
        health = _detail(NodeHealthDetail, event)
        return health.ClusterName, f"node {health.InstanceId} health"
    if event.source == "aws.sagemaker" and detail_type == HYPERPOD_DETAIL_TYPES[2]:
        details = _detail(ClusterEventDetail, event).EventDetails
        return details.ClusterName, (details.Description or details.ResourceType or "cluster event")[:200]
    if event.source == "aws.sagemaker" and detail_type == CLOUDTRAIL_DETAIL_TYPE:
        call = _detail(CloudTrailDetail, event)
        name = (call.requestParameters or {}).get("clusterName")
        if not isinstance(name, str) or not name:
            raise InputError("detail.requestParameters.clusterName", "missing from the CloudTrail event")
        if name.startswith("arn:") and deps.settings.cluster(name) is None:
            name = deps.cluster_name_of_arn(name) or name
        return name, f"{call.eventName} API call"
    if event.source == "aws.ec2" and detail_type == EC2_STATE_DETAIL_TYPE:
        state_change = _detail(Ec2StateDetail, event)
        tags = deps.instance_tags(state_change.instance_id)
        for cluster in deps.settings.clusters:
            if cluster.orchestrator is Orchestrator.EC2 and tags.get(cluster.ec2.cluster_tag) == cluster.name:
                return cluster.name, f"instance {state_change.instance_id} {state_change.state}"
        return None, f"instance {state_change.instance_id} is not tagged as a managed cluster's"
    return None, f"not a change event: {event.source} / {detail_type}"


def ingest(event: TopokeeperEvent, deps: IngestDeps) -> IngestResult:
    reference, summary = cluster_reference(event, deps)
    cluster = deps.settings.cluster(reference) if reference else None
    if cluster is None:
        return IngestResult(status="ignored", reason=summary if reference is None else f"unmanaged cluster {reference}")
    now = deps.clock.now()
    if deps.state.seen(event.id):
        deps.metrics.emit(cluster.name, Metric.EVENTS_COALESCED, 1)
        state = deps.state.get(cluster.name)
        if state.has_unreconciled_changes:
            _queue(deps, state)  # the first delivery may have died before queueing; SQS deduplicates
        return IngestResult(status="duplicate", cluster=cluster.name, reason=f"event {event.id} seen before")
    trigger = Trigger(
        source=event.source, detail_type=event.detail_type, event_id=event.id, time=event.time, summary=summary
    )
    state = deps.state.record_change(cluster.name, trigger, now)
    _queue(deps, state)
    # Marked last: a delivery that dies before this is retried whole, so no change is ever lost.
    deps.state.mark_seen(event.id, now)
    return IngestResult(status="queued", cluster=cluster.name, generation=state.generation, reason=summary)


def _queue(deps: IngestDeps, state: ClusterState) -> None:
    deps.queue.send(
        ReconcileRequest(cluster=state.cluster, generation=state.generation, since=state.reconciled_generation)
    )
