"""Kueue objects for the fleet: one Topology per layer depth (plus one for UltraServers), a ResourceFlavor per
instance type, example jobs with required and with preferred topology, and a summary of what to apply.

Kueue needs every level label on every node of a flavor ("no topology domains at level"), so 3-layer
types (p5) and 4-layer types (p6-b200) never share a Topology. Objects are ``kueue.x-k8s.io/v1beta2``
as served by Kueue v0.19.2 (v1beta1 is deprecated there).
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from topokeeper.domain.catalog import Capability, lookup
from topokeeper.domain.models import Node
from topokeeper.kueue import KUEUE_VERSION
from topokeeper.kueue.fleet import FleetLayers, fleet_layers
from topokeeper.kueue.node_list import (
    HOSTNAME_LABEL,
    INSTANCE_TYPE_LABEL,
    ULTRASERVER_LABEL,
    instance_type_label,
    layer_label,
    topology_labels,
)

KUEUE_API = "kueue.x-k8s.io/v1beta2"
ULTRASERVER_TOPOLOGY = "aws-ultraserver"
REQUIRED_TOPOLOGY_ANNOTATION = "kueue.x-k8s.io/podset-required-topology"
PREFERRED_TOPOLOGY_ANNOTATION = "kueue.x-k8s.io/podset-preferred-topology"
QUEUE_NAME_LABEL = "kueue.x-k8s.io/queue-name"
EXAMPLE_IMAGE = "public.ecr.aws/docker/library/busybox:1.37"


def network_topology_name(depth: int) -> str:
    return f"aws-{depth}-layer-network"


@dataclass(frozen=True)
class TopologyPlan:
    name: str
    levels: tuple[str, ...]


@dataclass(frozen=True)
class FlavorPlan:
    name: str
    instance_type: str
    instance_type_label: str
    topology: str | None  # None: the type reports no layers; no topology-aware scheduling for it
    nodes: tuple[Node, ...]


@dataclass(frozen=True)
class KueuePlan:
    topologies: tuple[TopologyPlan, ...]
    flavors: tuple[FlavorPlan, ...]
    fleet: FleetLayers
    warnings: tuple[str, ...]

    def topology(self, name: str) -> TopologyPlan:
        return next(topology for topology in self.topologies if topology.name == name)

    def required_levels(self, instance_type: str) -> tuple[str, ...]:
        """The level labels (hostname aside) every node of this type must carry for its flavor's Topology."""
        for flavor in self.flavors:
            if flavor.instance_type == instance_type and flavor.topology:
                return tuple(level for level in self.topology(flavor.topology).levels if level != HOSTNAME_LABEL)
        return ()

    @property
    def nodes_without_topology_data(self) -> tuple[str, ...]:
        """Nodes whose facts lack a level their flavor's Topology needs (new instances not yet reported, partial
        capacity-reservation topology, instances the account cannot describe): Kueue cannot place pods on them."""
        short: list[str] = []
        for flavor in self.flavors:
            required = self.required_levels(flavor.instance_type)
            short += [node.name for node in flavor.nodes if not set(required) <= set(topology_labels(node))]
        return tuple(sorted(short))


def flavor_name(label_value: str) -> str:
    return label_value.replace(".", "-").lower()


