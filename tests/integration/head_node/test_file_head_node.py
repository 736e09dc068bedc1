"""The file-only head node and its stand-in scontrol, against the planner's own output, with the real applier.

This proves the stand-in serves the applier, the agent and the simulator; it proves nothing about Slurm
(tests/integration/slurm does, and there test_standin_scontrol.py holds the stand-in to the real slurmctld).
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import gb200_nodes, head_node_program, snapshot
from tests.refused_edits import REFUSED_EDITS, load_plan, mixed_cluster
from topokeeper.domain.models import BlockTopology, SlurmVersion, Topology, TreeTopology
from topokeeper.engine.planner import plan
from topokeeper.render.bundle import RenderedPlan, render
from topokeeper.sim import standin_reads, standin_scontrol
from topokeeper.sim.file_head_node import FileHeadNode, _machine_python3
from topokeeper.sim.head_node import HEAD_NODE_VARIABLE, choose_head_node
from topokeeper.sim.slurm_chroot import HarnessError
from topokeeper.wire import content_sha256, parse_show_topology, partition_nodes, sha256_text

HeadNodes = Callable[[RenderedPlan], FileHeadNode]


@pytest.fixture
def head_nodes() -> Iterator[HeadNodes]:
    """Started file-only head nodes with the plan's partitions and no topology yet; removed after the test."""
    started: list[FileHeadNode] = []

    def make(rendered: RenderedPlan) -> FileHeadNode:
        head = FileHeadNode(rendered.plan.slurm_version, "unit")
        started.append(head)
        head.start({partition.partition: partition.nodes for partition in rendered.plan.partitions})
        return head

    yield make
    for head in started:
        head.stop()


def _applier(head: FileHeadNode, mode: str, bundle: dict[str, Any]) -> dict[str, Any]:
    """The real program (the built file) on the head node, as the SSM script and the agent run it."""
    path = head.controller.root / "bundle.json"
    path.write_text(json.dumps(bundle))
    result = head.controller.run("python3", str(head_node_program()), mode, str(path))
    document: dict[str, Any] = json.loads(result.stdout)
    return document


def _expected(topology: Topology) -> dict[str, dict[str, object]]:
    """What ``scontrol show topology`` lists for a planned topology, worked out from the plan alone."""
    if isinstance(topology, BlockTopology):
        size = topology.block_sizes[0]
        return {block.name: {"kind": "block", "nodes": sorted(block.nodes), "size": size} for block in topology.blocks}
    assert isinstance(topology, TreeTopology)
    switches = {switch.name: switch for switch in topology.switches}

    def below(name: str) -> set[str]:
        return set(switches[name].nodes).union(*(below(child) for child in switches[name].switches))

    def level(name: str) -> int:
        children = switches[name].switches
        return 1 + max(level(child) for child in children) if children else 0

    return {
        name: {"kind": "switch", "level": level(name), "nodes": sorted(below(name)), "switches": sorted(s.switches)}
        for name, s in switches.items()
    }


def _answers(head: FileHeadNode) -> dict[str, str]:
    """What the applier reads from scontrol, to compare before and after."""
    commands = [("-a", "-o", "show", "partition"), ("show", "topology"), ("show", "topology", "tree-gpu")]
    return {" ".join(command): head.controller.run("scontrol", *command).stdout for command in commands}


def test_on_26_05_each_partition_shows_its_planned_topology(head_nodes: HeadNodes) -> None:
    rendered = mixed_cluster("26.05")
    head = head_nodes(rendered)

    document = _applier(head, "apply", rendered.bundle.document())

    assert (document["outcome"], document["error"], document["slurm_version"]) == ("applied", None, "26.05.0")
    assert all(entry["matches"] for entry in document["readback"].values())
    live = head.controller.partition_topologies()
    assert live == {**{p.partition: p.assignment for p in rendered.plan.partitions}, "dev": None}
    for partition in rendered.plan.partitions:
        shown = head.controller.show_topology(partition.assignment)
        if partition.assignment is None:
            assert shown == ""  # flat, the cluster default
        else:
            assert parse_show_topology(shown) == _expected(partition.topology)
    listing = head.controller.run("scontrol", "-a", "-o", "show", "partition").stdout
    assert partition_nodes(listing)["gpu"] == [f"p5-{i:03d}" for i in range(1, 9)]
    assert _applier(head, "verify", rendered.bundle.document())["outcome"] == "in_sync"


