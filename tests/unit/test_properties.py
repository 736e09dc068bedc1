"""Properties of the engine over random clusters: coverage, permutation invariance, idempotence."""

from __future__ import annotations

import itertools

import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.helpers import node, snapshot
from topokeeper.domain.models import BlockTopology, FlatTopology, Node, TreeTopology
from topokeeper.engine.planner import plan
from topokeeper.render.bundle import render
from topokeeper.wire import expand

TYPES = ["p5.48xlarge", "p6-b200.48xlarge", "p6e-gb200.36xlarge", "c7i.4xlarge"]


@st.composite
def clusters(draw: st.DrawFn) -> dict[str, list[Node]]:
    partitions: dict[str, list[Node]] = {}
    sizes = draw(st.lists(st.integers(0, 25), min_size=1, max_size=3))
    # Distinct host numbers for the whole cluster, drawn at once: a .filter() lambda per node costs hypothesis
    # a parse of this source each time.
    numbers = iter(draw(st.lists(st.integers(1, 400), min_size=sum(sizes), max_size=sum(sizes), unique=True)))
    for p, size in enumerate(sizes):
        name = f"part{p}"
        types = draw(st.lists(st.sampled_from(TYPES), min_size=1, max_size=2, unique=True))
        nodes = []
        for number in itertools.islice(numbers, size):
            instance_type = draw(st.sampled_from(types))
            layers = 4 if instance_type.startswith("p6-") else 3
            has_path = draw(st.booleans()) or draw(st.booleans())
            path = (
                tuple(f"nn-l{depth}-{draw(st.integers(0, 2 + depth))}" for depth in range(layers)) if has_path else ()
            )
            ultraserver = (
                f"us-{draw(st.integers(0, 3))}" if instance_type.startswith("p6e") and draw(st.booleans()) else None
            )
            nodes.append(
                node(f"ip-10-0-{number // 100}-{number % 100}", instance_type, path, ultraserver, partition=name)
            )
        partitions[name] = nodes
    return partitions


def _listed(topology) -> list[str]:
    if isinstance(topology, TreeTopology):
        return [n for s in topology.switches for n in s.nodes]
    if isinstance(topology, BlockTopology):
        return [n for b in topology.blocks for n in b.nodes]
    assert isinstance(topology, FlatTopology)
    return []


@settings(max_examples=60, deadline=None)
@given(clusters(), st.sampled_from(["26.05", "24.11"]))
def test_each_partition_node_appears_exactly_once(partitions: dict[str, list[Node]], version: str) -> None:
    result = plan(snapshot(partitions, version=version))
    for partition in result.partitions:
        if partition.assignment is not None:
            assert sorted(_listed(partition.topology)) == sorted(partition.nodes)
    if result.cluster_topology is not None and not isinstance(result.cluster_topology, FlatTopology):
        assert sorted(_listed(result.cluster_topology)) == sorted(result.nodes)


@settings(max_examples=40, deadline=None)
@given(clusters(), st.randoms(use_true_random=False), st.sampled_from(["26.05", "24.11"]))
def test_permutation_invariance(partitions: dict[str, list[Node]], shuffler, version: str) -> None:
    expected = render(plan(snapshot(partitions, version=version))).files()
    shuffled = {}
    for name in sorted(partitions, key=lambda _: shuffler.random()):
        nodes = list(partitions[name])
        shuffler.shuffle(nodes)
        shuffled[name] = nodes
    assert render(plan(snapshot(shuffled, version=version))).files() == expected


@settings(max_examples=40, deadline=None)
@given(clusters())
def test_rendered_yaml_reads_back_as_the_plan(partitions: dict[str, list[Node]]) -> None:
    """Idempotence of the text form: parsing what we wrote gives back the planned topology."""
    rendered = render(plan(snapshot(partitions)))
    entries = yaml.safe_load(rendered.topology_text)
    assert entries[0] == {"topology": "flat-default", "cluster_default": True, "flat": True}
    by_name = {entry["topology"]: entry for entry in entries[1:]}
    assert sum(entry.get("cluster_default") is True for entry in entries) == 1
    for partition in rendered.plan.partitions:
        if partition.assignment is None:
            assert partition.assignment not in by_name
            continue
        entry = by_name[partition.assignment]
        if isinstance(partition.topology, TreeTopology):
            read = [
                (
                    s["switch"],
                    tuple(str(s.get("children", "")).split(",")) if "children" in s else (),
                    tuple(expand(str(s["nodes"]))) if "nodes" in s else (),
                )
                for s in entry["tree"]["switches"]
            ]
            assert [(n, c, tuple(sorted(x))) for n, c, x in read] == [
                (s.name, s.switches, tuple(sorted(s.nodes))) for s in partition.topology.switches
            ]
        else:
            assert isinstance(partition.topology, BlockTopology)
            assert tuple(entry["block"]["block_sizes"]) == partition.topology.block_sizes
            assert [(b["block"], tuple(sorted(expand(str(b["nodes"]))))) for b in entry["block"]["blocks"]] == [
                (b.name, b.nodes) for b in partition.topology.blocks
            ]
    again = render(plan(snapshot(partitions)))
    assert again.files() == rendered.files()
