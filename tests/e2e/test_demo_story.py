"""`make demo`'s story, end to end: emulated AWS, the real functions and applier, and the head node: a real
slurmctld, or (where it cannot run) the file-only stand-in. What Slurm itself does with the topology is
proven by the slurmctld run and tests/integration/slurm only; the stand-in run proves the story is told the
same way without it."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.readme_examples import blocks, matches_shown
from topokeeper.cli.main import main
from topokeeper.sim.head_node import HEAD_NODE_VARIABLE
from topokeeper.sim.placement_view import NO_SLURMCTLD
from topokeeper.sim.simulator import SimulationResult, StepResult
from topokeeper.wire import expand


def _play(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, head_node: str) -> SimulationResult:
    monkeypatch.setenv(HEAD_NODE_VARIABLE, head_node)
    assert main(["demo", "--out", str(tmp_path)]) == 0
    return SimulationResult.model_validate_json((tmp_path / "result.json").read_text())


DEMO_LINE = "queued (BatchReplaceClusterNodes API call)"  # finds the README's demo output block
HOSTILE_NAME = "eval; $(reboot) <script>alert(1)</script>"  # demo.yaml's last job: a user's name is hostile


def _texts(step: StepResult, kind: str) -> list[str]:
    return [entry["text"] for entry in step.timeline if entry["kind"] == kind]


def _leaf_of(node: str, scontrol_text: str) -> str:
    """The leaf switch (Level=0) whose Nodes= lists ``node`` in ``scontrol show topology`` output."""
    for line in scontrol_text.splitlines():
        fields = dict(token.split("=", 1) for token in line.split() if "=" in token)
        if fields.get("Level") == "0" and node in expand(fields.get("Nodes", "")):
            return fields["SwitchName"]
    raise AssertionError(f"{node} is in no leaf switch")


def _row(table: str, unit: str) -> list[str]:
    """The cells of a timeline leaf table's row for one leaf or block."""
    (row,) = [line.split() for line in table.splitlines()[2:] if line.split()[1:2] == [unit]]
    return row


def _leaf_names(table: str) -> list[str]:
    return [line.split()[1] for line in table.splitlines()[2:]]


def _assert_the_story(result: SimulationResult) -> None:
    steps = {step.step: step for step in result.steps}
    assert list(steps) == ["create", "submit", "scale", "replace", "delete", "tamper", "wait"]

    create = steps["create"]
    assert create.converged and create.head_node_writes == 1
    assert sorted(r["partition"] for r in create.audit_records) == ["ml-p5", "ml-p6e", "preprocess"]
    assert {r["kind"] for r in create.audit_records} == {"tree", "block", "flat"}

    # 8 node events over a minute, 7.5 s apart: never quiet for the debounce. slurmctld 26.05 applies them live
    # (scontrol update): no min_write_interval holds them and the debounce waits at most LIVE_MAX_WAIT_SECONDS
    # (20 s), three writes. The file-only stand-in reconfigures instead; its first result says so, and the rest wait
    # as for reconfigures (max_wait_seconds 30 s): two.
    scale = steps["scale"]
    writes = 2 if result.head_node.startswith("file-only") else 3
    assert (scale.events_sent, scale.reconciles, scale.head_node_writes, scale.converged) == (8, writes, writes, True)
    assert {r["partition"] for r in scale.audit_records} == {"ml-p5"}
    assert sum(r["nodes_added_count"] for r in scale.audit_records) == 8
    assert scale.audit_records[-1]["node_count"] == 24
    assert scale.node_latency_seconds is not None and scale.node_latency_seconds.nodes == 8  # launch to live

    replace = steps["replace"]  # same host name, new instance, another UltraServer: the block changes
    (moved,) = replace.audit_records
    assert moved["partition"] == "ml-p6e" and replace.converged and moved["nodes_added_count"] == 0
    (move,) = moved["nodes_moved"]  # the record names the node and both UltraServers, not "+0/-0"
    assert moved["nodes_moved_count"] == 1 and move["before"] != move["after"]
    assert f"BlockName={move['after']} " in replace.live_topology["ml-p6e"]
    assert f"replaced (new instance) {move['node']}" in _texts(replace, "event")[0]
    blocks = [line for line in replace.live_topology["ml-p6e"].splitlines() if line.startswith("BlockName=")]
    assert len(blocks) == 3  # the replacement sits in an UltraServer of its own
    # After the write, the timeline tables the blocks it changed: the new one and the one the node left.
    (leaves,) = _texts(replace, "leaves")
    assert leaves.startswith("ml-p6e block: 36 nodes in 3 blocks, the largest job in one block 18 nodes\n")
    assert _row(leaves, move["after"]) == ["ml-p6e", move["after"], "1", "new", move["node"]]
    assert _row(leaves, move["before"])[2:4] == ["17", "-1"] and len(leaves.splitlines()) == 4

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
    # The tampered node is named: in the drift line (live leaf, planned leaf) and in the repair's record.
    (repaired,) = wait.audit_records[0]["nodes_moved"]
    node, live_leaf, planned_leaf = repaired["node"], repaired["before"], repaired["after"]
    assert live_leaf and planned_leaf and live_leaf != planned_leaf
    assert _leaf_of(node, tamper.live_topology["ml-p5"]) == live_leaf
    assert _leaf_of(node, wait.live_topology["ml-p5"]) == planned_leaf
    (repair_table,) = _texts(wait, "leaves")  # the leaf the node left live and the one it rejoined
    assert _row(repair_table, live_leaf)[3] == "-1" and _row(repair_table, planned_leaf)[3] == "+1"
    assert node in _row(repair_table, planned_leaf)[4]
    (first_table,) = _texts(create, "leaves")  # the first write: every leaf and block, with its size
    assert "preprocess flat: 4 nodes, no leaf or block" in first_table
    assert sum(int(_row(first_table, leaf)[2]) for leaf in _leaf_names(first_table)) == 16 + 36
    drift_line = _texts(wait, "drift")[0]
    assert f"partition ml-p5: {node} in {live_leaf} live, {planned_leaf} in the plan" in drift_line
    # Every queued scale event names the node that joined and its partition; every write names the file.
    joined = _texts(scale, "event")
    assert len(joined) == 8 and all("partition ml-p5: joined ip-" in text for text in joined)
    assert all("topology.yaml" in text for step in result.steps for text in _texts(step, "apply"))
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
    assert "ml-p5: plan-change applied" in printed and "scontrol show topology (ml-p6e):" in printed
    assert "SwitchName=root" in printed and "BlockName=us-" in printed
    assert '{"level"' not in printed  # the story, not the functions' JSON logs
    report = (tmp_path / "report.html").read_text()
    assert report.count('class="mermaid"') == 3 and "drift-repair" in report
    _assert_where_the_jobs_landed(result, report)


