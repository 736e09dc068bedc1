"""Ingest: any event -> "cluster X changed" -> generation bump -> one FIFO message for that cluster.

Level-triggered: the event's content is never trusted for the topology, only for *which* cluster to
look at. Redelivered events (same id) are dropped; events for clusters we do not manage are ignored.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationError

from topokeeper.contract.config import Orchestrator, Settings
from topokeeper.contract.constants import (
    CLOUDTRAIL_DETAIL_TYPE,
    CLOUDTRAIL_DETAIL_TYPES,
    HYPERPOD_SOURCE,
    MANAGED_TOPOLOGY_EVENT,
    MANAGED_TOPOLOGY_SUMMARY,
)
from topokeeper.contract.errors import InputError
from topokeeper.contract.event_schemas import (
    EC2_STATE_DETAIL_TYPE,
    HYPERPOD_DETAIL_TYPES,
    MOVE_CLUSTER_NODES,
    CloudTrailDetail,
    ClusterEventDetail,
    ClusterStateDetail,
    Ec2StateDetail,
    NodeHealthDetail,
    TopokeeperEvent,
)
from topokeeper.contract.ports import (
    Clock,
    ClusterState,
    Metric,
    Metrics,
    ReconcileRequest,
    StateStore,
    Trigger,
    WorkQueue,
)
from topokeeper.domain.models import empty_list


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
    clusters: list[str] = Field(default_factory=empty_list)  # every cluster changed (MoveClusterNodes: two)
    generation: int | None = None
    reason: str = ""


def _detail(model: type[BaseModel], event: TopokeeperEvent) -> Any:
    try:
        return model.model_validate(event.detail)
    except ValidationError as error:
        raise InputError.from_validation(error, prefix="detail") from error


def _is_managed_topology_event(event: TopokeeperEvent) -> bool:
    """HyperPod's own CloudTrail record of a topology change it made."""
    return (
        event.source == HYPERPOD_SOURCE
        and event.detail_type in CLOUDTRAIL_DETAIL_TYPES
        and event.detail.get("eventName") == MANAGED_TOPOLOGY_EVENT
    )


def _managed_update_cluster(event: TopokeeperEvent, deps: IngestDeps) -> tuple[str, str]:
    """Where the record names its cluster is not known yet (no live sample): the API call's parameters, a
    service event's details, else the envelope's resources."""
    call = _detail(CloudTrailDetail, event)
    names = [
        name
        for where in (call.requestParameters, call.serviceEventDetails)
        for key in ("clusterName", "clusterArn")
        if isinstance(name := (where or {}).get(key), str) and name
    ] + [arn for arn in event.resources if ":cluster/" in arn]
    if not names:
        raise InputError(
            "detail.requestParameters.clusterName", "missing from the CloudTrail event (and no cluster elsewhere)"
        )
    return _cluster_name(names[0], deps), f"{MANAGED_TOPOLOGY_SUMMARY}, CloudTrail event {call.eventID or 'not given'}"


def cluster_reference(event: TopokeeperEvent, deps: IngestDeps) -> tuple[str | None, str]:
    """The cluster name (or ARN) the event is about, and a short summary for the audit trail."""
    detail_type = event.detail_type
    if _is_managed_topology_event(event):
        return _managed_update_cluster(event, deps)
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
        key = "sourceClusterArn" if call.eventName == MOVE_CLUSTER_NODES else "clusterName"
        return _cloudtrail_cluster(call, key, deps), f"{call.eventName} API call"
    if event.source == "aws.ec2" and detail_type == EC2_STATE_DETAIL_TYPE:
        state_change = _detail(Ec2StateDetail, event)
        ec2_clusters = [c for c in deps.settings.clusters if c.orchestrator is Orchestrator.EC2]
        # Every instance of the account changes state; ask EC2 only when some cluster is found by tags. An
        # instance DescribeInstances does not know yet (pending) has no tags: its "running" event comes later.
        tags = deps.instance_tags(state_change.instance_id) if ec2_clusters else {}
        for cluster in ec2_clusters:
            # A login node (login endpoint) may carry only the login tag.
            if cluster.name in (tags.get(cluster.ec2.cluster_tag), tags.get(cluster.ec2.login_tag)):
                return cluster.name, f"instance {state_change.instance_id} {state_change.state}"
        return None, f"instance {state_change.instance_id} belongs to no configured cluster (or is not known yet)"
    return None, f"not a change event: {event.source} / {detail_type}"


def _cloudtrail_cluster(call: CloudTrailDetail, key: str, deps: IngestDeps) -> str:
    name = (call.requestParameters or {}).get(key)
    if not isinstance(name, str) or not name:
        raise InputError(f"detail.requestParameters.{key}", "missing from the CloudTrail event")
    return _cluster_name(name, deps)


def _cluster_name(name: str, deps: IngestDeps) -> str:
    """A cluster name, or the name of the cluster an ARN names (CloudTrail may carry either)."""
    if name.startswith("arn:") and deps.settings.cluster(name) is None:
        name = deps.cluster_name_of_arn(name) or name
    return name


def cluster_references(event: TopokeeperEvent, deps: IngestDeps) -> tuple[list[str], str]:
    """Every cluster the event is about (MoveClusterNodes changes its source and its target cluster)."""
    if event.source == "aws.sagemaker" and event.detail_type == CLOUDTRAIL_DETAIL_TYPE:
        call = _detail(CloudTrailDetail, event)
        if call.eventName == MOVE_CLUSTER_NODES:
            names = {_cloudtrail_cluster(call, key, deps) for key in ("sourceClusterArn", "targetClusterArn")}
            return sorted(names), f"{call.eventName} API call"
    reference, summary = cluster_reference(event, deps)
    return ([reference] if reference else []), summary


def ingest(event: TopokeeperEvent, deps: IngestDeps) -> IngestResult:
    references, summary = cluster_references(event, deps)
    clusters = [cluster for reference in references if (cluster := deps.settings.cluster(reference)) is not None]
    if not clusters:
        return IngestResult(
            status="ignored", reason=f"unmanaged cluster {', '.join(references)}" if references else summary
        )
    names = [cluster.name for cluster in clusters]
    now = deps.clock.now()
    if deps.state.seen(event.id):
        for name in names:
            deps.metrics.emit(name, Metric.EVENTS_COALESCED, 1)
            state = deps.state.get(name)
            if state.has_unreconciled_changes:
                _queue(deps, state)  # the first delivery may have died before queueing; SQS deduplicates
        return IngestResult(
            status="duplicate", cluster=names[0], clusters=names, reason=f"event {event.id} seen before"
        )
    trigger = Trigger(
        source=event.source, detail_type=event.detail_type, event_id=event.id, time=event.time, summary=summary
    )
    states = [deps.state.record_change(name, trigger, now) for name in names]
    if _is_managed_topology_event(event):
        for name in names:
            deps.metrics.emit(name, Metric.MANAGED_TOPOLOGY_UPDATES, 1)
    for state in states:
        _queue(deps, state)
    # Marked last: a delivery that dies before this is retried whole, so no change is ever lost.
    deps.state.mark_seen(event.id, now)
    return IngestResult(
        status="queued", cluster=names[0], clusters=names, generation=states[0].generation, reason=summary
    )


def _queue(deps: IngestDeps, state: ClusterState) -> None:
    deps.queue.send(
        ReconcileRequest(cluster=state.cluster, generation=state.generation, since=state.reconciled_generation)
    )
