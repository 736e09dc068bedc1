"""Which powered-up CLOUD nodes the applier re-places after a reconfigure (headnode/cloud.py)."""

from __future__ import annotations

from topokeeper.headnode.bundle import Bundle, ExpectedUnit
from topokeeper.headnode.cloud import cloud_nodes, set_aside_powered_down, stray_batches
from topokeeper.headnode.grouping import compare_units
from topokeeper.headnode.scontrol import LiveTopologies, LiveTopology

_FILE = """- topology: tree-gpu
  cluster_default: false
  tree:
    switches:
      - switch: root
        children: leaf0,leaf1
      - switch: leaf0
        nodes: n[1-2]
      - switch: leaf1
        nodes: n3
"""


def _line(name: str, state: str, topology: str | None = None) -> str:
    tail = "" if topology is None else f" Topology={topology}"
    return f"NodeName={name} NodeAddr={name} State={state} Partitions=gpu{tail}"


def test_only_powered_up_cloud_nodes_off_the_file_are_re_placed() -> None:
    show = "\n".join(
        [
            _line("n1", "IDLE+CLOUD+POWERING_UP", "tree-gpu:root:leaf1"),  # moved live, the file says leaf0
            _line("n2", "IDLE+CLOUD", "tree-gpu:root:leaf0"),  # dynamic, where the file says
            _line("n3", "IDLE+CLOUD+POWERED_DOWN", "tree-gpu:root:leaf0"),  # Slurm resets it at power-down
            _line("n4", "IDLE+CLOUD", "tree-gpu:root:leaf1"),  # the file no longer places it
            _line("n5", "IDLE", "tree-gpu:root:leaf1"),  # not CLOUD: a reconfigure placed it
            _line("n6", "ALLOCATED+CLOUD"),  # no dynamic topology: the files place it
            _line("n7", "IDLE+CLOUD+POWERING_DOWN", "tree-gpu:root:leaf0"),
        ]
    )

    assert stray_batches(show, _FILE) == [("n1", "tree-gpu:root:leaf0"), ("n4", "")]
    assert cloud_nodes(show)["n7"] == (False, "tree-gpu:root:leaf0")
    assert "n5" not in cloud_nodes(show)


def test_a_placement_in_several_topologies_compares_as_a_set_and_another_layout_is_left_to_reconfigure() -> None:
    block = "- topology: block-x\n  cluster_default: false\n  block:\n    blocks:\n      - block: b0\n"
    block += "        nodes: n1\n"
    two = _FILE + block
    show = _line("n1", "IDLE+CLOUD", "block-x:b0,tree-gpu:root:leaf0")

    assert stray_batches(show, two) == []
    assert stray_batches(show, "NodeName=n1 Topology=hand-written\n") == []


def test_verify_sets_aside_powered_down_cloud_nodes_in_another_leaf_but_not_ones_in_none() -> None:
    expected = {
        "root": ExpectedUnit("switch", ["n1", "n2", "n3"], ["leaf0", "leaf1"]),
        "leaf0": ExpectedUnit("switch", ["n1", "n2"], []),
        "leaf1": ExpectedUnit("switch", ["n3"], []),
    }
    bundle = Bundle("sha", "topology.yaml", None, {}, {"gpu": "t"}, ["n1", "n2", "n3"], {"t": expected}, {})
    live = LiveTopologies(None)  # type: ignore[arg-type]
    live.shown_value["t"] = LiveTopology(
        {
            "root": {"kind": "switch", "level": 1, "nodes": ["n2", "n3", "n9"], "switches": ["leaf0", "leaf1"]},
            "leaf0": {"kind": "switch", "level": 0, "nodes": ["n2"], "switches": []},
            "leaf1": {"kind": "switch", "level": 0, "nodes": ["n3", "n9"], "switches": []},
        },
        "",
    )
    show = "\n".join(
        [
            _line("n1", "IDLE+CLOUD+POWERED_DOWN"),  # planned, in no live leaf: still drift
            _line("n9", "IDLE+CLOUD+POWERED_DOWN"),  # placed nowhere by the plan, in leaf1 live: set aside
            _line("n3", "IDLE+CLOUD"),
        ]
    )

    stripped, topologies, aside = set_aside_powered_down(bundle, live, show)

    assert aside == {"t": ["n9"]}
    assert topologies.get("t").units["leaf1"]["nodes"] == ["n3"]
    assert stripped.topologies["t"]["leaf0"].nodes == ["n1", "n2"]