def _largest(step: StepResult) -> dict[str, int]:
    assert step.placement is not None
    return {item["partition"]: item["largest_placeable"] for item in step.placement["partitions"]}


def _assert_where_the_jobs_landed(result: SimulationResult, report: str) -> None:
    """What slurmctld did with demo.yaml's jobs: p5 leaves hold 4 nodes, so three 3-node --switches=1 jobs
    take one leaf each, the 4-node job the last whole leaf, and the last 3-node job waits on topology with 3
    nodes free in 3 leaves; 24 nodes need 2 of the 18-node UltraServers."""
    steps = {step.step: step for step in result.steps}
    assert steps["create"].placement is None  # no job yet
    submitted = steps["submit"].placement
    assert submitted is not None
    jobs = {job["name"]: job for job in submitted["jobs"]}
    assert list(jobs) == ["pretrain-a", "pretrain-b", "pretrain-c", "finetune", "moe", HOSTILE_NAME]
    leaves = [jobs[name]["placed"][0]["unit"] for name in ("pretrain-a", "pretrain-b", "pretrain-c", "finetune")]
    for name in ("pretrain-a", "pretrain-b", "pretrain-c", "finetune"):
        assert (jobs[name]["state"], jobs[name]["spans"], jobs[name]["fewest"]) == ("CONFIGURING", 1, 1), name
    assert len(set(leaves)) == 4  # one leaf each
    assert (jobs["moe"]["spans"], jobs["moe"]["fewest"], jobs["moe"]["beyond_need"]) == (2, 2, False)
    waiting = jobs[HOSTILE_NAME]
    assert (waiting["state"], waiting["on_topology"]) == ("PENDING", True)
    (pending_line,) = [text for text in _texts(steps["submit"], "jobs") if text.startswith(f"job {waiting['job']} ")]
    assert f"'{HOSTILE_NAME}'" in pending_line and "on topology" in pending_line
    # The largest job one leaf (block) can start, before and after the scale-up added two leaves of 4.
    assert _largest(steps["submit"]) == {"ml-p5": 1, "ml-p6e": 12, "preprocess": 0}
    assert _largest(steps["scale"])["ml-p5"] == 4
    assert "ml-p5 4 (was 1)" in _texts(steps["scale"], "placement")[0]
    # The report shows the name as text: escaped, never markup.
    assert HOSTILE_NAME not in report and "eval; $(reboot) &lt;script&gt;alert(1)&lt;/script&gt;" in report
    assert '<h2 id="placement">' in report and "ml-p5: leaves by free nodes (tree)" in report


def test_the_demo_story_on_the_file_only_head_node(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "stderr", sys.stdout)  # the story (stderr) and the step records in one stream
    result = _play(tmp_path, monkeypatch, "file")
    assert result.head_node == "file-only stand-in for Slurm 26.05 (no slurmctld)"
    _assert_the_story(result)
    # No slurmctld: nothing took the jobs, so no step has placement figures, and the timeline says why.
    assert all(step.placement is None for step in result.steps)
    assert _texts(result.steps[1], "jobs") == [NO_SLURMCTLD]
    printed = capsys.readouterr().out
    assert "topokeeper: using a file-only head node (no slurmctld), as requested\n" in printed
    assert "ml-p5: plan-change applied" in printed and "scontrol show topology (ml-p6e):" in printed
    assert "ml-p5: drift-repair applied (tree, 20 nodes); moved 1: " in printed
    assert "[... " in printed and "more characters]" in printed  # long scontrol lines say they are cut
    # The README shows this run's output.
    (shown,) = [block for block in blocks() if block.lang == "" and any(DEMO_LINE in line for line in block.lines)]
    assert matches_shown(shown.lines, printed), f"{shown.where} no longer matches `make demo`"
    # Printed as it plays: each step's record comes before the next step starts.
    order = [printed.index(marker) for marker in ("== create:", "-- step 1:", "== submit:", "-- step 2:", "== scale:")]
    assert order == sorted(order)
    report = (tmp_path / "report.html").read_text()
    assert "file-only stand-in for Slurm 26.05 (no slurmctld)" in report and f"<p>{NO_SLURMCTLD}; " in report
