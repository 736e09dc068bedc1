"""Kubernetes node labels <-> canonical Node facts.

Label names (EKS user guide "network topology labels"; kubernetes/cloud-provider-aws ``well_known_labels.go``):
``topology.k8s.aws/network-node-layer-N`` carries ``DescribeInstanceTopology`` ``NetworkNodes[N-1]`` (layer 1 is
the top), ``-4`` exists only on 4-layer types; ``topology.k8s.aws/ultraserver-id`` names a node's UltraServer.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from topokeeper.contract.errors import InputError
from topokeeper.domain.catalog import HYPERPOD_PREFIX
from topokeeper.domain.models import MAX_NETWORK_LAYERS, Node
from topokeeper.domain.names import check_slurm_name

LAYER_LABEL_PREFIX = "topology.k8s.aws/network-node-layer-"
ULTRASERVER_LABEL = "topology.k8s.aws/ultraserver-id"
HOSTNAME_LABEL = "kubernetes.io/hostname"
INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"
_PROVIDER_INSTANCE = re.compile(r"aws://.*/(i-[0-9a-f]+)")
_HYPERPOD_NAME_INSTANCE = re.compile(r"hyperpod-(i-[0-9a-f]+)")


def layer_label(layer: int) -> str:
    """The label of network layer ``layer`` (1-based, 1 is the top)."""
    return f"{LAYER_LABEL_PREFIX}{layer}"


def topology_labels(node: Node) -> dict[str, str]:
    """The topology labels the node should carry, per its DescribeInstanceTopology facts."""
    labels = {layer_label(index + 1): network_node for index, network_node in enumerate(node.network_nodes)}
    if node.ultraserver_id:
        labels[ULTRASERVER_LABEL] = node.ultraserver_id
    return labels


def instance_type_label(node: Node) -> str:
    """HyperPod labels its EKS nodes with the SageMaker type (``ml.p5.48xlarge``)."""
    return f"{HYPERPOD_PREFIX}{node.instance_type}"


@dataclass(frozen=True)
class KubeNode:
    """One item of a NodeList: the labels as the cluster has them."""

    name: str
    instance_id: str | None
    labels: Mapping[str, str] = field(default_factory=dict)


def parse_node_list(document: Any) -> tuple[KubeNode, ...]:
    """``kubectl get nodes -o json`` (a NodeList; a single Node is accepted too)."""
    if not isinstance(document, dict):
        raise InputError("--nodes", "not a Kubernetes NodeList (JSON object with items)")
    items = [document] if document.get("kind") == "Node" else document.get("items")
    if not isinstance(items, list):
        raise InputError("--nodes.items", "missing or not a list; expected `kubectl get nodes -o json` output")
    nodes: list[KubeNode] = []
    for index, item in enumerate(items):
        where = f"items[{index}]"
        metadata = item.get("metadata") if isinstance(item, dict) else None
        if not isinstance(metadata, dict) or not isinstance(metadata.get("name"), str) or not metadata["name"]:
            raise InputError(f"{where}.metadata.name", "missing or not a string")
        labels = metadata.get("labels") or {}
        if not isinstance(labels, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in labels.items()
        ):
            raise InputError(f"{where}.metadata.labels", "not a map of strings")
        spec = item.get("spec") or {}
        provider = spec.get("providerID") if isinstance(spec, dict) else None
        nodes.append(KubeNode(metadata["name"], _instance_id(metadata["name"], provider), dict(labels)))
    names = [node.name for node in nodes]
    if len(set(names)) != len(names):
        duplicate = sorted(name for name in set(names) if names.count(name) > 1)[0]
        raise InputError("--nodes.items", f"node {duplicate!r} appears more than once")
    return tuple(sorted(nodes, key=lambda node: node.name))


def _instance_id(name: str, provider_id: object) -> str | None:
    if isinstance(provider_id, str) and (match := _PROVIDER_INSTANCE.fullmatch(provider_id)):
        return match.group(1)
    match = _HYPERPOD_NAME_INSTANCE.fullmatch(name)
    return match.group(1) if match else None


def labeled_layers(labels: Mapping[str, str]) -> tuple[str, ...]:
    """The network nodes a node's labels name, top down, up to the first missing layer."""
    layers: list[str] = []
    for layer in range(1, MAX_NETWORK_LAYERS + 1):
        value = labels.get(layer_label(layer))
        if not value:
            break
        layers.append(value)
    return tuple(layers)


def nodes_from_labels(kube_nodes: Iterable[KubeNode]) -> tuple[tuple[Node, ...], tuple[str, ...]]:
    """Canonical Nodes as the labels describe them, and a warning for each node that cannot be one."""
    nodes: list[Node] = []
    warnings: list[str] = []
    for kube in kube_nodes:
        instance_type = kube.labels.get(INSTANCE_TYPE_LABEL)
        if kube.instance_id is None or not instance_type:
            missing = "spec.providerID" if kube.instance_id is None else INSTANCE_TYPE_LABEL
            warnings.append(f"node {kube.name}: no {missing}; left out")
            continue
        fields = {
            "name": kube.name,
            "instance_id": kube.instance_id,
            "instance_type": instance_type,
            "network_nodes": labeled_layers(kube.labels),
            "ultraserver_id": kube.labels.get(ULTRASERVER_LABEL) or None,
        }
        try:
            nodes.append(Node.model_validate(fields))
        except ValidationError as error:
            raise InputError.from_validation(error, prefix=f"node {kube.name}") from error
    return tuple(nodes), tuple(warnings)


def merge_facts(facts: Iterable[Node], kube_nodes: Iterable[KubeNode]) -> tuple[Node, ...]:
    """The snapshot's facts under the names the cluster gives its nodes (joined on instance id)."""
    name_by_instance = {kube.instance_id: kube.name for kube in kube_nodes if kube.instance_id}
    renamed: list[Node] = []
    for node in facts:
        name = name_by_instance.get(node.instance_id, node.name) if node.instance_id else node.name
        if name != node.name:
            try:
                check_slurm_name(name)  # the one field that changes; the rest was validated when the Node was built
            except ValueError as error:
                raise InputError(f"node {name}", str(error)) from error
        renamed.append(node if name == node.name else node.model_copy(update={"name": name}))
    return tuple(sorted(renamed, key=lambda node: node.name))