@pytest.mark.parametrize("partitions", ["mixed", "block-only"])
def test_on_24_11_the_cluster_topology_is_the_plan(head_nodes: HeadNodes, partitions: str) -> None:
    if partitions == "mixed":
        rendered = mixed_cluster("24.11")
    else:
        rendered = render(plan(snapshot({"gb": gb200_nodes(2)}, version="24.11")))
    head = head_nodes(rendered)

    document = _applier(head, "apply", rendered.bundle.document())

    assert (document["outcome"], document["error"], document["slurm_version"]) == ("applied", None, "24.11.0")
    assert rendered.plan.cluster_topology is not None
    assert parse_show_topology(head.controller.show_topology()) == _expected(rendered.plan.cluster_topology)
    assert set(head.controller.partition_topologies().values()) == {None}
    assert _applier(head, "verify", rendered.bundle.document())["outcome"] == "in_sync"


def test_nodes_slurm_conf_no_longer_defines_leave_the_topology(head_nodes: HeadNodes) -> None:
    rendered = mixed_cluster("26.05")
    head = head_nodes(rendered)
    _applier(head, "apply", rendered.bundle.document())
    partitions = {partition.partition: partition.nodes for partition in rendered.plan.partitions}

    head.sync_nodes({**partitions, "gpu": partitions["gpu"][:-1]})  # HyperPod removed p5-008

    tree = parse_show_topology(head.controller.show_topology("tree-gpu"))
    assert tree["nn-leaf002"]["nodes"] == [] and "p5-008" not in tree["root"]["nodes"]
    assert head.controller.partition_topologies()["gpu"] == "tree-gpu"  # sync_nodes keeps Topology=


@pytest.mark.parametrize("version", ["26.05", "24.11"])
def test_reconfigure_refuses_what_slurmctld_refuses_and_keeps_the_loaded_config(
    head_nodes: HeadNodes, version: str
) -> None:
    rendered = mixed_cluster(version)
    head = head_nodes(rendered)
    load_plan(head.controller, rendered)
    loaded = _answers(head)
    assert "SwitchName=nn-leaf000" in loaded["show topology"] + loaded["show topology tree-gpu"]
    for refused in (edit for edit in REFUSED_EDITS if edit.version == version):
        path = head.controller.etc / refused.file
        good = path.read_text()
        path.write_text(refused.edit(good))

        result = head.controller.run("scontrol", "reconfigure")

        reason = refused.reason.format(etc=head.controller.etc)
        assert result.returncode == 1, refused.id
        if reason.startswith("scontrol:"):  # scontrol itself cannot read slurm.conf, for any command
            assert result.stderr.splitlines()[0] == reason, refused.id
            assert head.controller.run("scontrol", "show", "topology").returncode == 1, refused.id
        else:
            assert result.stderr == "slurm_reconfigure error: Unspecified error\n", refused.id
            assert head.controller.log.read_text().splitlines()[-1].endswith(f"] {reason}"), refused.id
        path.write_text(good)
        assert _answers(head) == loaded, refused.id  # nothing reloaded since the refusal: this stayed loaded


