"""`make demo`'s verify-mode story (`topokeeper demo --mode verify`) on a real slurmctld: the emulated HyperPod
writes the topology itself, topokeeper verifies at once on each UpdatePartitionTopology record, agrees with
HyperPod's own names, reports a hand edit and HyperPod's misplaced node with the node named, and never writes."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.readme_examples import blocks, matches_shown
from topokeeper.cli.main import main
from topokeeper.sim.head_node import HEAD_NODE_VARIABLE
from topokeeper.sim.simulator import SimulationResult

pytestmark = pytest.mark.slurm
VERIFY_LINE = "== hyperpod_misplace: t="  # finds the documentation's excerpt of this story


def _texts(step, kind: str) -> list[str]:
    return [entry["text"] for entry in step.timeline if entry["kind"] == kind]


def test_the_verify_mode_story_on_a_real_slurmctld(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(HEAD_NODE_VARIABLE, "chroot")
    assert main(["demo", "--mode", "verify", "--out", str(tmp_path)]) == 0
    result = SimulationResult.model_validate_json((tmp_path / "result.json").read_text())
    steps = {step.step: step for step in result.steps}
    assert list(steps) == ["create", "scale", "tamper", "wait", "hyperpod_misplace"]

    for name in ("create", "scale"):  # HyperPod wrote, topokeeper verified at once and agreed
        step = steps[name]
        assert len(_texts(step, "hyperpod")) == 1 and step.drift == 0
        (verified,) = _texts(step, "verify")
        assert "AGREES with the plan" in verified and "naming difference(s) only" in verified
    assert "ml-p5 tree (12 nodes)" in _texts(steps["scale"], "hyperpod")[0]

    wait = steps["wait"]  # the hand edit: found by the schedule, alarmed, not repaired
    assert (wait.drift, wait.alarm_raised) == (1, True)
    assert wait.live_topology == steps["tamper"].live_topology

    bug = steps["hyperpod_misplace"]
    (verified,) = _texts(bug, "verify")
    assert "DRIFT: the live grouping differs from the plan" in verified and "ml-p5: Topology=tree" in verified

    assert result.totals["head_node_writes"] == 0 and result.totals["audit_records"] == 0
    printed = capsys.readouterr().out
    assert "verify: verified at once after HyperPod's UpdatePartitionTopology" in printed
    assert "hyperpod: HyperPod wrote topology.yaml itself" in printed
    # docs/reference.md shows an excerpt of this run's step records.
    (shown,) = [block for block in blocks() if block.lang == "" and any(VERIFY_LINE in line for line in block.lines)]
    assert matches_shown(shown.lines, printed), f"{shown.where} no longer matches `topokeeper demo --mode verify`"
