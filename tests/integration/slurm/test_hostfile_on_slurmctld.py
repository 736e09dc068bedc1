"""``topokeeper-head-node.pyz hostfile`` inside a job's environment, against what a real slurmctld 26.05 allocated:
each leaf (tree) or block (block topology) of the job's nodes comes out contiguous, and every allocated node once."""

from __future__ import annotations

import shutil
from itertools import groupby
from pathlib import Path

import pytest

from tests.helpers import head_node_program, node, snapshot
from topokeeper.cli.main import main as cli_main
from topokeeper.contract.head_node_program import PROGRAM_NAME
from topokeeper.domain.models import BlockTopology, TreeTopology
from topokeeper.engine.planner import plan
from topokeeper.render.bundle import RenderedPlan, render
from topokeeper.sim.slurm_chroot import SlurmController
from topokeeper.wire import expand

pytestmark = pytest.mark.slurm


def _hostfile(controller: SlurmController, job_nodes: str, partition: str, *args: str) -> list[str]:
    """Run the program as a job step would: SLURM_JOB_NODELIST and SLURM_JOB_PARTITION set, scontrol on PATH."""
    shutil.copy(head_node_program(), controller.root / controller.inner_dir.lstrip("/") / PROGRAM_NAME)
    program = f"{controller.inner_dir}/{PROGRAM_NAME}"
    job = [f"SLURM_JOB_NODELIST={job_nodes}", f"SLURM_JOB_PARTITION={partition}"]
    result = controller.run("env", *job, "python3", program, "hostfile", *args)
    assert (result.returncode, result.stderr) == (0, "")
    return result.stdout.splitlines()


def _runs(hosts: list[str], groups: list[set[str]]) -> list[int]:
    """The group index of each run of consecutive hosts: a group appears once when it is contiguous."""
    index = {host: number for number, group in enumerate(groups) for host in group}
    return [number for number, _ in groupby(index[host] for host in hosts)]


def _interleaved() -> RenderedPlan:
    """EC2 names are not in network order: node i sits in leaf i % 4 (tree) or ultraserver i % 2 (block)."""
    tree = [
        node(f"p5-{i:03d}", path=("nn-spine", f"nn-agg{i % 4 // 2}", f"nn-leaf{i % 4}"), partition="tree")
        for i in range(16)
    ]
    block = [
        node(
            f"gb-{i:03d}",
            "p6e-gb200.36xlarge",
            ("nn-gbspine", f"nn-gbagg{i % 2}", f"nn-gbleaf{i % 2}"),
            f"us-{i % 2}",
            "block",
        )
        for i in range(36)
    ]
    return render(plan(snapshot({"tree": tree, "block": block})))


def _start(controller: SlurmController, rendered: RenderedPlan) -> None:
    partitions = {p.partition: (p.nodes, p.assignment) for p in rendered.plan.partitions}
    controller.prepare(rendered.plan.nodes, partitions, [])
    controller.write_file(rendered.plan.slurm_format.value, rendered.topology_text)
    controller.start()


def test_hostfile_keeps_leaves_and_blocks_of_a_real_allocation_contiguous(
    sid_root: Path, controllers, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rendered = _interleaved()
    controller = controllers(sid_root)
    _start(controller, rendered)
    by_partition = {p.partition: p.topology for p in rendered.plan.partitions}

    tree = by_partition["tree"]
    assert isinstance(tree, TreeTopology)
    leaves = [set(switch.nodes) for switch in tree.switches if switch.nodes]
    allocated = controller.job_nodes(controller.submit("tree", 10))
    hosts = _hostfile(controller, allocated, "tree")
    assert sorted(hosts) == sorted(expand(allocated))
    runs = _runs(hosts, leaves)
    assert len(runs) == len(set(runs)) >= 3  # 10 nodes in leaves of 4: three leaves at least, each in one run
    # The hostlist's own order splits leaves: the order is the program's work, not the names'.
    assert len(_runs(expand(allocated), leaves)) > len(runs)
    # Offline, from the saved `scontrol show topology` output: the same order.
    saved = tmp_path / "topology.txt"
    saved.write_text(controller.show_topology("tree-tree") + "\n")
    assert cli_main(["hostfile", allocated, "--topology-file", str(saved)]) == 0
    assert capsys.readouterr().out.splitlines() == hosts

    blocks = by_partition["block"]
    assert isinstance(blocks, BlockTopology)
    block_sets = [set(block.nodes) for block in blocks.blocks]
    allocated = controller.job_nodes(controller.submit("block", 36))
    rank_map = _hostfile(controller, allocated, "block", "--format", "rankmap")
    ranks = [line.split(" ") for line in rank_map]
    assert [int(rank) for rank, _, _ in ranks] == list(range(36))
    hosts = [host for _, host, _ in ranks]
    assert sorted(hosts) == sorted(expand(allocated))
    runs = _runs(hosts, block_sets)
    assert len(runs) == len(set(runs)) == 2
    assert len(_runs(expand(allocated), block_sets)) == 36
    assert {unit for _, _, unit in ranks} == {block.name for block in blocks.blocks}


def test_hostfile_names_an_unknown_partition_and_unknown_nodes(sid_root: Path, controllers) -> None:
    rendered = _interleaved()
    controller = controllers(sid_root)
    _start(controller, rendered)
    shutil.copy(head_node_program(), controller.root / controller.inner_dir.lstrip("/") / PROGRAM_NAME)
    program = f"{controller.inner_dir}/{PROGRAM_NAME}"
    node = next(p.nodes[0] for p in rendered.plan.partitions if p.partition == "tree")
    cases = {
        ("--partition", "nope"): "partition 'nope' is not known to slurmctld",
        ("--topology", "nope"): "scontrol show topology nope: ",
        ("--partition", "block"): f"1 node(s) of the node list are in no leaf or block of the topology: '{node}'",
    }
    for args, message in cases.items():
        result = controller.run("python3", program, "hostfile", node, *args)
        assert result.returncode == 2, result.stdout
        assert result.stderr.startswith(f"topokeeper hostfile: error: {message}"), result.stderr
        assert result.stderr.count("\n") == 1
