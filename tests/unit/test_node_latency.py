"""Node-to-topology latency accounting (topokeeper.sim.latency): launches in, live topology in, seconds out."""

from __future__ import annotations

import pytest

from topokeeper.domain.models import NO_TOPOLOGY_SWITCH, NO_ULTRASERVER_BLOCK
from topokeeper.sim.latency import LatencyTracker, percentile, summarize, topology_node_names

TREE_LIVE = """\
SwitchName=nn-spine Level=1 LinkSpeed=1 Nodes=ip-10-1-0-[1-4],ip-10-1-9-9 Switches=nn-leaf[1-2]
SwitchName=nn-leaf1 Level=0 LinkSpeed=1 Nodes=ip-10-1-0-[1-2]
SwitchName=nn-leaf2 Level=0 LinkSpeed=1 Nodes=ip-10-1-0-[3-4],ip-10-1-9-9"""
BLOCK_LIVE = "BlockName=us-1 BlockIndex=0 Nodes=gb-[001-002] BlockSize=2"
# As slurmctld shows nodes whose topology EC2 has not reported yet: schedulable, but not placed.
WAITING_LIVE = f"""\
SwitchName=root Level=1 LinkSpeed=0 Nodes=ip-10-1-0-[1-2],ip-10-2-0-1 Switches=nn-leaf1,{NO_TOPOLOGY_SWITCH}
SwitchName=nn-leaf1 Level=0 LinkSpeed=0 Nodes=ip-10-1-0-[1-2]
SwitchName={NO_TOPOLOGY_SWITCH} Level=0 LinkSpeed=0 Nodes=ip-10-2-0-1"""
WAITING_BLOCKS = f"""\
BlockName=us-1 BlockIndex=0 Nodes=gb-001 BlockSize=18
BlockName={NO_ULTRASERVER_BLOCK} BlockIndex=1 Nodes=gb-002 BlockSize=18"""


def test_the_live_topology_names_every_node_of_every_switch_and_block() -> None:
    names = topology_node_names({"ml-p5": TREE_LIVE, "ml-p6e": BLOCK_LIVE, "cpu": ""})
    assert names == {"ip-10-1-0-1", "ip-10-1-0-2", "ip-10-1-0-3", "ip-10-1-0-4", "ip-10-1-9-9", "gb-001", "gb-002"}


def test_nodes_waiting_for_topology_data_are_not_placed() -> None:
    assert topology_node_names({"ml-p5": WAITING_LIVE, "ml-p6e": WAITING_BLOCKS}) == {
        "ip-10-1-0-1",
        "ip-10-1-0-2",
        "gb-001",
    }


@pytest.mark.parametrize(
    ("values", "fraction", "expected"),
    [
        ([], 0.5, None),
        ([7.0], 0.99, 7.0),
        ([4.0, 1.0, 3.0, 2.0], 0.5, 2.0),
        ([float(v) for v in range(1, 101)], 0.99, 99.0),
    ],
)
def test_percentiles_are_nearest_rank(values: list[float], fraction: float, expected: float | None) -> None:
    assert percentile(values, fraction) == expected


def test_a_node_appears_at_the_first_observation_that_places_it_after_its_launch() -> None:
    tracker = LatencyTracker()
    tracker.launched("i-1", "a", 10.0)
    tracker.launched("i-2", "b", 20.0)
    tracker.observe({"a"}, 15.0)  # b is not placed yet
    tracker.observe({"a", "b"}, 80.0)
    tracker.observe({"a", "b"}, 200.0)  # later observations change nothing
    tracker.launched("i-1", "a", 99.0)  # nor does seeing the same launch again
    assert tracker.between(0.0, 300.0) == ({"a": 5.0, "b": 60.0}, 0)
    summary = summarize(*tracker.between(0.0, 300.0))
    assert (summary.nodes, summary.p50, summary.max, summary.slowest, summary.unplaced) == (2, 5.0, 60.0, "b", 0)


def test_a_name_seen_before_the_launch_does_not_count_and_unplaced_nodes_are_counted() -> None:
    tracker = LatencyTracker()
    tracker.launched("i-1", "a", 50.0)
    tracker.launched("i-2", "b", 50.0)
    tracker.observe({"a"}, 40.0)  # an observation older than the launch (a name reused) is not this node
    assert tracker.between(0.0, 100.0) == ({}, 2)
    tracker.observe({"a"}, 70.0)
    assert tracker.between(0.0, 100.0) == ({"a": 20.0}, 1)


def test_steps_count_the_nodes_launched_in_them_and_deleted_nodes_are_forgotten() -> None:
    tracker = LatencyTracker()
    tracker.launched("i-1", "a", 10.0)
    tracker.launched("i-2", "b", 110.0)
    tracker.launched("i-3", "c", 120.0)
    tracker.observe({"a", "b"}, 130.0)
    tracker.forget_except(["i-1", "i-2"])  # c was deleted before it was ever placed
    assert tracker.between(0.0, 100.0) == ({"a": 120.0}, 0)
    assert tracker.between(100.0, 200.0) == ({"b": 20.0}, 0)
    assert tracker.between(110.0000004, 115.0) == ({"b": 20.0}, 0)  # launched at the step's start, to the microsecond
