"""Layer domains, the labels table / Mermaid / JSON, and label drift against DescribeInstanceTopology."""

from __future__ import annotations

import pytest

from tests.unit.kueue import fleets
from topokeeper.contract.errors import InputError
from topokeeper.engine.snapshot import eks_nodes, parse_snapshot_document
from topokeeper.kueue.drift import DriftKind, label_drift
from topokeeper.kueue.fleet import fleet_json, fleet_layers, render_mermaid, render_table
from topokeeper.kueue.node_list import merge_facts, nodes_from_labels, parse_node_list
from topokeeper.kueue.objects import plan_kueue

LAYER = "topology.k8s.aws/network-node-layer-"


def test_domains_and_sizes_per_layer() -> None:
    fleet = fleet_layers(eks_nodes(parse_snapshot_document(fleets.p5_fleet())))
    # 40 nodes, 8 per layer-3 domain, 3 layer-3 domains per layer-2 domain.
    assert [len(fleet.layer(n)) for n in (1, 2, 3)] == [1, 2, 5]
    assert [d.size for d in fleet.layer(2)] == [24, 16]
    assert fleet.largest(3) == 8
    table = render_table(fleet)
    assert "largest job that fits one layer-3 domain: 8 nodes" in table
    assert table.splitlines()[0].split() == ["LAYER", "DOMAIN", "PARENT", "NODES", "TYPES", "MEMBERS"]
    mermaid = render_mermaid(fleet)
    assert mermaid.count(" --> ") == 2 + 5  # every layer-2 and layer-3 domain under its parent
    document = fleet_json(fleet)
    assert [layer["largest_domain"] for layer in document["layers"]] == [40, 24, 8]
    assert sum(len(d["nodes"]) for d in document["layers"][2]["domains"]) == 40


def test_ultraservers_are_listed_under_their_layer3_domain() -> None:
    fleet = fleet_layers(eks_nodes(parse_snapshot_document(fleets.ultraserver_fleet())))
    assert [len(server.nodes) for server in fleet.ultraservers] == [18, 18]
    assert fleet.ultraservers_inside_one_layer3_domain
    assert render_mermaid(fleet).count(" -.- us") == 2


def test_ten_thousand_nodes() -> None:
    snapshot = fleets.eks_snapshot(
        5,
        "eks-big",
        [
            fleets.group("p5", "p5.48xlarge", 6000, per_domain=16, fanout=8),
            fleets.group("b200", "p6-b200.48xlarge", 4000, per_domain=8, fanout=4, depth=4),
        ],
    )
    nodes = eks_nodes(parse_snapshot_document(snapshot))
    plan = plan_kueue(nodes)
    assert plan.fleet.node_count == 10_000
    assert len(plan.fleet.layer(3)) == 6000 // 16 + 4000 // 8 // 4
    assert [t.name for t in plan.topologies] == ["aws-3-layer-network", "aws-4-layer-network"]
    kube = parse_node_list(fleets.node_list(snapshot))
    assert label_drift(kube, merge_facts(nodes, kube), plan) == ()


def test_drift_against_describe_instance_topology() -> None:
    kube = parse_node_list(fleets.missing_labels_nodes())
    facts = merge_facts(eks_nodes(parse_snapshot_document(fleets.mixed_fleet())), kube)
    findings = label_drift(kube, facts, plan_kueue(facts))
    assert [(f.node, f.label, f.kind) for f in findings] == [
        ("hyperpod-i-00200000000000003", f"{LAYER}3", DriftKind.MISSING),
        ("hyperpod-i-00200000000000005", f"{LAYER}3", DriftKind.DIFFERENT),
        ("hyperpod-i-00200000000000014", f"{LAYER}4", DriftKind.MISSING),
    ]
    assert findings[1].fix == (
        f"kubectl label node hyperpod-i-00200000000000005 {LAYER}3={findings[1].want} --overwrite"
    )