def test_the_applier_rolls_back_what_the_stand_in_refuses(head_nodes: HeadNodes) -> None:
    rendered = mixed_cluster("26.05")
    head = head_nodes(rendered)
    _applier(head, "apply", rendered.bundle.document())
    topology = head.controller.etc / "topology.yaml"
    good = topology.read_text()
    # The plan's file with a duplicate block, rehashed: valid by hash, whatever Slurm thinks of it.
    broken = rendered.bundle.document()
    content = good.replace("block: us-0001", "block: us-0000")
    broken["files"]["topology.yaml"] = {"content": content, "sha256": sha256_text(content)}
    broken["plan_sha256"] = content_sha256(
        broken["slurm_format"], broken["topology_plugin"], {"topology.yaml": content}, broken["partitions"]
    )

    document = _applier(head, "apply", broken)

    # The stand-in slurmctld beside scontrol refused it in the applier's proof: nothing was written or reloaded.
    assert (document["outcome"], document["reconfigured"]) == ("rolled_back", False)
    assert "fatal: Block (us-0000) has already been defined" in document["error"]
    assert topology.read_text() == good
    assert _applier(head, "verify", rendered.bundle.document())["outcome"] == "in_sync"


def test_it_answers_the_scenario_version_and_only_what_it_models(head_nodes: HeadNodes) -> None:
    head = head_nodes(mixed_cluster("24.11"))

    def scontrol(*argv: str) -> subprocess.CompletedProcess[str]:
        return head.controller.run("scontrol", *argv)

    assert scontrol("version").stdout == "slurm 24.11\n"
    assert f"SLURM_CONF              = {head.slurm_conf}\n" in scontrol("show", "config").stdout
    for unmodeled in (("ping",), ("show", "partition"), ("show", "jobs"), ("--json", "show", "topology")):
        result = scontrol(*unmodeled)
        assert (result.returncode, result.stdout) == (1, "")
        assert result.stderr == f"scontrol (topokeeper's file-only stand-in): not modeled: {' '.join(unmodeled)}\n"
    assert head.description == "file-only stand-in for Slurm 24.11 (no slurmctld)"


def test_the_world_runs_the_real_head_node_where_it_can_else_the_file_only_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(HEAD_NODE_VARIABLE, raising=False)
    monkeypatch.setattr("topokeeper.sim.head_node.can_run", lambda: (True, ""))
    assert choose_head_node() == ("chroot", "")
    assert choose_head_node("file").kind == "file"

    monkeypatch.setattr("topokeeper.sim.head_node.can_run", lambda: (False, "needs root"))
    assert choose_head_node() == (
        "file",
        "the real head node cannot run here: needs root; using a file-only head node (no slurmctld)",
    )
    with pytest.raises(HarnessError, match="the real head node cannot run here: needs root"):
        choose_head_node("chroot")

    monkeypatch.setenv(HEAD_NODE_VARIABLE, "file")
    monkeypatch.setattr("topokeeper.sim.head_node.can_run", lambda: (True, ""))
    assert choose_head_node().kind == "file"
    monkeypatch.setenv(HEAD_NODE_VARIABLE, "docker")
    with pytest.raises(HarnessError, match="TOPOKEEPER_HEAD_NODE is chroot or file, not 'docker'"):
        choose_head_node()


def test_the_file_only_head_node_keeps_nothing_after_it_stops() -> None:
    head = FileHeadNode(SlurmVersion.parse("26.05"), "unit")
    head.start({"gpu": ["p5-001"]})
    root = head.controller.root
    assert (root / "bin" / "scontrol").exists()
    head.stop()
    assert not root.exists()


def test_the_machines_python3_is_found_through_a_shim_that_prints_first(tmp_path: Path) -> None:
    # A sitecustomize or a chatty shim may print before the interpreter answers: the last line is the answer.
    shim = tmp_path / "python3"
    shim.write_text(f'#!/bin/sh\necho "welcome to this machine"\nexec {sys.executable} "$@"\n')
    shim.chmod(0o755)
    assert _machine_python3(str(tmp_path)) == sys._base_executable  # a virtual environment's: its base interpreter
    talking_only = tmp_path / "elsewhere"
    talking_only.mkdir()
    (talking_only / "python3").write_text("#!/bin/sh\necho /no/such/python3\n")
    (talking_only / "python3").chmod(0o755)
    assert _machine_python3(str(talking_only)) is None