def plan_kueue(nodes: Iterable[Node], type_labels: Mapping[str, str] | None = None) -> KueuePlan:
    """Group the nodes by instance type and give each type the Topology its layer depth needs."""
    by_type: dict[str, list[Node]] = defaultdict(list)
    all_nodes: list[Node] = []
    for node in nodes:
        # Kubernetes nodes always come with an instance type; a Slurm node with no instance has no labels.
        if node.instance_type is None:
            continue
        by_type[node.instance_type].append(node)
        all_nodes.append(node)
    fleet = fleet_layers(all_nodes)
    warnings: list[str] = []
    topologies: dict[str, TopologyPlan] = {}
    flavors: list[FlavorPlan] = []
    ultraserver_nodes = [
        node for instance_type, typed in by_type.items() if _is_ultraserver(instance_type, typed) for node in typed
    ]
    for instance_type, typed in sorted(by_type.items()):
        depth = max(len(node.network_nodes) for node in typed)
        catalog = lookup(instance_type)
        if depth and catalog.network_layers and depth != catalog.network_layers:
            warnings.append(
                f"{instance_type}: nodes report {depth} layers; the EC2 documentation says {catalog.network_layers}"
            )
        if _is_ultraserver(instance_type, typed):
            topology = _ultraserver_topology(ultraserver_nodes)
        elif depth:
            levels = (*(layer_label(layer) for layer in range(1, depth + 1)), HOSTNAME_LABEL)
            topology = TopologyPlan(network_topology_name(depth), levels)
        else:
            topology = None
            warnings.append(
                f"{instance_type}: no node reports network layers; its flavor gets no Topology "
                "(not a topology-capable type, or DescribeInstanceTopology cannot see these instances yet)"
            )
        if topology is not None:
            topologies[topology.name] = topology
        label = (type_labels or {}).get(instance_type) or instance_type_label(typed[0])
        flavors.append(
            FlavorPlan(
                flavor_name(label),
                instance_type,
                label,
                topology.name if topology else None,
                tuple(sorted(typed, key=lambda node: node.name)),
            )
        )
    return KueuePlan(tuple(sorted(topologies.values(), key=lambda t: t.name)), tuple(flavors), fleet, tuple(warnings))


def _is_ultraserver(instance_type: str, nodes: list[Node]) -> bool:
    return lookup(instance_type).capability is Capability.ULTRASERVER or any(node.ultraserver_id for node in nodes)


def _ultraserver_topology(nodes: list[Node]) -> TopologyPlan:
    """Under layer 3 when every UltraServer sits inside one layer-3 domain; else the UltraServer is the top level."""
    fleet = fleet_layers(nodes)
    nested = fleet.ultraservers_inside_one_layer3_domain and all(len(node.network_nodes) >= 3 for node in nodes)
    network = tuple(layer_label(layer) for layer in (1, 2, 3)) if nested else ()
    return TopologyPlan(ULTRASERVER_TOPOLOGY, (*network, ULTRASERVER_LABEL, HOSTNAME_LABEL))


def topology_object(topology: TopologyPlan) -> dict[str, Any]:
    return {
        "apiVersion": KUEUE_API,
        "kind": "Topology",
        "metadata": {"name": topology.name},
        "spec": {"levels": [{"nodeLabel": level} for level in topology.levels]},
    }


def flavor_object(flavor: FlavorPlan) -> dict[str, Any]:
    spec: dict[str, Any] = {"nodeLabels": {INSTANCE_TYPE_LABEL: flavor.instance_type_label}}
    if flavor.topology:
        spec["topologyName"] = flavor.topology
    return {"apiVersion": KUEUE_API, "kind": "ResourceFlavor", "metadata": {"name": flavor.name}, "spec": spec}


def _placement_levels(plan: KueuePlan, flavor: FlavorPlan) -> tuple[str, str]:
    """(finest shared level, the level above it): where a required job packs, and where a preferred one spreads."""
    levels = [level for level in plan.topology(flavor.topology or "").levels if level != HOSTNAME_LABEL]
    return levels[-1], levels[-2] if len(levels) > 1 else levels[-1]


def _largest_domain(flavor: FlavorPlan, level: str) -> int:
    fleet = fleet_layers(flavor.nodes)
    if level == ULTRASERVER_LABEL:
        return max((len(server.nodes) for server in fleet.ultraservers), default=0)
    layer = int(level.rsplit("-", 1)[1])
    return fleet.largest(layer)


