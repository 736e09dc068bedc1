"""The placement figures are Slurm's own answer: on a real slurmctld (26.05 with a tree and a block partition, 24.11
with a tree), with nodes allocated, drained, down and powered down, the largest job ``topokeeper placement`` says
one leaf or block can start now is the largest ``k`` for which ``sbatch --test-only -N k --exclusive`` with
``--switches=1`` (tree) or ``--segment=k`` (block) starts at once on nodes inside one leaf or block. A job placed
across two leaves is reported spread beyond its need, and a job waiting for one leaf as waiting on topology, with
the reason slurmctld gives."""

from __future__ import annotations

import json
import re
import shutil
import time
from pathlib import Path

import pytest

from tests.helpers import head_node_program, node, snapshot
from tests.integration.slurm.test_hostfile_on_slurmctld import _interleaved
from topokeeper.cli.main import main
from topokeeper.contract.head_node_program import PROGRAM_NAME
from topokeeper.engine.planner import plan
from topokeeper.render.bundle import RenderedPlan, render
from topokeeper.sim.slurm_chroot import SlurmController
from topokeeper.wire import expand, parse_show_topology

pytestmark = pytest.mark.slurm
_PLACED = re.compile(r"to start at (\S+) .*?on nodes (\S+) in partition")


def _start(controller: SlurmController, rendered: RenderedPlan) -> None:
    partitions = {p.partition: (p.nodes, p.assignment) for p in rendered.plan.partitions}
    plugin = rendered.plan.topology_plugin
    controller.prepare(rendered.plan.nodes, partitions, [f"TopologyPlugin={plugin}"] if plugin else [])
    controller.write_file(rendered.plan.slurm_format.value, rendered.topology_text)
    controller.start()


def _starts_now_in_one_unit(
    controller: SlurmController, partition: str, ask: str, k: int, units: list[set[str]]
) -> bool:
    """``sbatch --test-only``: would a k-node exclusive job start at once, on nodes of one leaf or block?"""
    before = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(time.time() - 1))
    argv = ["sbatch", "--test-only", "-p", partition, "-N", str(k), "--exclusive", ask, "--wrap", "true"]
    result = controller.run(*argv)
    after = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(time.time() + 1))
    placed = _PLACED.search(result.stderr)
    if placed is None:  # "Requested node configuration is not available": never
        return False
    nodes = set(expand(placed.group(2)))
    return before <= placed.group(1) <= after and any(nodes <= unit for unit in units)


def _topology_text(controller: SlurmController, partition: str) -> str:
    return controller.show_topology(controller.partition_topologies().get(partition))


def _slurms_largest(controller: SlurmController, partition: str) -> int:
    """The largest k that starts now inside one leaf (``--switches=1``) or block (``--segment=k``)."""
    text = _topology_text(controller, partition)
    units = [set(unit["nodes"]) for unit in parse_show_topology(text).values() if unit["nodes"]]
    # The leaves: no other switch inside them (an upper switch lists every node below it). Blocks are all base.
    smallest = [unit for unit in units if not any(other < unit for other in units)]
    started = [
        k
        for k in range(1, max(len(unit) for unit in smallest) + 2)
        if _starts_now_in_one_unit(
            controller, partition, f"--segment={k}" if "BlockName=" in text else "--switches=1", k, smallest
        )
    ]
    return max(started, default=0)


def _placement(controller: SlurmController, tmp_path: Path, *args: str, capsys: pytest.CaptureFixture[str]) -> dict:
    """``topokeeper placement --json`` on what slurmctld prints now."""
    files = {"squeue.json": ("squeue", "--json"), "nodes.json": ("scontrol", "show", "nodes", "--json")}
    for name, argv in files.items():
        (tmp_path / name).write_text(controller.run(*argv, check=True).stdout)
    topology_args = []
    for partition, topology in sorted(controller.partition_topologies().items()):
        if partition != "dev":
            (tmp_path / f"{partition}.txt").write_text(controller.show_topology(topology) + "\n")
            topology_args += ["--topology", f"{topology or 'default'}={tmp_path / partition}.txt"]
    argv = ["placement", "--squeue", str(tmp_path / "squeue.json"), "--nodes", str(tmp_path / "nodes.json")]
    capsys.readouterr()
    assert main([*argv, *topology_args, "--json", *args]) == 0
    return json.loads(capsys.readouterr().out)