def test_the_head_nodes_python3_sees_the_standard_library_alone_and_stays_itself_when_it_execs() -> None:
    head = FileHeadNode(SlurmVersion.parse("26.05"), "unit")
    head.start({"gpu": ["p5-001"]})
    try:
        probe = (
            "import importlib.util, json, os, sys; print(json.dumps([sys.executable, sys.path,"
            " [m for m in ('yaml', 'botocore', 'certifi') if importlib.util.find_spec(m)]]))"
        )
        executable, path, found = json.loads(head.controller.run("python3", "-c", probe, check=True).stdout)
        assert executable == str(head.controller.root / "bin" / "python3")  # what the bootstrap's execv runs again
        assert found == [] and not any("site-packages" in entry for entry in path), path
        again = head.controller.run(
            "python3", "-c", f"import os, sys; os.execv(sys.executable, [sys.executable, '-c', {probe!r}])", check=True
        )
        assert json.loads(again.stdout)[0] == executable
    finally:
        head.stop()


def test_the_reads_computed_at_load_are_answered_without_the_full_stand_in_and_the_same(head_nodes: HeadNodes) -> None:
    rendered = mixed_cluster("26.05")
    head = head_nodes(rendered)
    state, conf = str(head.controller.root / "state"), str(head.controller.etc / "slurm.conf")
    assert _applier(head, "apply", rendered.bundle.document())["outcome"] == "applied"
    reads = [
        ["version"],
        ["show", "config"],
        ["-a", "-o", "show", "partition"],
        ["-o", "--future", "show", "nodes"],
        ["show", "topology"],
        ["show", "topology", "tree-gpu"],
    ]
    others = [["show", "topology", "no-such-name"], ["show", "partition"], ["ping"]]
    for argv in reads + others:
        answers = []
        for main in (standin_reads.main, standin_scontrol.main):
            stdout, stderr = io.StringIO(), io.StringIO()
            code = main([state, *argv], stdout=stdout, stderr=stderr, slurm_conf=conf)
            answers.append((code, stdout.getvalue(), stderr.getvalue()))
        assert answers[0] == answers[1], argv
    # In its own process (as the applier's scontrol runs it), a read imports neither json nor re nor the stand-in.
    probe = (
        f"import sys; sys.path += {[str(Path(standin_reads.__file__).parents[2])]!r}\n"
        "from topokeeper.sim.standin_reads import main\n"
        f"for argv in {reads!r}: main([{state!r}, *argv], slurm_conf={conf!r})\n"
        "print(sorted(m for m in ('json', 're', 'typing', 'topokeeper.sim.standin_scontrol') if m in sys.modules))"
    )
    result = subprocess.run([sys.executable, "-I", "-S", "-c", probe], capture_output=True, text=True, check=True)
    assert result.stdout.splitlines()[-1] == "[]"
    # slurm.conf changed since the load: the full stand-in reads it again (and refuses what does not parse).
    Path(conf).write_text("PartitionName=broken Nodes=p5-[001\n")
    result = head.controller.run("scontrol", "version")
    assert result.returncode == 1 and "Unable to process configuration file" in result.stderr


def test_a_missing_slurm_conf_stops_every_scontrol_before_and_after_a_load(head_nodes: HeadNodes) -> None:
    """Real scontrol reads slurm.conf first and stops when it is not there, whatever slurmctld loaded."""
    head = head_nodes(mixed_cluster("26.05"))
    loaded, missing = str(head.controller.root / "state"), str(head.controller.root / "no-such" / "slurm.conf")
    unloaded = head.controller.root / "state-before-a-load"
    unloaded.mkdir()
    standin_scontrol.write_state(str(unloaded), slurm_version="26.05.5", slurm_conf=missing, log_file=os.devnull)
    for state in (loaded, str(unloaded)):
        for argv in (["version"], ["show", "config"], ["-o", "show", "nodes"], ["reconfigure"]):
            for main in (standin_reads.main, standin_scontrol.main):
                stderr = io.StringIO()
                code = main([state, *argv], stdout=io.StringIO(), stderr=stderr, slurm_conf=missing)
                assert code == 1 and "Unable to process configuration file" in stderr.getvalue(), (state, main, argv)
