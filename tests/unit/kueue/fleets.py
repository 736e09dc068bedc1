"""Recorded-shape EKS fleets: DescribeCluster / ListClusterNodes / DescribeInstanceTopology snapshots and the
``kubectl get nodes -o json`` NodeLists a HyperPod EKS cluster shows for them.

Shapes follow the recorded responses in the reference notes (``nn-`` plus 17 hex digits; ``ml.`` types in
SageMaker, plain types in EC2); the values are invented. ``python -m tests.unit.kueue.fleets`` rewrites the
shipped copies in examples/eks/.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

EXAMPLES = Path(__file__).resolve().parents[3] / "examples" / "eks"
REGION_ZONE = "us-west-2a"
LAYER = "topology.k8s.aws/network-node-layer-"
ULTRASERVER = "topology.k8s.aws/ultraserver-id"


def _network_node(fleet: int, layer: int, index: int) -> str:
    return f"nn-{fleet:02x}{layer:01x}{index:014x}"


def _instance_id(fleet: int, index: int) -> str:
    return f"i-0{fleet:02x}{index:014x}"


def group(
    name: str, instance_type: str, count: int, per_domain: int, fanout: int = 2, depth: int = 3, ultraserver: int = 0
) -> dict[str, Any]:
    """An instance group: ``per_domain`` nodes per bottom domain, ``fanout`` domains per parent, ``depth`` layers;
    ``ultraserver`` > 0 puts that many consecutive nodes in one UltraServer."""
    return {
        "name": name,
        "type": instance_type,
        "count": count,
        "per_domain": per_domain,
        "fanout": fanout,
        "depth": depth,
        "ultraserver": ultraserver,
    }


def eks_snapshot(fleet: int, cluster: str, groups: list[dict[str, Any]]) -> dict[str, Any]:
    """Nodes are numbered across groups; every group hangs off the same top (layer-1) network node."""
    nodes: list[dict[str, Any]] = []
    topology: list[dict[str, Any]] = []
    index = 0
    for group_number, spec in enumerate(groups):
        for local in range(spec["count"]):
            instance_id = _instance_id(fleet, index)
            nodes.append(
                {
                    "InstanceGroupName": spec["name"],
                    "InstanceId": instance_id,
                    "InstanceStatus": {"Status": "Running", "Message": ""},
                    "InstanceType": f"ml.{spec['type']}",
                    "LaunchTime": "2026-11-20T10:30:00+00:00",
                    **(
                        {"UltraServerInfo": {"Id": f"us-{fleet:02x}{local // spec['ultraserver']:015x}"}}
                        if spec["ultraserver"]
                        else {}
                    ),
                }
            )
            path = [local // spec["per_domain"]]
            for _ in range(spec["depth"] - 2):
                path.insert(0, path[0] // spec["fanout"])
            layers = [_network_node(fleet, 1, 0)] + [
                # Groups never share a network node below the top one.
                _network_node(fleet, layer + 2, (group_number << 40) + number)
                for layer, number in enumerate(path)
            ]
            topology.append(
                {
                    "InstanceId": instance_id,
                    "InstanceType": spec["type"],
                    "NetworkNodes": layers,
                    "AvailabilityZone": REGION_ZONE,
                    "ZoneId": "usw2-az1",
                    **({"CapacityBlockId": nodes[-1]["UltraServerInfo"]["Id"]} if spec["ultraserver"] else {}),
                }
            )
            index += 1
    return {
        "describe_cluster": {
            "ClusterArn": f"arn:aws:sagemaker:us-west-2:111122223333:cluster/{cluster}",
            "ClusterName": cluster,
            "ClusterStatus": "InService",
            "Orchestrator": {"Eks": {"ClusterArn": f"arn:aws:eks:us-west-2:111122223333:cluster/{cluster}-eks"}},
            "InstanceGroups": [
                {"InstanceGroupName": spec["name"], "InstanceType": f"ml.{spec['type']}", "CurrentCount": spec["count"]}
                for spec in groups
            ],
        },
        "nodes": nodes,
        "instance_topology": topology,
    }


def node_list(snapshot: dict[str, Any]) -> dict[str, Any]:
    """The NodeList the cluster shows: labels as the cloud provider sets them from the same facts."""
    topology = {item["InstanceId"]: item for item in snapshot["instance_topology"]}
    items = []
    for node in snapshot["nodes"]:
        instance_id = node["InstanceId"]
        name = f"hyperpod-{instance_id}"
        labels = {
            "kubernetes.io/arch": "amd64",
            "kubernetes.io/hostname": name,
            "kubernetes.io/os": "linux",
            "node.kubernetes.io/instance-type": node["InstanceType"],
            "sagemaker.amazonaws.com/instance-group-name": node["InstanceGroupName"],
            "topology.kubernetes.io/zone": REGION_ZONE,
        }
        for number, network_node in enumerate(topology[instance_id].get("NetworkNodes") or []):
            labels[f"{LAYER}{number + 1}"] = network_node
        if node.get("UltraServerInfo"):
            labels[ULTRASERVER] = node["UltraServerInfo"]["Id"]
        items.append(
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {"name": name, "labels": dict(sorted(labels.items()))},
                "spec": {"providerID": f"aws:///{REGION_ZONE}/{instance_id}"},
            }
        )
    return {"apiVersion": "v1", "kind": "List", "items": items, "metadata": {"resourceVersion": ""}}


def p5_fleet() -> dict[str, Any]:
    return eks_snapshot(1, "eks-p5", [group("p5", "p5.48xlarge", 40, per_domain=8, fanout=3)])


def mixed_fleet() -> dict[str, Any]:
    return eks_snapshot(
        2,
        "eks-mixed",
        [group("p5", "p5.48xlarge", 16, per_domain=4), group("b200", "p6-b200.48xlarge", 16, per_domain=4, depth=4)],
    )


def ultraserver_fleet() -> dict[str, Any]:
    return eks_snapshot(3, "eks-gb200", [group("gb200", "p6e-gb200.36xlarge", 36, per_domain=18, ultraserver=18)])


def missing_labels_nodes() -> dict[str, Any]:
    """The mixed fleet after drift: a b200 node without layer 4, a p5 without layer 3, a p5 with a stale layer 3."""
    nodes = copy.deepcopy(node_list(mixed_fleet()))
    items = nodes["items"]
    del items[20]["metadata"]["labels"][f"{LAYER}4"]
    del items[3]["metadata"]["labels"][f"{LAYER}3"]
    items[5]["metadata"]["labels"][f"{LAYER}3"] = _network_node(2, 4, 999)
    return nodes


def shipped() -> dict[str, Any]:
    return {
        "p5-3-layer.snapshot.json": p5_fleet(),
        "p5-3-layer.nodes.json": node_list(p5_fleet()),
        "mixed-3-4-layer.snapshot.json": mixed_fleet(),
        "mixed-3-4-layer.nodes.json": node_list(mixed_fleet()),
        "ultraserver.snapshot.json": ultraserver_fleet(),
        "ultraserver.nodes.json": node_list(ultraserver_fleet()),
        "missing-labels.nodes.json": missing_labels_nodes(),
    }


def dumps(document: Any) -> str:
    return json.dumps(document, indent=1) + "\n"


if __name__ == "__main__":
    EXAMPLES.mkdir(parents=True, exist_ok=True)
    for file_name, document in shipped().items():
        (EXAMPLES / file_name).write_text(dumps(document))
