"""Powered-up CLOUD nodes on a real slurmctld 26.05 (issue 27 item 1): Slurm keeps such a node's dynamic topology
(set by `scontrol update`) over the files across a reconfigure and resets it to its configured one when it
powers down (src/slurmctld/node_mgr.c, power_save.c). The applier re-places them after every reconfigure, so that
live == file whatever path the apply took and whatever the nodes' power state.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.helpers import gb200_nodes, node, p5_nodes
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
    starting with "!") no longer shows it. A read that fails (slurmctld busy re-executing) is asked again."""
    controller.run("scontrol", "update", f"NodeName={names}", f"State={state}", check=True)
    wanted, flag = not until.startswith("!"), until.lstrip("!")
    end = time.monotonic() + timeout
    while True:
        shown = controller.run("scontrol", "-o", "show", "node", names)
        lines = shown.stdout.splitlines() if shown.returncode == 0 else []
        if lines and all((flag in line.split("State=")[1].split()[0]) == wanted for line in lines):
            return
        assert time.monotonic() < end, f"{names} never reached {until}: {shown.stdout}{shown.stderr}"
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
    """Powered up, placed live, powered down and up again, with and without a reconfigure by someone else in
    between: the next apply (the reconcile a resume triggers) ends with them where the file says. p5-007 left the
    partition: the plan places it nowhere."""
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

    # Powered down right away: Slurm puts each back where it was before its first update, off the file. That is
    # not drift while they are down; powered up again it is, until the next apply places them.
    _power(controller, "p5-[003-004,007]", "POWER_DOWN_FORCE", "POWERED_DOWN")
    before_updates = {"p5-003": "nn-leaf000", "p5-004": "nn-leaf001", "p5-007": "nn-leaf001"}
    assert {name: _leaf_of(controller, name) for name in placed} == before_updates
    code, verified = _run(controller, "verify", plan)
    assert (code, verified["outcome"], verified["drift"]) == (0, "in_sync", [])
    assert verified["readback"]["tree-gpu"]["powered_down_elsewhere"] == ["p5-003", "p5-004", "p5-007"]
    assert _run(controller, "apply", plan)[1]["outcome"] == "unchanged"
    _power(controller, "p5-[003-004,007]", "POWER_UP", "!POWERED_DOWN")
    assert _run(controller, "verify", plan)[1]["outcome"] == "drift"  # up and misplaced: jobs would see it
    code, document = _run(controller, "apply", plan)
    assert (document["error"], code, document["outcome"]) == (None, 0, "applied")
    assert {name: _leaf_of(controller, name) for name in placed} == placed

    # A reconfigure by someone else moves nothing; powered down and up again, the next apply ends where the file says.
    controller.run("scontrol", "reconfigure", check=True)
    assert {name: _leaf_of(controller, name) for name in placed} == placed
    _power(controller, "p5-[003-004,007]", "POWER_DOWN_FORCE", "POWERED_DOWN")
    assert _run(controller, "verify", plan)[1]["outcome"] == "in_sync"
    _power(controller, "p5-[003-004,007]", "POWER_UP", "!POWERED_DOWN")
    code, document = _run(controller, "apply", plan)

    assert (document["error"], code, document["outcome"]) == (None, 0, document["outcome"])
    assert document["outcome"] in ("applied", "unchanged")
    assert {name: _leaf_of(controller, name) for name in placed} == placed
    assert _run(controller, "verify", plan)[1]["outcome"] == "in_sync"


def test_a_cloud_node_powered_down_into_the_emptied_no_topology_leaf_is_not_drift(sid_root: Path, controllers) -> None:
    """Powered up and placed live out of no-topology, which the incremental apply empties (Slurm keeps it until a
    reconfigure): powered down, Slurm puts the node back where it was before its first update, into that emptied
    leaf. Verify sets it aside (not drift) and an apply of the same plan changes nothing (no reconfigure)."""
    first = _plan(_cluster(gpu=[node(n.name) if n.name in ("p5-007", "p5-008") else n for n in p5_nodes(8)]))
    controller = controllers(sid_root)
    _start(controller, first, edit_conf=lambda text: text + "SuspendTimeout=2\n")
    assert _run(controller, "apply", _bundle(first))[1]["outcome"] == "applied"
    _power(controller, "p5-[007-008]", "POWER_UP", "!POWERED_DOWN")
    described = _bundle(_plan(_cluster()))
    code, document = _run(controller, "apply", described)
    assert (code, document["outcome"], document["apply_path"]) == (0, "applied", "incremental")

    _power(controller, "p5-008", "POWER_DOWN_FORCE", "POWERED_DOWN")
    assert _leaf_of(controller, "p5-008") == "no-topology"
    code, verified = _run(controller, "verify", described)

    assert (code, verified["outcome"], verified["drift"]) == (0, "in_sync", [])
    code, document = _run(controller, "apply", described)
    assert (document["error"], code, document["outcome"], document["reconfigured"]) == (None, 0, "unchanged", False)