def _pod_template(flavor: FlavorPlan, annotation: str, level: str, container: str) -> dict[str, Any]:
    resources: dict[str, Any] = {}
    accelerator = lookup(flavor.instance_type).accelerator
    if accelerator is not None:  # all of them, so one example pod takes one whole node
        resources = {"limits": {accelerator.resource: accelerator.per_instance}}
    return {
        "metadata": {"annotations": {annotation: level}},
        "spec": {
            "restartPolicy": "Never",
            "containers": [
                {
                    "name": container,
                    "image": EXAMPLE_IMAGE,
                    "command": ["sh", "-c", 'echo "$POD_NAME runs on $NODE_NAME"'],
                    "env": [
                        {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
                        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                    ],
                    "resources": resources,
                }
            ],
        },
    }


def example_jobs(plan: KueuePlan, flavor: FlavorPlan, queue: str) -> dict[str, dict[str, Any]]:
    """A PyTorchJob that requires one finest domain, and an indexed batch Job that prefers one."""
    finest, coarser = _placement_levels(plan, flavor)
    required_size = max(_largest_domain(flavor, finest), 1)
    preferred_size = max(_largest_domain(flavor, coarser), 1)
    replicas: dict[str, Any] = {
        "Master": {"replicas": 1, "template": _pod_template(flavor, REQUIRED_TOPOLOGY_ANNOTATION, finest, "pytorch")}
    }
    if required_size > 1:
        replicas["Worker"] = {
            "replicas": required_size - 1,
            "template": _pod_template(flavor, REQUIRED_TOPOLOGY_ANNOTATION, finest, "pytorch"),
        }
    pytorch_job = {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": f"{flavor.name}-required", "labels": {QUEUE_NAME_LABEL: queue}},
        "spec": {"pytorchReplicaSpecs": replicas},
    }
    batch_job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": f"{flavor.name}-preferred", "labels": {QUEUE_NAME_LABEL: queue}},
        "spec": {
            "parallelism": preferred_size,
            "completions": preferred_size,
            "completionMode": "Indexed",
            "suspend": True,
            "template": _pod_template(flavor, PREFERRED_TOPOLOGY_ANNOTATION, finest, "worker"),
        },
    }
    return {
        f"{flavor.name}-pytorchjob-required.yaml": pytorch_job,
        f"{flavor.name}-job-preferred.yaml": batch_job,
    }


_PLAIN_KEY = re.compile(r"[A-Za-z][A-Za-z0-9_.\-/]*")


