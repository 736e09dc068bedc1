"""The file-only head node's stand-in scontrol held to the real slurmctld: same files, same answers.

It keeps the stand-in honest (what the demo shows where slurmctld cannot run); it proves nothing about Slurm
that the other tests here do not.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.refused_edits import REFUSED_EDITS, load_plan, mixed_cluster
from topokeeper.render.bundle import RenderedPlan
from topokeeper.sim.file_head_node import FileHeadNode
from topokeeper.sim.head_node import HeadNodeController
from topokeeper.sim.slurm_chroot import SlurmController

pytestmark = pytest.mark.slurm

# Every name kind scontrol show topology is asked for: none, the planned topologies, unknown, switch, node, block.
NAMES = [None, "tree-gpu", "block-gb", "flat-default", "nosuch", "nn-leaf000", "p5-001", "us-0000"]


@pytest.fixture
def stand_ins() -> Iterator[Callable[[RenderedPlan], FileHeadNode]]:
    started: list[FileHeadNode] = []

    def make(rendered: RenderedPlan) -> FileHeadNode:
        head = FileHeadNode(rendered.plan.slurm_version, "fidelity")
        started.append(head)
        head.start({partition.partition: partition.nodes for partition in rendered.plan.partitions})
        return head

    yield make
    for head in started:
        head.stop()


def _answers(controller: HeadNodeController) -> dict[str, object]:
    """What the applier and the simulator read: each topology as shown, partitions' Topology= and nodes."""
    answers: dict[str, object] = {f"topology {name}": controller.show_topology(name) for name in NAMES}
    answers["partitions"] = controller.partition_topologies()
    nodes = controller.run("scontrol", "-o", "--future", "show", "nodes").stdout
    answers["nodes"] = sorted(re.findall(r"^NodeName=(\S+)", nodes, re.MULTILINE))
    return answers


def _reason(result_stderr: str, log: Path, offset: int, etc: str) -> str:
    """Why reconfigure was refused: the last fatal line slurmctld logged, else scontrol's own first error."""
    logged = [re.sub(r"^\[[^\]]*\] ", "", line) for line in log.read_text()[offset:].splitlines()]
    fatal = [line for line in logged if line.startswith("fatal:")]
    reason = fatal[-1] if fatal else result_stderr.splitlines()[0]
    return reason.replace(etc, "{etc}")


@pytest.mark.parametrize("version", ["26.05", "24.11"])
def test_the_stand_in_answers_and_refuses_as_slurmctld_does(
    version: str, sid_root: Path, trixie_root: Path, controllers, stand_ins
) -> None:
    rendered = mixed_cluster(version)
    real: SlurmController = controllers(sid_root if version == "26.05" else trixie_root)
    real.prepare(rendered.plan.nodes, {p.partition: (p.nodes, None) for p in rendered.plan.partitions})
    real.start()
    stand_in = stand_ins(rendered)
    for controller in (real, stand_in.controller):
        load_plan(controller, rendered)
    assert _answers(stand_in.controller) == _answers(real)

    # HyperPod takes a node out of slurm.conf before the applier next runs.
    fewer = {p.partition: ([n for n in p.nodes if n != "p5-008"], p.assignment) for p in rendered.plan.partitions}
    for controller in (real, stand_in.controller):
        text = (controller.etc / "slurm.conf").read_text()
        plugin = re.findall(r"^TopologyPlugin=\S+$", text, re.MULTILINE)
        controller.write_slurm_conf([n for n in rendered.plan.nodes if n != "p5-008"], fewer, plugin)
        controller.run("scontrol", "reconfigure", check=True)
    assert _answers(stand_in.controller) == _answers(real)
    loaded = _answers(real)

    for refused in (edit for edit in REFUSED_EDITS if edit.version == version):
        reasons = []
        for controller, log, etc in (
            (real, real.log, f"{real.inner_dir}/etc"),
            (stand_in.controller, stand_in.controller.log, str(stand_in.controller.etc)),
        ):
            path = controller.etc / refused.file
            good = path.read_text()
            path.write_text(refused.edit(good))
            offset = len(log.read_text())
            result = controller.run("scontrol", "reconfigure")
            assert result.returncode == 1, refused.id
            reasons.append(_reason(result.stderr, log, offset, etc))
            path.write_text(good)
        assert reasons == [refused.reason, refused.reason], refused.id
        assert _answers(stand_in.controller) == _answers(real) == loaded, refused.id
