"""Powered-up CLOUD nodes on a real slurmctld 26.05 (issue 27 item 1): Slurm keeps such a node's dynamic topology
(set by `scontrol update`) over the files across a reconfigure and resets it to its configured one when it
powers down (src/slurmctld/node_mgr.c, power_save.c). The applier re-places them after every reconfigure, so that
live == file whatever path the apply took and whatever the nodes' power state.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.helpers import gb200_nodes
from tests.integration.slurm.test_applier_incremental_on_slurmctld import _gpu
from tests.integration.slurm.test_applier_on_slurmctld import _bundle, _cluster, _plan, _run, _start
from topokeeper.sim.slurm_chroot import SlurmController
from topokeeper.wire import parse_show_topology

pytestmark = pytest.mark.slurm

_MOVED = ("nn-spine0", "nn-agg0", "nn-leaf001")


def _node_line(controller: SlurmController, name: str) -> str:
    return controller.run("scontrol", "-o", "show", "node", name, check=True).stdout


def _power(controller: SlurmController, names: str, state: str, until: str, timeout: float = 120) -> None:
    """Ask slurmctld to power ``names`` up or down, and wait until each one's State= shows ``until`` or (``until``
    starting with "!") no longer shows it."""
    controller.run("scontrol", "update", f"NodeName={names}", f"State={state}", check=True)
    wanted, flag = not until.startswith("!"), until.lstrip("!")
    end = time.monotonic() + timeout
    while True:
        lines = controller.run("scontrol", "-o", "show", "node", names, check=True).stdout.splitlines()
        if all((flag in line.split("State=")[1].split()[0]) == wanted for line in lines):
            return
        assert time.monotonic() < end, f"{names} never reached {until}: {lines}"
        time.sleep(0.5)


def _leaf_of(controller: SlurmController, name: str) -> str | None:
    live = parse_show_topology(controller.show_topology("tree-gpu"))
    return next((leaf for leaf, unit in live.items() if unit["level"] == 0 and name in unit["nodes"]), None)


def test_whole_file_apply_re_places_a_powered_up_cloud_node_that_keeps_its_dynamic_topology(
    sid_root: Path, controllers
) -> None:
    first, three_blocks = _plan(_cluster()), _plan(_cluster(gb=gb200_nodes(3)))
    controller = controllers(sid_root)
    _start(controller, three_blocks)
    assert _run(controller, "apply", _bundle(first))[1]["outcome"] == "applied"
    _power(controller, "p5-003", "POWER_UP", "!POWERED_DOWN")
    moved = _bundle(_plan(_cluster(gpu=_gpu(**{"p5-003": _MOVED}))))
    code, document = _run(controller, "apply", moved)
    assert (code, document["outcome"], document["apply_path"]) == (0, "applied", "incremental")
    assert "Topology=tree-gpu:root:nn-spine0:nn-agg0:nn-leaf001" in _node_line(controller, "p5-003").split()

    # A new block needs a reconfigure; the plan puts p5-003 back on its first leaf. Slurm keeps it on nn-leaf001.
    code, document = _run(controller, "apply", _bundle(three_blocks))

    assert (document["error"], code, document["outcome"], document["apply_path"]) == (None, 0, "applied", "whole_file")
    assert (document["reconfigured"], document["nodes_updated"]) == (True, 1)
    assert _leaf_of(controller, "p5-003") == "nn-leaf000"
    assert _run(controller, "verify", _bundle(three_blocks))[1]["outcome"] == "in_sync"


def test_cloud_nodes_powered_down_and_up_again_end_where_the_file_says(sid_root: Path, controllers) -> None:
    """Powered up, placed live, a reconfigure by someone else, powered down (Slurm puts them back where they were
    before their first update: not drift while they are down), powered up again: the next apply (the reconcile a
    resume triggers) ends with them where the file says. p5-007 left the partition: the plan places it nowhere."""
    first = _plan(_cluster())
    controller = controllers(sid_root)
    _start(controller, first, edit_conf=lambda text: text + "SuspendTimeout=2\n")
    assert _run(controller, "apply", _bundle(first))[1]["outcome"] == "applied"
    _power(controller, "p5-[003-004,007]", "POWER_UP", "!POWERED_DOWN")
    swapped = _gpu(**{"p5-003": _MOVED, "p5-004": ("nn-spine0", "nn-agg0", "nn-leaf000")})
    plan = _bundle(_plan(_cluster(gpu=[n for n in swapped if n.name != "p5-007"])))
    code, document = _run(controller, "apply", plan)
    assert (code, document["outcome"], document["apply_path"], document["nodes_updated"]) == (
        0,
        "applied",
        "incremental",
        3,
    )
    placed = {"p5-003": "nn-leaf001", "p5-004": "nn-leaf000", "p5-007": None}

    for reconfigured in (False, True):
        if reconfigured:
            controller.run("scontrol", "reconfigure", check=True)  # someone else's: nothing moves
            assert {name: _leaf_of(controller, name) for name in placed} == placed
        _power(controller, "p5-[003-004,007]", "POWER_DOWN_FORCE", "POWERED_DOWN")
        down = {name: _leaf_of(controller, name) for name in placed}
        code, verified = _run(controller, "verify", plan)
        print("DBG", reconfigured, down, verified["outcome"], verified["drift"], verified["readback"]["tree-gpu"])
        print("DBG", _node_line(controller, "p5-003"))
        applied = _run(controller, "apply", plan)[1]
        print("DBG", applied["outcome"], applied["error"])

        _power(controller, "p5-[003-004,007]", "POWER_UP", "!POWERED_DOWN")
        print("DBG", _run(controller, "verify", plan)[1]["outcome"])
        code, document = _run(controller, "apply", plan)

        assert (document["error"], code, document["outcome"]) == (None, 0, "applied")
        assert {name: _leaf_of(controller, name) for name in placed} == placed
        assert _run(controller, "verify", plan)[1]["outcome"] == "in_sync"
