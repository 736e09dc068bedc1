from tests.helpers import gb200_nodes, node, p5_nodes, snapshot
from topokeeper.contract.ports import ApplyResult, Outcome
from topokeeper.engine.planner import plan
from topokeeper.render.bundle import render
from topokeeper.service.drift import drifted_partitions

CPU = [node("c1", "c6i.4xlarge", partition="cpu")]


def _bundle(version: str = "26.05"):
    return render(
        plan(snapshot({"p5": p5_nodes(8, partition="p5"), "gb": gb200_nodes(1), "cpu": CPU}, version=version))
    ).bundle


def _drift(*items: dict) -> ApplyResult:
    return ApplyResult(outcome=Outcome.DRIFT, applier_version="1.0.0", mode="verify", drift=list(items))


def test_topology_and_partition_drift_name_their_partitions() -> None:
    bundle = _bundle()
    assert drifted_partitions(_drift({"what": "topology", "name": "tree-p5"}), bundle) == ["p5"]
    assert drifted_partitions(_drift({"what": "partition", "name": "gb"}), bundle) == ["gb"]


def test_a_file_edit_may_touch_every_assigned_partition() -> None:
    assert drifted_partitions(_drift({"what": "file", "name": "topology.yaml"}), _bundle()) == ["gb", "p5"]


def test_a_reconfigured_edit_names_its_partition_even_with_file_drift() -> None:
    drift = _drift({"what": "file", "name": "topology.yaml"}, {"what": "topology", "name": "tree-p5"})
    assert drifted_partitions(drift, _bundle()) == ["p5"]


def test_before_25_05_one_topology_serves_every_partition() -> None:
    result = drifted_partitions(_drift({"what": "topology", "name": "cluster"}), _bundle("24.11"))
    assert result == ["cpu", "gb", "p5"]


def test_grouping_drift_names_its_partition_or_before_25_05_every_one() -> None:
    assert drifted_partitions(_drift({"what": "grouping", "name": "gb"}), _bundle()) == ["gb"]
    result = drifted_partitions(_drift({"what": "grouping", "name": "cluster"}), _bundle("24.11"))
    assert result == ["cpu", "gb", "p5"]