def _compact_figures(controller: SlurmController, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> dict:
    """``topokeeper placement --json --facts`` on what the head-node program's ``placement-facts`` printed."""
    shutil.copy(head_node_program(), controller.root / controller.inner_dir.lstrip("/") / PROGRAM_NAME)
    result = controller.run("python3", f"{controller.inner_dir}/{PROGRAM_NAME}", "placement-facts")
    assert (result.returncode, result.stderr) == (0, ""), result.stdout
    assert "wrap" not in result.stdout  # the jobs' names (sbatch --wrap's) are never asked for
    (tmp_path / "facts.json").write_text(result.stdout)
    capsys.readouterr()
    assert main(["placement", "--facts", str(tmp_path / "facts.json"), "--json"]) == 0
    found = {item["partition"]: item for item in json.loads(capsys.readouterr().out)["partitions"]}
    return {name: found[name] for name in ("tree", "block") if name in found}


def _set_state(controller: SlurmController, node_name: str, state: str) -> None:
    controller.run("scontrol", "update", f"nodename={node_name}", f"state={state}", "reason=placement-test", check=True)


def test_largest_placeable_equals_slurms_test_only_answer_on_26_05(
    sid_root: Path, controllers, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    controller = controllers(sid_root)
    _start(controller, _interleaved())  # tree: node i in leaf i % 4 (4 leaves of 4); block: i in block i % 2 (18 each)
    # Spread beyond need: two nodes of two leaves, where one leaf had room for both.
    spread = controller.submit("tree", 2, "--exclusive", "--nodelist=p5-000,p5-001")
    controller.job_nodes(spread)
    for size in (3, 2):
        controller.job_nodes(controller.submit("tree", size, "--exclusive", "--switches=1"))
    controller.job_nodes(controller.submit("block", 10, "--exclusive", "--segment=10"))
    controller.job_nodes(controller.submit("block", 12, "--exclusive", "--segment=12"))
    # Each leaf's last node (p5-012 is leaf 0's, ... p5-015 leaf 3's) drained or down unless a job holds it: no
    # leaf has all four free.
    allocated = set(expand(",".join(controller.run("squeue", "-h", "-o", "%N", check=True).stdout.split())))
    for name, state in (("p5-012", "drain"), ("p5-013", "down"), ("p5-014", "drain"), ("p5-015", "down")):
        if name not in allocated:
            _set_state(controller, name, state)
    _set_state(controller, "gb-035", "drain")
    figures = {item["partition"]: item for item in _placement(controller, tmp_path, capsys=capsys)["partitions"]}
    for partition in ("tree", "block"):
        # Powered-down CLOUD nodes count: Slurm resumes them for the job and starts it at once.
        assert figures[partition]["largest_placeable"] == _slurms_largest(controller, partition), partition
    assert 0 < figures["tree"]["largest_placeable"] < 4 and 0 < figures["block"]["largest_placeable"] < 18
    assert figures["tree"]["largest_placeable_without_resume"] == 0  # no CLOUD node here ever powers up
    assert figures["tree"]["jobs_spread_beyond_need"] == 1
    # The head node's compact facts give the same figures as slurmctld's JSON.
    assert _compact_figures(controller, tmp_path, capsys) == {name: figures[name] for name in ("tree", "block")}
    job = _placement(controller, tmp_path, "--job", spread, capsys=capsys)
    assert (job["spans"], job["fewest"], job["beyond_need"]) == (2, 1, True)

    # A job waiting for one leaf while the partition has the nodes: waiting on topology, with slurmctld's reason.
    waiting = controller.submit("tree", figures["tree"]["largest_placeable"] + 1, "--exclusive", "--switches=1")
    reason = ""
    for _ in range(50):
        reason = controller.run("squeue", "-h", "-j", waiting, "-o", "%T|%r").stdout.strip()
        if reason.startswith("PENDING|") and reason != "PENDING|None":
            break
        time.sleep(0.2)
    job = _placement(controller, tmp_path, "--job", waiting, capsys=capsys)
    assert ("PENDING|" + job["reason"], job["on_topology"]) == (reason, True)


def test_largest_placeable_equals_slurms_test_only_answer_on_24_11(
    trixie_root: Path, controllers, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tree = [
        node(f"p5-{i:03d}", path=("nn-spine", f"nn-agg{i % 4 // 2}", f"nn-leaf{i % 4}"), partition="tree")
        for i in range(16)
    ]
    controller = controllers(trixie_root)
    _start(controller, render(plan(snapshot({"tree": tree}, "24.11"))))
    for size in (3, 3, 2):
        controller.job_nodes(controller.submit("tree", size, "--exclusive", "--switches=1"))
    _set_state(controller, "p5-003", "drain")
    figures = {item["partition"]: item for item in _placement(controller, tmp_path, capsys=capsys)["partitions"]}
    assert figures["tree"]["largest_placeable"] == _slurms_largest(controller, "tree")
    assert 0 < figures["tree"]["largest_placeable"] < 4
    assert _compact_figures(controller, tmp_path, capsys) == {"tree": figures["tree"]}
