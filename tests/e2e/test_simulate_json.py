"""`topokeeper simulate --json`: stdout is one JSON document, the story stays on stderr."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.installed_command import block_buffered_environment, run_installed
from topokeeper.cli.main import main
from topokeeper.sim.head_node import HEAD_NODE_VARIABLE
from topokeeper.sim.simulator import SimulationResult

# The report tests' input: `make demo`'s scenario on the real slurmctld, regenerated with
#   TOPOKEEPER_HEAD_NODE=chroot .venv/bin/topokeeper simulate --scenario REGENERATE --out /tmp/demo-fixture
#   cp /tmp/demo-fixture/result.json tests/fixtures/sim-result-demo.json
FIXTURE = Path(__file__).parents[1] / "fixtures" / "sim-result-demo.json"
REGENERATE = "layers/core/python/topokeeper/sim/scenarios/demo.yaml"
# Maps keyed by data (operations, partitions, node names), not by field: their keys are not compared.
DATA_KEYED = {"aws_calls", "live_topology", "node_latencies", "mermaid", "targets"}

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
    # The report fixture has every field a result has now, or the report tests read a result of the past.
    missing = _field_paths(document["result"]) - _field_paths(json.loads(FIXTURE.read_text()))
    assert not missing, f"{FIXTURE.name} lacks {sorted(missing)}: regenerate it from {REGENERATE} (see above)"


def _field_paths(value: object, path: str = "") -> set[str]:
    """Every key path in a JSON document (list items merged as ``[]``)."""
    if isinstance(value, list):
        return {found for item in value for found in _field_paths(item, f"{path}[]")}
    if not isinstance(value, dict):
        return set()
    paths = set()
    for key, item in value.items():
        paths.add(f"{path}.{key}")
        if key not in DATA_KEYED:
            paths |= _field_paths(item, f"{path}.{key}")
    return paths


def test_simulate_through_the_command_ends_with_everything_written_and_nothing_left(tmp_path: Path) -> None:
    """The installed command ends a simulation without the interpreter's teardown (topokeeper.cli.main.run): its output
    is whole through a pipe (block-buffered), its files written, its temporary directories gone."""
    scenario = tmp_path / "tiny.yaml"
    scenario.write_text(SCENARIO)
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    environment = block_buffered_environment(**{HEAD_NODE_VARIABLE: "file", "TMPDIR": str(scratch)})
    ran = run_installed(
        "simulate", "--scenario", str(scenario), "--out", str(tmp_path / "out"), "--json", environment=environment
    )
    assert ran.returncode == 0, ran.stderr[-2000:]
    written = json.loads(ran.stdout)["written"]
    assert [Path(path).name for path in written] == ["result.json", "report.html"]
    assert all(Path(path).stat().st_size > 0 for path in written)
    assert list(scratch.iterdir()) == []