def _scalar(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if value is None:
        return "null"
    return _quoted(str(value))


def _quoted(text: str) -> str:
    """A JSON string is a YAML double-quoted scalar: nothing in it reads as another type or as syntax. Printable
    ASCII only, the rest escaped as YAML's \\u / \\U (a JSON surrogate pair is no YAML escape)."""
    quoted = json.dumps(text, ensure_ascii=False)
    return "".join(
        c if " " <= c < "\x7f" else f"\\u{ord(c):04x}" if ord(c) <= 0xFFFF else f"\\U{ord(c):08x}" for c in quoted
    )


_RESERVED = frozenset({"true", "false", "null", "yes", "no", "on", "off", "y", "n"})


def _key(key: str) -> str:
    plain = _PLAIN_KEY.fullmatch(key) and key.lower() not in _RESERVED
    return key if plain else _quoted(key)


def _block(value: Any, indent: str) -> list[str]:
    """Block-style YAML lines of a mapping or sequence, keys in their given order."""
    lines: list[str] = []
    if isinstance(value, Mapping):
        for key, item in value.items():
            if isinstance(item, (Mapping, list)) and item:
                lines.append(f"{indent}{_key(str(key))}:")
                lines += _block(item, indent + ("" if isinstance(item, list) else "  "))
            else:
                empty = "{}" if isinstance(item, Mapping) else "[]" if isinstance(item, list) else _scalar(item)
                lines.append(f"{indent}{_key(str(key))}: {empty}")
        return lines
    for item in value:
        if isinstance(item, (Mapping, list)) and item:
            nested = _block(item, indent + "  ")
            lines.append(f"{indent}- {nested[0].lstrip()}")
            lines += nested[1:]
        else:
            empty = "{}" if isinstance(item, Mapping) else "[]" if isinstance(item, list) else _scalar(item)
            lines.append(f"{indent}- {empty}")
    return lines


def dump_yaml(*documents: Mapping[str, Any]) -> str:
    """Plain block-style YAML, deterministic, without PyYAML (the reconcile Lambda's layer has none)."""
    return "---\n".join("\n".join(_block(document, "") or ["{}"]) + "\n" for document in documents)


TOPOLOGY_FILE = "kueue-topology.yaml"


def render_kueue(plan: KueuePlan, queue: str) -> dict[str, str]:
    """File name -> content: the Topologies and ResourceFlavors, the example jobs, and README.md."""
    objects = [topology_object(topology) for topology in plan.topologies]
    objects += [flavor_object(flavor) for flavor in plan.flavors]
    files = {TOPOLOGY_FILE: dump_yaml(*objects)}
    for flavor in plan.flavors:
        if flavor.topology:
            files.update({name: dump_yaml(job) for name, job in example_jobs(plan, flavor, queue).items()})
    files["README.md"] = render_summary(plan, queue, sorted(name for name in files if name != TOPOLOGY_FILE))
    return files


def render_summary(plan: KueuePlan, queue: str, job_files: list[str]) -> str:
    lines = [
        f"# Kueue topology-aware scheduling for this fleet (Kueue {KUEUE_VERSION}, {KUEUE_API})",
        "",
        f"1. `kubectl apply -f {TOPOLOGY_FILE}`: the Topologies and one ResourceFlavor per instance type.",
        "2. List the flavors in your ClusterQueue's `resourceGroups[].flavors` (with quotas), and point a LocalQueue",
        f"   named `{queue}` at it (or edit the `{QUEUE_NAME_LABEL}` label in the examples).",
        "3. Try the examples: `kubectl create -f FILE`; each pod prints the node it landed on.",
        "",
        "Kueue needs every level label on every node of a flavor, so each layer depth has its own Topology",
        "(3-layer and 4-layer types never share one), and UltraServer types get a Topology with",
        f"`{ULTRASERVER_LABEL}`. A flavor's nodeLabels, tolerations and topologyName cannot change once",
        "created with a topology, and a Topology's levels cannot change: delete and re-create them instead.",
        "",
        "## Topologies",
        "",
    ]
    for topology in plan.topologies:
        flavors = ", ".join(f.name for f in plan.flavors if f.topology == topology.name)
        lines.append(f"- `{topology.name}` ({flavors}): " + " > ".join(f"`{level}`" for level in topology.levels))
    lines += ["", "## Flavors", "", "| flavor | instance type label | nodes | topology | largest required job |"]
    lines.append("| --- | --- | --- | --- | --- |")
    for flavor in plan.flavors:
        if flavor.topology:
            finest, _ = _placement_levels(plan, flavor)
            largest = f"{_largest_domain(flavor, finest)} nodes in one `{finest}`"
        else:
            largest = "no topology"
        lines.append(
            f"| `{flavor.name}` | `{flavor.instance_type_label}` | {len(flavor.nodes)} | "
            f"{flavor.topology or '-'} | {largest} |"
        )
    lines += [
        "",
        "Required topology (`kueue.x-k8s.io/podset-required-topology`) waits until the whole pod set fits one",
        "domain at that level; preferred (`kueue.x-k8s.io/podset-preferred-topology`) packs as tightly as it can",
        "and spills over. The HyperPod CLI's `--required-topology` / `--preferred-topology` accept only",
        f"`{ULTRASERVER_LABEL}` and `topology.k8s.aws/network-node-layer-1..3`: for layer 4, use the annotation.",
        "Kueue places each pod set on its own: in the PyTorchJob, Master and Worker each get one domain.",
        "",
        "## Examples",
        "",
        *[f"- `{name}`" for name in job_files],
    ]
    if plan.warnings:
        lines += ["", "## Warnings", "", *[f"- {warning}" for warning in plan.warnings]]
    return "\n".join(lines) + "\n"
