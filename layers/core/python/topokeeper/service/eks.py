"""The reconcile and drift check of an EKS-orchestrated HyperPod cluster: Kueue objects, not a head node.

The same trigger path as a Slurm cluster (ingest, the FIFO queue, debounce, the drift schedule); what differs is
the output: the Kueue Topologies and ResourceFlavors, the node labels map and the layer tables, computed from the
same facts (``eks_nodes``) the CLI uses, written to the plan bucket only when their content hash changes, with one
``UpdateKueueTopology`` audit record per change. Nothing is written to the cluster: there is no channel, so
``mode`` does not apply. ``NodesWithoutTopologyData`` counts the nodes Kueue cannot place topology-aware.
"""

from __future__ import annotations

import hashlib
import json
import time
from datetime import datetime
from typing import Any

from topokeeper.contract.config import ClusterConfig
from topokeeper.contract.errors import Permanent
from topokeeper.contract.ports import (
    AuditSink,
    ClusterState,
    KueueAuditRecord,
    KueueStore,
    Metric,
    ReconcileRequest,
    Trigger,
)
from topokeeper.engine.snapshot import eks_nodes
from topokeeper.kueue.publication import SUMMARY_FILE, KueuePublication, publish_kueue
from topokeeper.service.drift import DriftReport
from topokeeper.service.reconcile import (
    ControllerDeps,
    ReconcileReport,
    Verdict,
    close_cycle,
    count_coalesced,
    deferred_report,
    early_but_incomplete,
    topology_retries,
)
from topokeeper.service.state import request_reconcile, save_fields

MAX_LISTED = 200  # like the partition records: lists are cut, counts stay exact
EKS_DRIFT_CHECK = "Kueue Drift Check"


def publication_for(cluster: ClusterConfig, deps: ControllerDeps) -> tuple[KueuePublication, str | None, int]:
    """The cluster's Kueue files from the facts now, its ARN, and how many instances discovery did not reach
    in this invocation; emits ``NodesWithoutTopologyData``."""
    raw = deps.facts(cluster).read(cluster.name)
    publication = publish_kueue(eks_nodes(raw))
    deps.metrics.emit(cluster.name, Metric.NODES_WITHOUT_TOPOLOGY_DATA, len(publication.nodes_without_topology_data))
    return publication, raw.describe_cluster.ClusterArn or cluster.arn, raw.undescribed


def _ports(deps: ControllerDeps) -> tuple[KueueStore, AuditSink]:
    if deps.kueue is None or deps.audit is None:
        raise Permanent("an EKS cluster needs the Kueue store and the audit trail wired into the controller")
    return deps.kueue, deps.audit


def reconcile_eks(
    cluster: ClusterConfig, state: ClusterState, request: ReconcileRequest, deps: ControllerDeps, verdict: Verdict
) -> ReconcileReport:
    """Called by ``reconcile`` once it decided to proceed (``verdict``)."""
    started = time.monotonic()
    now = deps.clock.now()
    publication, arn, undescribed = publication_for(cluster, deps)
    missing = len(publication.nodes_without_topology_data)
    if (incomplete := early_but_incomplete(verdict, missing, deps.clock.now() - now)) is not None:
        return deferred_report(cluster.name, request, incomplete)  # as for Slurm: an early write places every node
    count_coalesced(deps, cluster.name, state)
    action = "unchanged"
    if publication.sha256 != state.desired_sha256:
        store, audit = _ports(deps)
        previous = (
            json.loads(store.kueue_file(cluster.name, state.desired_sha256, SUMMARY_FILE))
            if state.desired_sha256
            else None
        )
        # Files, then the record, then the state: a retry after a crash writes the same bytes and the same
        # audit id (it depends on the two hashes only), so the change is audited once.
        location = store.put_kueue(cluster.name, publication.sha256, publication.files)
        record = kueue_record(
            cluster=cluster.name,
            arn=arn,
            publication=publication,
            previous=previous,
            location=location,
            state=state,
            now=now,
        )
        audit.publish([record])
        action = "published"
    save_fields(
        deps.state,
        cluster.name,
        {
            "reconciled_generation": state.generation,
            "desired_sha256": publication.sha256,
            "applied_sha256": publication.sha256,  # published is applied: nothing else receives it
            "topology_retries": topology_retries(state, missing, undescribed),
            **({"last_write_at": now} if action == "published" else {}),
        },
    )
    close_cycle(deps, cluster.name, state, now=now, missing=missing, started=started, undescribed=undescribed)
    return ReconcileReport(
        cluster=cluster.name,
        generation=request.generation,
        action=action,
        plan_sha256=publication.sha256,
        nodes_without_topology=missing,
        undescribed=undescribed,
    )


def kueue_record(
    *,
    cluster: str,
    arn: str | None,
    publication: KueuePublication,
    previous: dict[str, Any] | None,
    location: str,
    state: ClusterState,
    now: datetime,
) -> KueueAuditRecord:
    summary = publication.summary
    before_objects: dict[str, str] = (previous or {}).get("objects", {})
    objects: dict[str, str] = summary["objects"]
    changed = sorted(k for k in set(objects) | set(before_objects) if objects.get(k) != before_objects.get(k))
    before_nodes: dict[str, str] = (previous or {}).get("node_labels", {})
    nodes: dict[str, str] = summary["node_labels"]
    added, removed = sorted(set(nodes) - set(before_nodes)), sorted(set(before_nodes) - set(nodes))
    relabeled = sorted(n for n in set(nodes) & set(before_nodes) if nodes[n] != before_nodes[n])
    without = list(publication.nodes_without_topology_data)
    previous_sha = (previous or {}).get("plan_sha256")
    audit_id = hashlib.sha256(json.dumps([cluster, previous_sha, publication.sha256]).encode()).hexdigest()[:32]
    triggers: list[Trigger] = state.triggers
    return KueueAuditRecord(
        audit_id=audit_id,
        cluster_name=cluster,
        cluster_arn=arn,
        plan_sha256=publication.sha256,
        previous_plan_sha256=previous_sha,
        location=location,
        objects=sorted(objects),
        objects_changed=changed,
        nodes_added=added[:MAX_LISTED],
        nodes_removed=removed[:MAX_LISTED],
        nodes_relabeled=relabeled[:MAX_LISTED],
        nodes_added_count=len(added),
        nodes_removed_count=len(removed),
        nodes_relabeled_count=len(relabeled),
        node_count=len(nodes),
        nodes_without_topology_data=without[:MAX_LISTED],
        nodes_without_topology_data_count=len(without),
        warnings=list(publication.plan.warnings)[:20],
        triggers=triggers,
        trigger_count=state.trigger_count,
        generation=state.generation,
        completed_at=now,
    )


def check_eks_drift(cluster: ClusterConfig, deps: ControllerDeps, requested_by: list[Trigger]) -> DriftReport:
    """No live side to verify: only whether AWS changed since the last publication (a lost event)."""
    now = deps.clock.now()
    state = deps.state.get(cluster.name)
    publication, _, _ = publication_for(cluster, deps)
    changed = publication.sha256 != state.desired_sha256
    if changed:
        request_reconcile(
            deps.state,
            deps.queue,
            cluster.name,
            now,
            reason="drift",
            detail_type=EKS_DRIFT_CHECK,
            summary="the Kueue objects or node labels differ from the published ones",
        )
    return DriftReport(
        cluster=cluster.name,
        live="not-applicable",
        aws="changed" if changed else "current",
        drift=1 if changed else 0,
        action="reconcile-requested" if changed else "none",
        requested_by=requested_by,
    )
