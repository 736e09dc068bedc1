"""`make demo`'s story, end to end: emulated AWS, the real functions and applier, and the head node: a real
slurmctld, or (where it cannot run) the file-only stand-in. What Slurm itself does with the topology is
proven by the slurmctld run and tests/integration/slurm only; the stand-in run proves the story is told the
same way without it."""

from __future__ import annotations

from pathlib import Path

import pytest

from topokeeper.cli import main
from topokeeper.sim.head_node import HEAD_NODE_VARIABLE
from topokeeper.sim.simulator import SimulationResult


def _play(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, head_node: str) -> SimulationResult:
    monkeypatch.setenv(HEAD_NODE_VARIABLE, head_node)
    assert main(["demo", "--out", str(tmp_path)]) == 0
    return SimulationResult.model_validate_json((tmp_path / "result.json").read_text())


def _assert_the_story(result: SimulationResult) -> None:
    steps = {step.step: step for step in result.steps}
    assert list(steps) == ["create", "scale", "replace", "delete", "tamper", "wait"]

    create = steps["create"]
    assert create.converged and create.head_node_writes == 1
    assert sorted(r["partition"] for r in create.audit_records) == ["ml-p5", "ml-p6e", "preprocess"]
    assert {r["kind"] for r in create.audit_records} == {"tree", "block", "flat"}

    scale = steps["scale"]  # 8 node events over a minute collapse into one write
    assert (scale.events_sent, scale.reconciles, scale.head_node_writes, scale.converged) == (8, 1, 1, True)
    (grown,) = scale.audit_records
    assert (grown["partition"], grown["nodes_added_count"], grown["node_count"]) == ("ml-p5", 8, 24)
    assert scale.node_latency_seconds is not None and scale.node_latency_seconds.nodes == 8  # launch to live

    replace = steps["replace"]  # same host name, new instance, another UltraServer: the block changes
    (moved,) = replace.audit_records
    assert moved["partition"] == "ml-p6e" and replace.converged and moved["nodes_added_count"] == 0
    blocks = [line for line in replace.live_topology["ml-p6e"].splitlines() if line.startswith("BlockName=")]
    assert len(blocks) == 3  # the replacement sits in an UltraServer of its own

    delete = steps["delete"]
    (shrunk,) = delete.audit_records
    assert (shrunk["nodes_removed_count"], shrunk["node_count"], delete.converged) == (4, 20, True)

    tamper = steps["tamper"]  # the hand edit is live
    assert tamper.converged is False and tamper.live_topology["ml-p5"] != delete.live_topology["ml-p5"]

    wait = steps["wait"]  # the drift schedule finds it, alarms, and repairs it
    assert (wait.drift, wait.alarm_raised, wait.alarm, wait.converged) == (1, True, "OK", True)
    assert [(r["partition"], r["reason"], r["outcome"]) for r in wait.audit_records] == [
        ("ml-p5", "drift-repair", "applied")
    ]
    assert wait.live_topology == delete.live_topology
    assert result.totals["apply_failures"] == 0


@pytest.mark.slurm
def test_the_demo_story_on_a_real_slurmctld(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    result = _play(tmp_path, monkeypatch, "chroot")
    assert result.head_node.startswith("slurmctld 26.05") and result.head_node.endswith("in a Debian chroot")
    _assert_the_story(result)
    printed = capsys.readouterr().out
    assert "UpdatePartitionTopology ml-p5" in printed and "scontrol show topology (ml-p6e):" in printed
    assert "SwitchName=root" in printed and "BlockName=us-" in printed
    assert '{"level"' not in printed  # the story, not the functions' JSON logs
    report = (tmp_path / "report.html").read_text()
    assert report.count('class="mermaid"') == 3 and "drift-repair" in report


def test_the_demo_story_on_the_file_only_head_node(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    result = _play(tmp_path, monkeypatch, "file")
    assert result.head_node == "file-only stand-in for Slurm 26.05 (no slurmctld)"
    _assert_the_story(result)
    captured = capsys.readouterr()
    assert "topokeeper: using a file-only head node (no slurmctld), as requested\n" in captured.err
    assert "UpdatePartitionTopology ml-p5" in captured.out and "scontrol show topology (ml-p6e):" in captured.out
    assert "file-only stand-in for Slurm 26.05 (no slurmctld)" in (tmp_path / "report.html").read_text()
