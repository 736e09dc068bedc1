"""Incremental applies on a real slurmctld: live node updates instead of a reconfigure (issue 27 item 1).

26.05 (sid) and 25.11 (built; ParallelCluster's series): a move between existing leaves, a new leaf under a new
intermediate switch, nodes joining an existing block, a leaf whose last nodes leave (kept live, empty) are each
loaded with `scontrol update NodeName=.. Topology=..` (slurmctld logs no reconfigure) and verify reads in_sync; a
later `scontrol reconfigure` changes nothing but drop the emptied leaf. A new block
needs a reconfigure, and so does an update slurmctld refuses or a read-back that differs after the updates. 24.11
(trixie, topology.conf) keeps the whole-file path.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.helpers import gb200_nodes, node, p5_nodes
from tests.integration.slurm.test_applier_on_slurmctld import _bundle, _cluster, _plan, _run, _start
from topokeeper.domain.models import Node
from topokeeper.sim.slurm_chroot import SlurmController, installed_slurm_series
from topokeeper.wire import parse_show_topology

pytestmark = pytest.mark.slurm


def _gpu(**paths: tuple[str, ...]) -> list[Node]:
    """The 8 p5 nodes, some on other paths."""
    return [node(n.name, path=paths[n.name]) if n.name in paths else n for n in p5_nodes(8)]


def _live(controller: SlurmController) -> dict[str, Any]:
    return {name: parse_show_topology(controller.show_topology(name)) for name in ("tree-gpu", "block-gb")}


def _reconfigures(controller: SlurmController) -> int:
    """The reconfigures slurmctld has logged (its pidfile names the old process for a moment after one)."""
    return controller.log_text().count("Attempting to reconfigure")


def _assert_incremental(controller: SlurmController, bundle: dict[str, Any], updated: int) -> None:
    reconfigures = _reconfigures(controller)
    code, document = _run(controller, "apply", bundle)
    assert (code, document["outcome"], document["error"]) == (0, "applied", None)
    assert (document["apply_path"], document["nodes_updated"], document["whole_file_reason"]) == (
        "incremental",
        updated,
        None,
    )
    assert (document["reconfigured"], document["reconfigure_exit_code"]) == (False, None)
    assert document["after_sha256"] == document["plan_sha256"] and document["drift"] == []
    assert _reconfigures(controller) == reconfigures  # the same slurmctld, never re-executed
    code, verified = _run(controller, "verify", bundle)
    assert (code, verified["outcome"], verified["drift"]) == (0, "in_sync", [])


def test_moves_new_switches_and_block_joins_are_applied_live_and_survive_a_reconfigure(
    yaml_root: Path, controllers
) -> None:
    version = installed_slurm_series(yaml_root)  # 26.05 and 25.11 (ParallelCluster's): both update nodes live
    gb = gb200_nodes(2)
    first = _plan(_cluster(gb=gb[:16] + gb[18:34]), version=version)  # 4 gb nodes known to slurmctld, in no block yet
    controller = controllers(yaml_root)
    _start(controller, first, nodes=[*first.plan.nodes, *(n.name for n in gb[16:18] + gb[34:])])
    code, document = _run(controller, "apply", _bundle(first))
    assert (code, document["apply_path"], document["whole_file_reason"]) == (0, "whole_file", "slurm.conf changes too")

    moved = _gpu(**{"p5-003": ("nn-spine0", "nn-agg0", "nn-leaf001")})
    _assert_incremental(controller, _bundle(_plan(_cluster(gpu=moved, gb=gb[:16] + gb[18:34]), version=version)), 1)
    assert parse_show_topology(controller.show_topology("tree-gpu"))["nn-leaf001"]["nodes"] == [
        "p5-003",
        "p5-004",
        "p5-005",
        "p5-006",
        "p5-007",
    ]

    new_leaf = _gpu(**{"p5-003": ("nn-spine0", "nn-agg0", "nn-leaf001"), "p5-007": ("nn-spine0", "nn-agg2", "nn-l9")})
    _assert_incremental(controller, _bundle(_plan(_cluster(gpu=new_leaf, gb=gb[:16] + gb[18:34]), version=version)), 1)
    assert parse_show_topology(controller.show_topology("tree-gpu"))["nn-l9"]["nodes"] == ["p5-007"]

    joined = _bundle(_plan(_cluster(gpu=new_leaf, gb=gb), version=version))
    _assert_incremental(controller, joined, 4)

    final = _bundle(_plan(_cluster(gpu=[n for n in new_leaf if n.name != "p5-006"], gb=gb), version=version))
    _assert_incremental(controller, final, 1)  # out of every topology: Topology= with no value
    live_gpu = parse_show_topology(controller.show_topology("tree-gpu"))
    assert "p5-006" not in {name for unit in live_gpu.values() for name in unit["nodes"]}
    assert live_gpu["nn-leaf001"]["nodes"] == ["p5-003", "p5-004", "p5-005"]

    live, reconfigures = _live(controller), _reconfigures(controller)
    controller.run("scontrol", "reconfigure", check=True)
    assert _reconfigures(controller) == reconfigures + 1
    assert _live(controller) == live  # the files say what the updates did
    code, verified = _run(controller, "verify", final)
    assert (code, verified["outcome"]) == (0, "in_sync")


def test_a_leaf_emptied_by_the_updates_is_applied_live_and_dropped_by_a_later_reconfigure(
    yaml_root: Path, controllers
) -> None:
    """The no-topology placeholder loses its last nodes (EC2 described them): live, no reconfigure. Slurm deletes no
    switch at run time: the leaf stays, empty, until a reconfigure by someone else reads the file without it; a node
    undescribed again goes back to it live."""
    version = installed_slurm_series(yaml_root)
    undescribed = [node(n.name) if n.name in ("p5-007", "p5-008") else n for n in p5_nodes(8)]
    first = _plan(_cluster(gpu=undescribed), version=version)
    controller = controllers(yaml_root)
    _start(controller, first)
    assert _run(controller, "apply", _bundle(first))[1]["outcome"] == "applied"
    assert parse_show_topology(controller.show_topology("tree-gpu"))["no-topology"]["nodes"] == ["p5-007", "p5-008"]

    described = _bundle(_plan(_cluster(), version=version))
    _assert_incremental(controller, described, 2)
    live = parse_show_topology(controller.show_topology("tree-gpu"))
    assert live["no-topology"] == {"kind": "switch", "level": 0, "nodes": [], "switches": []}
    assert "no-topology" in live["root"]["switches"]

    controller.run("scontrol", "reconfigure", check=True)
    live = parse_show_topology(controller.show_topology("tree-gpu"))
    assert "no-topology" not in live and "no-topology" not in live["root"]["switches"]
    code, verified = _run(controller, "verify", described)
    assert (code, verified["outcome"], verified["readback"]["tree-gpu"]["matches"]) == (0, "in_sync", True)

    again = [node("p5-008") if n.name == "p5-008" else n for n in p5_nodes(8)]
    _assert_incremental(controller, _bundle(_plan(_cluster(gpu=again), version=version)), 1)
    assert parse_show_topology(controller.show_topology("tree-gpu"))["no-topology"]["nodes"] == ["p5-008"]


def test_a_new_block_is_loaded_by_reconfigure(sid_root: Path, controllers) -> None:
    first, second = _plan(_cluster()), _plan(_cluster(gb=gb200_nodes(3)))
    controller = controllers(sid_root)
    _start(controller, second)  # slurmctld knows the third UltraServer's nodes
    assert _run(controller, "apply", _bundle(first))[1]["outcome"] == "applied"
    reconfigures = _reconfigures(controller)

    code, document = _run(controller, "apply", _bundle(second))

    assert (code, document["outcome"], document["apply_path"], document["nodes_updated"]) == (
        0,
        "applied",
        "whole_file",
        0,
    )
    assert document["whole_file_reason"] == "topology block-gb adds, removes or reorders blocks"
    assert document["reconfigured"] and document["reconfigure_exit_code"] == 0
    assert _reconfigures(controller) == reconfigures + 1
    assert "us-0002" in parse_show_topology(controller.show_topology("block-gb"))


def test_topology_conf_on_24_11_keeps_the_whole_file_path(trixie_root: Path, controllers) -> None:
    first = _plan(_cluster(), version="24.11")
    moved = _plan(_cluster(gpu=_gpu(**{"p5-003": ("nn-spine0", "nn-agg0", "nn-leaf001")})), version="24.11")
    controller = controllers(trixie_root)
    _start(controller, first)
    assert _run(controller, "apply", _bundle(first))[1]["outcome"] == "applied"

    code, document = _run(controller, "apply", _bundle(moved))

    assert (code, document["outcome"], document["apply_path"], document["reconfigured"]) == (
        0,
        "applied",
        "whole_file",
        True,
    )
    assert document["whole_file_reason"] == "topology.conf is loaded by reconfigure only"
    assert "p5-003" in parse_show_topology(controller.show_topology("nn-leaf001"))["nn-leaf001"]["nodes"]


def test_a_refused_update_or_a_differing_read_back_falls_back_to_reconfigure(yaml_root: Path, controllers) -> None:
    """The old file on disk is what the updates start from; a hand edit never loaded makes them wrong."""
    version = installed_slurm_series(yaml_root)
    first = _plan(_cluster(), version=version)
    three_blocks = _plan(_cluster(gb=gb200_nodes(3)), version=version)
    controller = controllers(yaml_root)
    _start(controller, three_blocks)
    assert _run(controller, "apply", _bundle(first))[1]["outcome"] == "applied"
    topology = controller.etc / "topology.yaml"
    # Not loaded: slurmctld has no block us-0002, so placing gb-037.. there is refused.
    topology.write_text(topology.read_text().replace("- topology: tree-gpu", _US_0002 + "- topology: tree-gpu"))
    reconfigures = _reconfigures(controller)

    code, document = _run(controller, "apply", _bundle(three_blocks))

    assert (code, document["outcome"], document["apply_path"], document["reconfigured"]) == (
        0,
        "applied",
        "whole_file",
        True,
    )
    assert document["whole_file_reason"].startswith("scontrol update NodeName=gb-[038-054] Topology=block-gb:us-0002: ")
    assert _reconfigures(controller) == reconfigures + 1
    assert _run(controller, "verify", _bundle(three_blocks))[1]["outcome"] == "in_sync"

    # Not loaded: the file says p5-003 moved already, so the updates move p5-004 only and the read-back differs.
    both = _gpu(**{"p5-003": ("nn-spine0", "nn-agg0", "nn-leaf001"), "p5-004": ("nn-spine0", "nn-agg0", "nn-leaf000")})
    topology.write_text(
        topology.read_text()
        .replace("nodes: p5-[001-003]", "nodes: p5-[001-002]")
        .replace("p5-[004-007]", "p5-[003-007]")
    )
    reconfigures = _reconfigures(controller)
    code, document = _run(controller, "apply", _bundle(_plan(_cluster(gpu=both, gb=gb200_nodes(3)), version=version)))

    assert (code, document["outcome"], document["apply_path"], document["nodes_updated"]) == (
        0,
        "applied",
        "whole_file",
        1,
    )
    assert document["whole_file_reason"].startswith("after 1 live update(s) slurmctld differs from the plan")
    assert _reconfigures(controller) == reconfigures + 1
    live = parse_show_topology(controller.show_topology("tree-gpu"))
    assert (live["nn-leaf000"]["nodes"], live["nn-leaf001"]["nodes"]) == (
        ["p5-001", "p5-002", "p5-004"],
        ["p5-003", "p5-005", "p5-006", "p5-007"],
    )


_US_0002 = "      - block: us-0002\n        nodes: gb-037\n"


def test_a_switch_emptied_live_and_named_again_under_another_parent_is_left_to_a_reconfigure(
    sid_root: Path, controllers
) -> None:
    """nn-leaf002 (under nn-agg1) is emptied live and leaves the file; slurmctld keeps it. A later plan names
    nn-leaf002 again under nn-agg0: `scontrol update` finds a switch by its name wherever it is
    (topology_tree.c), so the update would put p5-008 under nn-agg1. Only a reconfigure re-parents it, and the
    applier takes that path before any update misplaces a node."""
    controller = controllers(sid_root)
    first = _plan(_cluster())
    _start(controller, first)
    assert _run(controller, "apply", _bundle(first))[1]["outcome"] == "applied"
    _assert_incremental(controller, _bundle(_plan(_cluster(gpu=_gpu(**{"p5-008": _LEAF1})))), 1)
    assert parse_show_topology(controller.show_topology("tree-gpu"))["nn-agg1"]["switches"] == ["nn-leaf002"]

    again = _bundle(_plan(_cluster(gpu=_gpu(**{"p5-008": ("nn-spine0", "nn-agg0", "nn-leaf002")}))))
    code, document = _run(controller, "apply", again)

    assert (document["error"], code, document["outcome"], document["apply_path"]) == (None, 0, "applied", "whole_file")
    assert document["nodes_updated"] == 0, document["whole_file_reason"]
    assert "nn-leaf002" in document["whole_file_reason"]
    assert _run(controller, "verify", again)[1]["outcome"] == "in_sync"


_LEAF1 = ("nn-spine0", "nn-agg0", "nn-leaf001")
