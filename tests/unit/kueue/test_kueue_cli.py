"""`topokeeper kueue` and `topokeeper labels` on the shipped examples, as a user runs them from a fresh clone."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tests.unit.kueue import fleets
from tests.unit.kueue.kueue_api import api_errors
from topokeeper.cli.main import main
from topokeeper.kueue.annotations import manifest_errors

EXAMPLES = fleets.EXAMPLES


def test_shipped_examples_are_the_generated_fleets() -> None:
    shipped = {path.name for path in EXAMPLES.iterdir()}
    assert shipped == set(fleets.shipped())
    for file_name, document in fleets.shipped().items():
        assert (EXAMPLES / file_name).read_text() == fleets.dumps(document), f"regenerate {file_name}"


@pytest.mark.parametrize(
    "inputs",
    [
        ["--snapshot", "mixed-3-4-layer.snapshot.json"],
        ["--nodes", "mixed-3-4-layer.nodes.json"],
        ["--snapshot", "mixed-3-4-layer.snapshot.json", "--nodes", "missing-labels.nodes.json"],
        ["--snapshot", "ultraserver.snapshot.json", "--nodes", "ultraserver.nodes.json"],
        ["--snapshot", "p5-3-layer.snapshot.json"],
    ],
)
def test_kueue_writes_valid_objects_and_jobs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], inputs: list[str]
) -> None:
    args = [str(EXAMPLES / value) if value.endswith(".json") else value for value in inputs]
    assert main(["kueue", *args, "--out", str(tmp_path)]) == 0
    names = sorted(path.name for path in tmp_path.iterdir())
    assert {"README.md", "kueue-topology.yaml", "labels.txt", "layers.mmd"} <= set(names)
    for document in yaml.safe_load_all((tmp_path / "kueue-topology.yaml").read_text()):
        assert api_errors(document) == []
    jobs = [name for name in names if name.endswith(("-required.yaml", "-preferred.yaml"))]
    assert jobs
    for name in jobs:
        assert manifest_errors(yaml.safe_load((tmp_path / name).read_text())) == []
    out = capsys.readouterr().out
    assert "flavor ml-" in out


def test_kueue_reports_label_drift(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    snapshot, nodes = EXAMPLES / "mixed-3-4-layer.snapshot.json", EXAMPLES / "missing-labels.nodes.json"
    assert main(["kueue", "--snapshot", str(snapshot), "--nodes", str(nodes), "--out", str(tmp_path)]) == 0
    assert "label drift: 3 findings" in capsys.readouterr().out
    assert (
        "kubectl label node hyperpod-i-00200000000000014 topology.k8s.aws/network-node-layer-4="
        in (tmp_path / "labels.txt").read_text()
    )


def test_labels_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["labels", "--nodes", str(EXAMPLES / "missing-labels.nodes.json"), "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["nodes"] == 32
    assert [layer["layer"] for layer in document["layers"]] == [1, 2, 3, 4]
    assert [(d["node"], d["kind"]) for d in document["drift"]] == [
        ("hyperpod-i-00200000000000003", "level-missing"),
        ("hyperpod-i-00200000000000014", "level-missing"),
    ]
    assert document["nodes_without_topology_data"] == ["hyperpod-i-00200000000000003", "hyperpod-i-00200000000000014"]


def test_labels_table_and_mermaid(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["labels", "--snapshot", str(EXAMPLES / "p5-3-layer.snapshot.json")]) == 0
    assert "largest job that fits one layer-3 domain: 8 nodes" in capsys.readouterr().out
    assert main(["labels", "--snapshot", str(EXAMPLES / "p5-3-layer.snapshot.json"), "--mermaid"]) == 0
    assert capsys.readouterr().out.startswith("flowchart TB\n")


def test_labels_on_a_slurm_cluster_warns(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["labels", "--snapshot", str(EXAMPLES.parent / "mixed-cluster.json")]) == 0
    assert "warning: llm-train-slurm is not EKS-orchestrated" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["labels"], "--snapshot: give --snapshot FILE or --cluster NAME, --nodes NODES.json, or both"),
        (["labels", "--nodes", "/nonexistent.json"], "--nodes: cannot read"),
    ],
)
def test_bad_input_is_one_line(capsys: pytest.CaptureFixture[str], args: list[str], message: str) -> None:
    assert main(args) == 2
    assert message in capsys.readouterr().err
