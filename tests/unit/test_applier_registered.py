"""Which nodes an apply leaves to registration, for how long, and which it places once the wait is over
(headnode/registered.py); the read-back without them (headnode/cloud.py)."""

from __future__ import annotations

from tests.unit.test_applier_cloud import _FILE, _line
from topokeeper.headnode.bundle import Bundle, ExpectedUnit
from topokeeper.headnode.cloud import without_nodes
from topokeeper.headnode.registered import still_left, waiting
from topokeeper.headnode.scontrol import LiveTopologies, LiveTopology
from topokeeper.wire import REGISTRATION_WAIT_SECONDS

NOW = 1_000_000.0


def _live(leaf0: list[str], leaf1: list[str]) -> LiveTopologies:
    live = LiveTopologies(None)  # type: ignore[arg-type]
    live.shown_value["tree-gpu"] = LiveTopology(
        {
            "root": {"kind": "switch", "level": 1, "nodes": leaf0 + leaf1, "switches": ["leaf0", "leaf1"]},
            "leaf0": {"kind": "switch", "level": 0, "nodes": leaf0, "switches": []},
            "leaf1": {"kind": "switch", "level": 0, "nodes": leaf1, "switches": []},
        },
        "",
    )
    return live


def _bundle(registering: tuple[str, ...]) -> Bundle:
    return Bundle("sha", "topology.yaml", None, {"topology.yaml": _FILE}, {}, [], {}, {}, registering=registering)


def test_only_registering_nodes_not_registered_and_not_where_planned_are_left_each_from_its_first_apply() -> None:
    show = "\n".join(
        [
            _line("n1", "IDLE+CLOUD+POWERING_UP"),  # in no leaf yet: left
            _line("n2", "IDLE+CLOUD+POWERING_UP"),  # left by an earlier apply: its wait is kept, not renewed
            _line("n3", "IDLE+CLOUD"),  # registered (without its topology): placed now
        ]
    )
    found = waiting(_bundle(("n1", "n2", "n3")), {"n2": NOW + 7, "n3": NOW + 7}, show, _live([], []), NOW)

    assert found.left == {"n1": NOW + REGISTRATION_WAIT_SECONDS, "n2": NOW + 7}
    assert found.overdue == [("n3", "tree-gpu:root:leaf1")]


def test_a_node_past_its_wait_or_no_longer_listed_is_placed_and_one_where_planned_is_not() -> None:
    show = "\n".join(_line(name, "IDLE+CLOUD+POWERING_UP") for name in ("n1", "n2", "n3"))
    record = {"n1": NOW - 1, "n2": NOW + 7, "n3": NOW - 1}

    found = waiting(_bundle(("n1",)), record, show, _live(["n1"], ["n3"]), NOW)  # n3 is where the file says

    assert (found.left, found.overdue) == ({}, [("n2", "tree-gpu:root:leaf0")])
    assert still_left(record, show, NOW) == frozenset({"n2"})  # what verify sets aside


def test_a_wait_recorded_by_a_clock_since_stepped_back_lasts_no_longer_than_the_bound_from_now() -> None:
    show = _line("n1", "IDLE+CLOUD+POWERING_UP")
    record = {"n1": NOW + 86_400}  # written while the clock ran a day ahead

    found = waiting(_bundle(("n1",)), record, show, _live([], []), NOW)

    assert found.left == {"n1": NOW + REGISTRATION_WAIT_SECONDS}  # rewritten, bounded from now
    assert still_left(record, show, NOW) == frozenset()  # verify: drift, whose repair's apply bounds it


def test_the_read_back_without_a_left_node_drops_the_leaf_and_switches_that_held_only_it() -> None:
    expected = {
        "root": ExpectedUnit("switch", [], ["agg", "leaf0"]),
        "agg": ExpectedUnit("switch", [], ["leaf9"]),
        "leaf9": ExpectedUnit("switch", ["n7"], []),  # new in the plan, for the node left to registration
        "leaf0": ExpectedUnit("switch", ["n1"], []),
    }
    bundle = Bundle("sha", "topology.yaml", None, {}, {}, [], {"t": expected}, {})

    stripped, _ = without_nodes(bundle, LiveTopologies(None), frozenset({"n7"}), prune=True)  # type: ignore[arg-type]

    assert stripped.topologies["t"] == {
        "root": ExpectedUnit("switch", [], ["leaf0"]),
        "leaf0": ExpectedUnit("switch", ["n1"], []),
    }
