"""The simulated world's EKS side: no head node, and what a step shows instead (the Kueue objects topokeeper
published to the plan bucket, the labels table, ``NodesWithoutTopologyData``, the ``UpdateKueueTopology`` records).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from topokeeper.contract.ports import KueueAuditRecord, Metric
from topokeeper.engine.snapshot import eks_nodes
from topokeeper.kueue.fleet import render_mermaid
from topokeeper.kueue.objects import TOPOLOGY_FILE
from topokeeper.kueue.publication import KueuePublication, publish_kueue
from topokeeper.render.bundle import Bundle
from topokeeper.sim.head_node import HeadNode

if TYPE_CHECKING:
    from topokeeper.sim.world import World

KUEUE_EVENT = KueueAuditRecord.model_fields["event_name"].default


class NoHeadNode(HeadNode):
    """An EKS cluster has no Slurm head node: nothing runs, nothing is verified there."""

    description = "none: an EKS cluster (Kueue objects and node labels go to the plan bucket)"

    def __init__(self) -> None:
        self.partitions: dict[str, list[str]] = {}

    def start(self, partitions: Mapping[str, Iterable[str]]) -> None:
        pass

    def stop(self) -> None:
        pass

    def sync_nodes(self, partitions: Mapping[str, Iterable[str]]) -> None:
        pass

    def install_agent(self, config: Mapping[str, object]) -> str:
        raise RuntimeError("an EKS cluster has no head node for an agent")

    def run_agent_once(self, config_path: str, environment: Mapping[str, str]) -> tuple[int, str]:
        raise RuntimeError("an EKS cluster has no head node for an agent")

    def verify(self, bundle: Bundle) -> dict[str, object]:
        raise RuntimeError("an EKS cluster has no head node to verify")

    def live_topology(self) -> dict[str, str]:
        return {}


class KueueStep(BaseModel):
    """What an EKS step ends with."""

    published_sha256: str | None  # what the plan bucket's ``latest`` names
    objects: list[str]  # the published Kueue objects, ``Kind/name``
    nodes_without_topology_data: int  # the highest the metric reached during the step
    alarm: str  # the NodesWithoutTopologyData alarm's state when the step ended
    alarm_raised: bool
    audit_records: list[dict[str, Any]]  # UpdateKueueTopology records of the step
    topology_yaml: str  # the published Topologies and ResourceFlavors
    labels_table: str


def current(world: World) -> KueuePublication:
    """What the facts say now (as the reconcile computes it)."""
    return publish_kueue(eks_nodes(world.runtime.facts(world.cluster).read(world.cluster.name)))


def step_view(world: World, started: float, completed_after: Any) -> tuple[str, int, bool, KueueStep]:
    """(desired sha256, node count, converged, the step's Kueue view); ``completed_after`` filters records."""
    cluster = world.cluster.name
    desired = current(world)
    state = world.runtime.state.get(cluster)
    records = [
        r for r in world.runtime.audit.history(cluster, 1000, event_name=KUEUE_EVENT) if completed_after(r, started)
    ]
    published = state.applied_sha256
    files = world.runtime.plans
    topology = files.kueue_file(cluster, published, TOPOLOGY_FILE) if published else ""
    labels = files.kueue_file(cluster, published, "labels.txt") if published else ""
    peak = world.metrics.peak(cluster, Metric.NODES_WITHOUT_TOPOLOGY_DATA, started)
    view = KueueStep(
        published_sha256=published,
        objects=sorted(desired.summary["objects"]),
        nodes_without_topology_data=int(peak or 0),
        alarm=world.metrics.state(cluster, Metric.NODES_WITHOUT_TOPOLOGY_DATA).value,
        alarm_raised=world.metrics.alarmed_since(started, Metric.NODES_WITHOUT_TOPOLOGY_DATA),
        audit_records=sorted(records, key=lambda r: r["completed_at"]),
        topology_yaml=topology,
        labels_table=labels,
    )
    return desired.sha256, desired.plan.fleet.node_count, published == desired.sha256, view


def final_view(world: World) -> tuple[dict[str, Any], dict[str, str]]:
    """The result's ``desired`` (the summary with its sha256) and the layer map for the report."""
    publication = current(world)
    layers = render_mermaid(publication.plan.fleet)
    return {"sha256": publication.sha256, **publication.summary}, {"network layers": layers}
