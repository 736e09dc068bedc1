"""Every generated object passes Kueue v0.19.2's CRD schema and CEL rules; the validator refuses what the API
server refuses (so a generated object the API server would reject fails here)."""

from __future__ import annotations

import copy
import random
from typing import Any

import pytest
import yaml

from tests.unit.kueue import fleets
from tests.unit.kueue.kueue_api import api_errors
from topokeeper.engine.snapshot import eks_nodes, parse_snapshot_document
from topokeeper.kueue.annotations import manifest_errors
from topokeeper.kueue.node_list import nodes_from_labels, parse_node_list
from topokeeper.kueue.objects import plan_kueue, render_kueue

FLEETS = {
    "p5": fleets.p5_fleet,
    "mixed": fleets.mixed_fleet,
    "ultraserver": fleets.ultraserver_fleet,
}


def topology(levels: list[str]) -> dict[str, Any]:
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "Topology",
        "metadata": {"name": "t"},
        "spec": {"levels": [{"nodeLabel": level} for level in levels]},
    }


def flavor(spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor", "metadata": {"name": "f"}, "spec": spec}


def rendered(name: str) -> dict[str, str]:
    return render_kueue(plan_kueue(eks_nodes(parse_snapshot_document(FLEETS[name]()))), "user-queue")


@pytest.mark.parametrize("name", sorted(FLEETS))
def test_every_generated_object_passes_the_crd_schema_and_cel_rules(name: str) -> None:
    files = rendered(name)
    documents = list(yaml.safe_load_all(files["kueue-topology.yaml"]))
    assert {d["kind"] for d in documents} == {"Topology", "ResourceFlavor"}
    for document in documents:
        assert api_errors(document) == []
        assert api_errors(document, old=copy.deepcopy(document)) == []  # re-applying unchanged is an allowed update
    levels = {
        d["metadata"]["name"]: [x["nodeLabel"] for x in d["spec"]["levels"]]
        for d in documents
        if d["kind"] == "Topology"
    }
    flavors = {d["metadata"]["name"]: d["spec"]["topologyName"] for d in documents if d["kind"] == "ResourceFlavor"}
    jobs = [
        yaml.safe_load(text)
        for file_name, text in files.items()
        if file_name.endswith("-required.yaml") or file_name.endswith("-preferred.yaml")
    ]
    assert len(jobs) == 2 * len(flavors)
    for job in jobs:
        assert manifest_errors(job) == []
        flavor_name = job["metadata"]["name"].rsplit("-", 1)[0]
        templates = (
            [job["spec"]["template"]]
            if job["kind"] == "Job"
            else [replica["template"] for replica in job["spec"]["pytorchReplicaSpecs"].values()]
        )
        for template in templates:
            (level,) = template["metadata"]["annotations"].values()
            assert level in levels[flavors[flavor_name]]  # Kueue admits only a level of the flavor's Topology


def test_three_and_four_layer_types_never_share_a_topology() -> None:
    documents = list(yaml.safe_load_all(rendered("mixed")["kueue-topology.yaml"]))
    by_name = {d["metadata"]["name"]: d for d in documents}
    assert by_name["ml-p5-48xlarge"]["spec"]["topologyName"] == "aws-3-layer-network"
    assert by_name["ml-p6-b200-48xlarge"]["spec"]["topologyName"] == "aws-4-layer-network"
    assert [x["nodeLabel"] for x in by_name["aws-4-layer-network"]["spec"]["levels"]] == [
        *(f"topology.k8s.aws/network-node-layer-{n}" for n in (1, 2, 3, 4)),
        "kubernetes.io/hostname",
    ]


def test_ultraservers_inside_one_layer3_domain_sit_under_layer_3() -> None:
    (document,) = [
        d for d in yaml.safe_load_all(rendered("ultraserver")["kueue-topology.yaml"]) if d["kind"] == "Topology"
    ]
    assert [x["nodeLabel"].rsplit("/", 1)[1] for x in document["spec"]["levels"]] == [
        "network-node-layer-1",
        "network-node-layer-2",
        "network-node-layer-3",
        "ultraserver-id",
        "hostname",
    ]


def test_an_ultraserver_spanning_layer3_domains_makes_the_ultraserver_the_top_level() -> None:
    # 9 nodes per layer-3 domain: each 18-node UltraServer spans two of them.
    snapshot = fleets.eks_snapshot(
        9, "eks-span", [fleets.group("gb200", "p6e-gb200.36xlarge", 36, per_domain=9, ultraserver=18)]
    )
    plan = plan_kueue(eks_nodes(parse_snapshot_document(snapshot)))
    assert [t.levels for t in plan.topologies] == [("topology.k8s.aws/ultraserver-id", "kubernetes.io/hostname")]


def test_output_is_deterministic_whatever_the_node_order() -> None:
    snapshot = fleets.mixed_fleet()
    shuffled = copy.deepcopy(snapshot)
    random.Random(7).shuffle(shuffled["nodes"])
    random.Random(8).shuffle(shuffled["instance_topology"])
    first = render_kueue(plan_kueue(eks_nodes(parse_snapshot_document(snapshot))), "q")
    second = render_kueue(plan_kueue(eks_nodes(parse_snapshot_document(shuffled))), "q")
    assert first == second


def test_node_list_alone_gives_the_same_objects_as_the_snapshot() -> None:
    from_labels, warnings = nodes_from_labels(parse_node_list(fleets.node_list(fleets.mixed_fleet())))
    assert warnings == ()
    assert render_kueue(plan_kueue(from_labels), "q")["kueue-topology.yaml"] == rendered("mixed")["kueue-topology.yaml"]


HOSTNAME = "kubernetes.io/hostname"


@pytest.mark.parametrize(
    ("document", "message"),
    [
        (
            topology([HOSTNAME, "topology.k8s.aws/network-node-layer-1"]),
            "kubernetes.io/hostname label can only be used at the lowest level",
        ),
        (topology([f"example.com/level-{n}" for n in range(17)]), "is too long"),
        (
            topology(["topology.k8s.aws/network-node-layer-1", "topology.k8s.aws/network-node-layer-1"]),
            "must be unique",
        ),
        (topology([]), "should be non-empty"),
        (topology(["bad label/with space"]), "does not match"),
        (topology(["a" * 317]), "is too long"),
        (flavor({"topologyName": "aws-3-layer-network"}), "at least one nodeLabel is required when topology is set"),
        (flavor({"topologyName": "Not_A_DNS_Name", "nodeLabels": {"a": "b"}}), "does not match"),
        (flavor({"nodeLabels": {f"k{n}": "v" for n in range(9)}}), "has too many properties"),
        ({**topology(["a"]), "apiVersion": "kueue.x-k8s.io/v1beta1"}, "was expected"),
    ],
)
def test_the_validator_refuses_what_the_api_server_refuses(document: dict[str, Any], message: str) -> None:
    errors = api_errors(document)
    assert any(message in error for error in errors), errors


def test_sixteen_levels_are_accepted() -> None:
    assert api_errors(topology([f"example.com/level-{n}" for n in range(15)] + [HOSTNAME])) == []


def test_topology_levels_are_immutable_on_update() -> None:
    old = topology(["topology.k8s.aws/network-node-layer-1", HOSTNAME])
    new = topology(["topology.k8s.aws/network-node-layer-1", "topology.k8s.aws/network-node-layer-2", HOSTNAME])
    assert api_errors(new) == []  # valid as a new object: the transition rule is skipped on create
    assert api_errors(new, old=old) == ["spec.levels: field is immutable"]


def test_a_flavor_with_a_topology_is_immutable_on_update_and_one_without_is_not() -> None:
    with_topology = flavor({"nodeLabels": {"node.kubernetes.io/instance-type": "ml.p5.48xlarge"}, "topologyName": "t"})
    changed = flavor({"nodeLabels": {"node.kubernetes.io/instance-type": "ml.p5e.48xlarge"}, "topologyName": "t"})
    assert api_errors(changed, old=with_topology) == ["spec: resourceFlavorSpec are immutable when topologyName is set"]
    plain = flavor({"nodeLabels": {"node.kubernetes.io/instance-type": "ml.p5.48xlarge"}})
    assert api_errors(with_topology, old=plain) == []
