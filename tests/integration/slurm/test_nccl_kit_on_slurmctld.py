"""The NCCL check kit's sbatch scripts as a real slurmctld 26.05 reads them: ``sbatch --test-only`` accepts each
and would start it on exactly the leaf's or block's nodes the script names. (No GPU here: nothing runs.)"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.integration.slurm.test_hostfile_on_slurmctld import _start
from topokeeper.cli.main import main
from topokeeper.cli.planning import plan_from_files
from topokeeper.sim.slurm_chroot import SlurmController
from topokeeper.wire import expand

SNAPSHOT = Path(__file__).resolve().parents[3] / "examples" / "mixed-cluster.json"
pytestmark = pytest.mark.slurm


def test_each_script_is_accepted_and_placed_on_its_nodes(sid_root: Path, controllers) -> None:
    controller: SlurmController = controllers(sid_root)
    _start(controller, plan_from_files(SNAPSHOT, None, None))
    kit = controller.root / controller.inner_dir.lstrip("/") / "kit"
    # The test nodes have 4 CPUs and no GRES: 4 tasks a node, no GPUs asked.
    assert main(["nccl-check", "--snapshot", str(SNAPSHOT), "--out", str(kit), "--tasks-per-node", "4"]) == 0
    scripts = sorted(kit.glob("*.sbatch"))
    assert len(scripts) == 4 + 1 + 2 + 1  # four leaves, two blocks, a reference in each partition
    for script in scripts:
        named = re.search(r"^#SBATCH --nodelist=(\S+)$", script.read_text(), re.MULTILINE)
        assert named is not None
        result = controller.run("sbatch", "--test-only", f"{controller.inner_dir}/kit/{script.name}")
        placed = re.search(r"to start at .*? using \d+ processors on nodes (\S+) in partition", result.stderr)
        assert placed is not None, f"{script.name}: {result.stderr}"
        assert sorted(expand(placed.group(1))) == sorted(expand(named.group(1)))
