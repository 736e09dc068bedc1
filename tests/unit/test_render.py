import json

from tests.helpers import gb200_nodes, node, p5_nodes, snapshot
from topokeeper.domain.models import PLAN_SCHEMA
from topokeeper.engine.planner import plan
from topokeeper.render.bundle import BUNDLE_SCHEMA, Bundle, render, sha256_text

CPU = [node("cpu-1", "c7i.4xlarge", partition="cpu"), node("cpu-2", "c7i.4xlarge", partition="cpu")]


def _rendered(version: str = "26.05"):
    return render(
        plan(snapshot({"p5": p5_nodes(8, partition="p5"), "gb": gb200_nodes(2), "cpu": CPU}, version=version))
    )


def test_yaml_has_flat_default_then_one_topology_per_assigned_partition() -> None:
    text = _rendered().topology_text
    assert text.startswith("# Managed by topokeeper")
    assert [line for line in text.splitlines() if line.startswith("- topology:")] == [
        "- topology: flat-default",
        "- topology: block-gb",
        "- topology: tree-p5",
    ]
    assert "  cluster_default: true\n  flat: true\n" in text
    assert "      - switch: nn-leaf000\n        nodes: p5-[001-003]\n" in text
    assert "    block_sizes:\n      - 18\n" in text
    assert "      - block: us-0000\n        nodes: gb-[001-018]\n" in text
    assert "cpu" not in text


def test_conf_has_one_plugin_and_no_partition_assignments() -> None:
    rendered = _rendered("24.11")
    text = rendered.topology_text
    assert "SwitchName=root Switches=nn-gbspine,nn-spine0,no-topology" in text
    assert "SwitchName=no-topology Nodes=cpu-[1-2]" in text
    assert "BlockName" not in text
    assert rendered.bundle.topology_plugin == "topology/tree"
    assert set(rendered.bundle.partitions.values()) == {None}
    assert list(rendered.bundle.files) == ["topology.conf"]


def test_conf_block_lists_blocks_then_sizes() -> None:
    text = render(plan(snapshot({"gb": gb200_nodes(2)}, version="24.11"))).topology_text
    assert text.splitlines()[1:] == [
        "BlockName=us-0000 Nodes=gb-[001-018]",
        "BlockName=us-0001 Nodes=gb-[019-036]",
        "BlockSizes=18",
    ]


def test_plan_json_is_versioned_and_hashes_what_is_applied() -> None:
    rendered = _rendered()
    document = json.loads(rendered.files()["plan.json"])
    assert document["schema"] == PLAN_SCHEMA
    assert [p["name"] for p in document["partitions"]] == ["cpu", "gb", "p5"]
    p5 = document["partitions"][2]
    assert (p5["kind"], p5["topology"], p5["assignment"], p5["node_count"]) == ("tree", "tree-p5", "tree-p5", 8)
    assert p5["switches"][0] == {"name": "root", "switches": ["nn-spine0"], "nodes": []}
    assert document["partitions"][1]["blocks"][0]["name"] == "us-0000"
    assert document["files"]["topology.yaml"] == sha256_text(rendered.topology_text)
    assert document["sha256"] == rendered.bundle.plan_sha256
    assert len({p["sha256"] for p in document["partitions"]}) == 3


def test_partition_hash_changes_only_for_the_partition_that_changed() -> None:
    before = render(plan(snapshot({"p5": p5_nodes(8, partition="p5"), "gb": gb200_nodes(2)})))
    after = render(plan(snapshot({"p5": p5_nodes(9, partition="p5"), "gb": gb200_nodes(2)})))
    assert before.partition_sha256["gb"] == after.partition_sha256["gb"]
    assert before.partition_sha256["p5"] != after.partition_sha256["p5"]
    assert before.sha256 != after.sha256


def test_bundle_is_the_applier_input() -> None:
    rendered = _rendered()
    document = json.loads(rendered.files()["bundle.json"])
    bundle = Bundle.model_validate(document)
    assert document["schema"] == BUNDLE_SCHEMA
    assert bundle.slurm_format.value == "topology.yaml"
    assert bundle.partitions == {"cpu": None, "gb": "block-gb", "p5": "tree-p5"}
    assert bundle.files["topology.yaml"].sha256 == sha256_text(bundle.files["topology.yaml"].content)
    assert len(bundle.nodes) == 8 + 36 + 2
    assert bundle.plan_sha256 == rendered.sha256


def test_mermaid_draws_every_partition_and_stays_small_for_100_nodes() -> None:
    rendered = render(plan(snapshot({"p5": p5_nodes(100, partition="p5"), "gb": gb200_nodes(2), "cpu": CPU})))
    text = rendered.mermaid
    assert text.count("subgraph ") == 3
    assert "p5 · tree · 100 nodes" in text
    assert "us-0001<br/>18 nodes: gb-[019-036]" in text
    assert len(text.splitlines()) < 120
    assert all(len(line) < 140 for line in text.splitlines())
