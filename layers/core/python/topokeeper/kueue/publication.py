"""What the deployed backend publishes for an EKS cluster: the Kueue objects, the node labels map and the
layer tables, as files with one content hash, and the summary the next change is compared with.

Pure, like the rest of ``topokeeper.kueue``: the same canonical Node facts the CLI reads (``eks_nodes``).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from topokeeper.domain.catalog import Capability, lookup
from topokeeper.domain.models import Node
from topokeeper.kueue.fleet import fleet_json, render_mermaid, render_table
from topokeeper.kueue.node_list import topology_labels
from topokeeper.kueue.objects import KueuePlan, flavor_object, plan_kueue, render_kueue, topology_object

SUMMARY_FILE = "kueue.json"
LABELS_FILE = "labels.json"
DEFAULT_QUEUE = "user-queue"


def nodes_without_topology_data(plan: KueuePlan) -> tuple[str, ...]:
    """Nodes Kueue cannot place topology-aware: fewer layers than their flavor's Topology needs, or none at all
    although their type reports layers (not reported yet, partial capacity-reservation topology, unowned)."""
    without = set(plan.nodes_without_topology_data)
    for flavor in plan.flavors:
        if lookup(flavor.instance_type).capability is Capability.NONE:
            continue
        without.update(node.name for node in flavor.nodes if not node.network_nodes)
    return tuple(sorted(without))


@dataclass(frozen=True)
class KueuePublication:
    plan: KueuePlan
    files: dict[str, str]  # name -> content, ``SUMMARY_FILE`` included
    sha256: str
    nodes_without_topology_data: tuple[str, ...]

    @property
    def summary(self) -> dict[str, Any]:
        document: dict[str, Any] = json.loads(self.files[SUMMARY_FILE])
        return document


def _objects(plan: KueuePlan) -> dict[str, str]:
    """``Kind/name`` -> the object's content hash."""
    documents = [topology_object(t) for t in plan.topologies] + [flavor_object(f) for f in plan.flavors]
    return {
        f"{document['kind']}/{document['metadata']['name']}": hashlib.sha256(
            json.dumps(document, sort_keys=True).encode()
        ).hexdigest()
        for document in documents
    }


def publish_kueue(nodes: Iterable[Node], queue: str = DEFAULT_QUEUE) -> KueuePublication:
    """Same facts in, same bytes out."""
    node_list = tuple(nodes)
    plan = plan_kueue(node_list)
    without = nodes_without_topology_data(plan)
    files = render_kueue(plan, queue)
    files["layers.mmd"] = render_mermaid(plan.fleet)
    files["labels.txt"] = render_table(plan.fleet)
    node_labels = {
        node.name: {
            "instance_id": node.instance_id,
            "instance_type": node.instance_type,
            "labels": topology_labels(node),
        }
        for node in sorted(node_list, key=lambda n: n.name)
        if node.instance_type is not None
    }
    files[LABELS_FILE] = json.dumps({"nodes": node_labels, "fleet": fleet_json(plan.fleet)}, indent=1, sort_keys=True)
    sha256 = hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest()
    summary = {
        "plan_sha256": sha256,
        "objects": _objects(plan),
        "node_labels": {
            name: hashlib.sha256(json.dumps(entry["labels"], sort_keys=True).encode()).hexdigest()[:16]
            for name, entry in node_labels.items()
        },
        "nodes_without_topology_data": list(without),
        "warnings": list(plan.warnings),
    }
    files[SUMMARY_FILE] = json.dumps(summary, indent=1, sort_keys=True)
    return KueuePublication(plan, files, sha256, without)
