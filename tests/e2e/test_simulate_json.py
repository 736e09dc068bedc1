"""`topokeeper simulate --json`: stdout is one JSON document, the story stays on stderr."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from topokeeper.cli import main
from topokeeper.sim.head_node import HEAD_NODE_VARIABLE
from topokeeper.sim.simulator import SimulationResult

SCENARIO = """
cluster:
  name: tiny
  slurm_version: "26.05"
  instance_groups:
    - {name: controller, type: ml.m5.xlarge, count: 1, role: controller}
    - {name: p5, type: ml.p5.48xlarge, count: 4, partition: ml-p5,
       network: {layers: 3, nodes_per_leaf: 2, leaves_per_spine: 2}}
steps:
  - replace: {group: p5, count: 1}
"""


def test_simulate_json_prints_the_result_and_what_it_wrote(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(HEAD_NODE_VARIABLE, "file")
    scenario = tmp_path / "tiny.yaml"
    scenario.write_text(SCENARIO)
    out = tmp_path / "out"
    assert main(["simulate", "--scenario", str(scenario), "--out", str(out), "--json"]) == 0
    captured = capsys.readouterr()
    document = json.loads(captured.out)  # nothing else on stdout
    assert document["written"] == [str(out / "result.json"), str(out / "report.html")]
    result = SimulationResult.model_validate(document["result"])
    assert result == SimulationResult.model_validate_json((out / "result.json").read_text())
    assert [step.step for step in result.steps] == ["create", "replace"] and result.totals["converged"] is True
    (record,) = result.steps[1].audit_records
    assert record["nodes_moved_count"] == 1 and record["nodes_moved"][0]["node"] in captured.err
    # topokeeper's calls only: none of the emulator's setup, nor the replacement the scenario asked for.
    for setup in ("CreateBucket", "CreateTable", "CreateQueue", "CreateCluster", "BatchReplaceClusterNodes"):
        assert setup not in result.totals["aws_calls"]
    assert result.totals["aws_calls"]["SendCommand"] == 2
