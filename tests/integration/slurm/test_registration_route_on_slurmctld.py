"""The registration route on a real slurmctld (26.05, sid): a node that slurmctld already serves where the plan
puts it (as a node placed at registration is, by ``slurmd --conf topology=...`` on 25.11) is reported by the
apply as ``nodes_placed_before`` and gets no ``scontrol update``; the others of the same plan are updated; verify
reads in_sync. 26.05 does not apply a resumed node's registration topology (slurm-facts §8), so the placement is
made here by ``scontrol update``, the same live state registration leaves."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.slurm.test_applier_incremental_on_slurmctld import _gpu
from tests.integration.slurm.test_applier_on_slurmctld import _bundle, _cluster, _plan, _run, _start
from topokeeper.wire import parse_show_topology

pytestmark = pytest.mark.slurm


def test_a_node_already_placed_as_planned_is_not_updated_and_is_reported(sid_root: Path, controllers) -> None:
    first = _plan(_cluster())
    controller = controllers(sid_root)
    _start(controller, first)
    assert _run(controller, "apply", _bundle(first))[1]["outcome"] == "applied"
    paths = {"p5-003": ("nn-spine0", "nn-agg0", "nn-leaf001"), "p5-007": ("nn-spine0", "nn-agg2", "nn-l9")}
    second = _bundle(_plan(_cluster(gpu=_gpu(**paths))))
    # What registration leaves: p5-003 already where the new plan puts it, before the plan reaches the head node.
    placed = "Topology=tree-gpu:nn-spine0:nn-agg0:nn-leaf001"
    controller.run("scontrol", "update", "NodeName=p5-003", placed, check=True)

    code, document = _run(controller, "apply", second)

    assert (code, document["outcome"], document["apply_path"]) == (0, "applied", "incremental")
    assert (document["nodes_placed_before"], document["nodes_updated"]) == (["p5-003"], 1)  # only p5-007 updated
    live = parse_show_topology(controller.show_topology("tree-gpu"))
    assert "p5-003" in live["nn-leaf001"]["nodes"] and live["nn-l9"]["nodes"] == ["p5-007"]
    code, verified = _run(controller, "verify", second)
    assert (code, verified["outcome"], verified["drift"]) == (0, "in_sync", [])