def test_a_reason_that_quotes_a_state_or_a_name_is_not_the_nodes_own() -> None:
    # Reason=, Comment= and Extra= are free text printed after State= (src/api/node_info.c); Topology= is last.
    show = "\n".join(
        [
            "NodeName=n3 NodeAddr=n3 State=IDLE+CLOUD+POWERED_DOWN Partitions=gpu"
            " Reason=resume failed, was State=IDLE+CLOUD NodeName=n9 [root@2026-12-04T17:00:00]"
            " Topology=tree-gpu:root:leaf0",
        ]
    )

    assert cloud_nodes(show) == {"n3": (False, "tree-gpu:root:leaf0")}


def test_a_node_powered_down_into_a_switch_an_incremental_apply_emptied_is_not_drift() -> None:
    """A CLOUD node placed live keeps its first place as the one power-down restores (node_mgr.c,
    topology_orig_str; only a reconfigure re-reads it from the file). An incremental apply that emptied that
    leaf (no-topology: the last powered-down node powered up) left it live; the node powering down goes back
    into it, and verify sets it aside: the leaf, empty without it, is passed over like any emptied switch."""
    expected = {
        "root": ExpectedUnit("switch", ["n1", "n2", "n3", "n4"], ["leaf0", "leaf1"]),
        "leaf0": ExpectedUnit("switch", ["n1", "n2"], []),
        "leaf1": ExpectedUnit("switch", ["n3", "n4"], []),
    }
    nodes = ["n1", "n2", "n3", "n4"]
    bundle = Bundle("sha", "topology.yaml", None, {}, {"gpu": "t"}, nodes, {"t": expected}, {})
    live = LiveTopologies(None)  # type: ignore[arg-type]
    live.shown_value["t"] = LiveTopology(
        {
            "root": {"kind": "switch", "level": 1, "nodes": nodes, "switches": ["leaf0", "leaf1", "no-topology"]},
            "leaf0": {"kind": "switch", "level": 0, "nodes": ["n1", "n2"], "switches": []},
            "leaf1": {"kind": "switch", "level": 0, "nodes": ["n4"], "switches": []},
            "no-topology": {"kind": "switch", "level": 0, "nodes": ["n3"], "switches": []},
        },
        "",
    )
    show = "\n".join([_line(n, "IDLE+CLOUD") for n in ("n1", "n2", "n4")] + [_line("n3", "IDLE+CLOUD+POWERED_DOWN")])

    stripped, topologies, aside = set_aside_powered_down(bundle, live, show)

    assert aside == {"t": ["n3"]}
    assert compare_units(stripped.topologies["t"], topologies.get("t").units) == []
    # A planned leaf whose planned and live nodes are all set aside: gone from the plan, empty live, still listed.
    units = live.shown_value["t"].units
    units["leaf0"] = dict(units["leaf0"], nodes=["n1", "n2", "n4"])
    units["leaf1"] = dict(units["leaf1"], nodes=["n5"])
    down = [_line("n1", "IDLE+CLOUD"), _line("n2", "IDLE+CLOUD")]
    down += [_line(n, "IDLE+CLOUD+POWERED_DOWN") for n in ("n3", "n4", "n5")]
    stripped, topologies, aside = set_aside_powered_down(bundle, live, "\n".join(down))
    assert aside == {"t": ["n3", "n4", "n5"]}
    assert compare_units(stripped.topologies["t"], topologies.get("t").units) == []


def test_a_block_that_held_only_set_aside_nodes_is_left_out_on_both_sides() -> None:
    """A block is not kept emptied (a plan that drops one reconfigures): live and planned, it goes with its nodes."""
    expected = {"b1": ExpectedUnit("block", ["n1"], []), "b2": ExpectedUnit("block", ["n2", "n3"], [])}
    bundle = Bundle("sha", "topology.yaml", None, {}, {"gpu": "t"}, ["n1", "n2", "n3"], {"t": expected}, {})
    live = LiveTopologies(None)  # type: ignore[arg-type]
    live.shown_value["t"] = LiveTopology(
        {
            "b1": {"kind": "block", "nodes": ["n9"]},
            "b2": {"kind": "block", "nodes": ["n1", "n2", "n3"]},
        },
        "",
    )
    show = "\n".join([_line("n1", "IDLE+CLOUD+POWERED_DOWN"), _line("n9", "IDLE+CLOUD+POWERED_DOWN")])
    stripped, topologies, aside = set_aside_powered_down(bundle, live, show)
    assert aside == {"t": ["n1", "n9"]}
    assert compare_units(stripped.topologies["t"], topologies.get("t").units) == []
