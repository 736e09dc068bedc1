"""The ParallelCluster preview from the CLI, against the emulator: a cluster tagged as ParallelCluster tags it,
its head node's `scontrol show nodes --json` in a file, then snapshot -> show -> verify --bundle-out, with the
node names slurmctld uses (``q1-st-p5-1``), never the instances' host names."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from topokeeper.cli.main import main
from topokeeper.sim.aws_emulator import AwsEmulator
from topokeeper.sim.parallelcluster import ParallelCluster
from topokeeper.sim.scenario import load_scenario

SCENARIO = Path(__file__).resolve().parents[3] / "layers/core/python/topokeeper/sim/scenarios/parallelcluster.yaml"


def _node_table(cluster: ParallelCluster, bound: dict[str, tuple[str, str]]) -> dict[str, Any]:
    """What `scontrol show nodes --json` prints (the fields topokeeper reads): a static node bound in
    slurm.conf, a dynamic one by the resume program's scontrol update, a powered-down one at its own name."""
    addresses = cluster.addresses()
    nodes = []
    for queue, names in cluster.partitions().items():
        for name in names:
            address, host = bound.get(name, (addresses.get(name, name), ""))
            host = host or ("ip-" + address.replace(".", "-") if address != name else name)
            nodes.append({"name": name, "address": address, "hostname": host, "partitions": [queue], "state": ["IDLE"]})
    version = {"major": "26", "minor": "05", "micro": "0"}
    return {"meta": {"slurm": {"version": version, "release": "26.05.0"}}, "nodes": nodes, "errors": []}


@pytest.fixture
def pcluster(emulated: AwsEmulator, tmp_path: Path) -> Path:
    """The scenario's ParallelCluster in the emulator, two dynamic nodes powered up; returns the node table file."""
    bound: dict[str, tuple[str, str]] = {}
    spec = load_scenario(SCENARIO).cluster
    cluster = ParallelCluster(emulated, spec, lambda name, address, host: bound.update({name: (address, host)}))
    cluster.launch_head_node()
    cluster.create()
    cluster.scale("p5", 6)  # q1-dy-p5-1 and -2
    table = tmp_path / "nodes.json"
    table.write_text(json.dumps(_node_table(cluster, bound)))
    return table


def test_snapshot_with_parallelclusters_tags_and_node_table_plans_slurmctlds_names(
    pcluster: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    snapshot = tmp_path / "snapshot.json"
    argv = ["snapshot", "--cluster", "pcluster", "--parallelcluster", "--slurm-nodes", str(pcluster)]
    assert main([*argv, "--out", str(snapshot)]) == 0
    assert "named from 16 Slurm nodes" in capsys.readouterr().out  # q1: 4 static + 8 dynamic; cpu: 2 + 2

    assert main(["show", "--snapshot", str(snapshot), "--leaves", "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["slurm"]["version"] == "26.05"  # the head node's, from the table
    planned = {p["name"]: p for p in document["partitions"]}
    assert planned["q1"]["node_count"] == 12 and planned["cpu"]["node_count"] == 4
    q1 = {name for leaf in planned["q1"]["switches"] for name in leaf.get("nodes", [])}
    assert {f"q1-st-p5-{n}" for n in range(1, 5)} | {"q1-dy-p5-1", "q1-dy-p5-2"} <= q1
    assert not any(name.startswith("ip-") for name in q1)

    out = tmp_path / "preview"
    assert main(["verify", "--snapshot", str(snapshot), "--bundle-out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "sudo python3 topokeeper-head-node.pyz dry-run bundle.json" in printed, printed
    bundle = json.loads((out / "bundle.json").read_text())
    table = {n["name"]: n["address"] for n in json.loads(pcluster.read_text())["nodes"]}
    assert bundle["bindings"] == {name: table[name] for name in bundle["bindings"]}
    assert {"q1-st-p5-1", "q1-dy-p5-2"} <= set(bundle["bindings"])


def test_a_node_table_that_is_not_scontrols_is_one_line_naming_the_file(
    emulated: AwsEmulator, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    table = tmp_path / "nodes.json"
    table.write_text(json.dumps({"nodes": [{"address": "172.31.0.11"}]}))
    argv = ["snapshot", "--cluster", "pcluster", "--parallelcluster", "--slurm-nodes", str(table)]
    assert main(argv) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and error.startswith("topokeeper: error: --slurm-nodes.nodes[0].name"), error