def test_drift_from_the_node_list_alone_finds_levels_the_topology_requires() -> None:
    kube = parse_node_list(fleets.missing_labels_nodes())
    facts, _ = nodes_from_labels(kube)
    findings = label_drift(kube, None, plan_kueue(facts))
    # Without DescribeInstanceTopology the stale value cannot be seen; the missing levels can.
    assert [(f.node, f.label, f.kind) for f in findings] == [
        ("hyperpod-i-00200000000000003", f"{LAYER}3", DriftKind.LEVEL_MISSING),
        ("hyperpod-i-00200000000000014", f"{LAYER}4", DriftKind.LEVEL_MISSING),
    ]
    assert "no value known for i-00200000000000014" in findings[1].fix


def test_a_label_aws_does_not_back_is_reported() -> None:
    nodes = fleets.node_list(fleets.p5_fleet())
    nodes["items"][0]["metadata"]["labels"][f"{LAYER}4"] = "nn-0ffffffffffffffff"
    kube = parse_node_list(nodes)
    facts = merge_facts(eks_nodes(parse_snapshot_document(fleets.p5_fleet())), kube)
    (finding,) = label_drift(kube, facts, plan_kueue(facts))
    assert (finding.label, finding.kind) == (f"{LAYER}4", DriftKind.UNKNOWN_TO_AWS)


def test_a_node_without_instance_id_or_type_is_left_out_with_a_warning() -> None:
    nodes = fleets.node_list(fleets.p5_fleet())
    nodes["items"][0]["metadata"]["name"] = "worker-a"
    del nodes["items"][0]["spec"]["providerID"]
    del nodes["items"][1]["metadata"]["labels"]["node.kubernetes.io/instance-type"]
    facts, warnings = nodes_from_labels(parse_node_list(nodes))
    assert len(facts) == 38
    assert warnings == (
        "node hyperpod-i-00100000000000001: no node.kubernetes.io/instance-type; left out",
        "node worker-a: no spec.providerID; left out",
    )


@pytest.mark.parametrize(
    ("document", "field"),
    [
        ([], "--nodes"),
        ({"items": "x"}, "--nodes.items"),
        ({"items": [{"metadata": {}}]}, "items[0].metadata.name"),
        ({"items": [{"metadata": {"name": "a", "labels": {"k": 1}}}]}, "items[0].metadata.labels"),
        ({"items": [{"metadata": {"name": "a"}}, {"metadata": {"name": "a"}}]}, "--nodes.items"),
    ],
)
def test_bad_node_lists_name_the_field(document: object, field: str) -> None:
    with pytest.raises(InputError) as raised:
        parse_node_list(document)
    assert raised.value.field == field


def test_a_node_list_name_that_cannot_be_a_node_name_is_refused() -> None:
    nodes = fleets.node_list(fleets.p5_fleet())
    nodes["items"][0]["metadata"]["name"] = "x" * 70
    with pytest.raises(InputError) as raised:
        merge_facts(eks_nodes(parse_snapshot_document(fleets.p5_fleet())), parse_node_list(nodes))
    assert raised.value.field == "node " + "x" * 70


def test_nodes_without_the_topology_data_their_flavor_needs() -> None:
    snapshot = fleets.mixed_fleet()
    b200 = [t for t in snapshot["instance_topology"] if t["InstanceType"] == "p6-b200.48xlarge"]
    b200[0]["NetworkNodes"] = b200[0]["NetworkNodes"][:3]  # partial topology
    b200[1]["NetworkNodes"] = []  # not reported yet
    plan = plan_kueue(eks_nodes(parse_snapshot_document(snapshot)))
    assert plan.nodes_without_topology_data == tuple(f"hyperpod-{t['InstanceId']}" for t in b200[:2])
    assert plan_kueue(eks_nodes(parse_snapshot_document(fleets.mixed_fleet()))).nodes_without_topology_data == ()
