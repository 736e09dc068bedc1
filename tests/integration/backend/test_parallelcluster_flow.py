"""The shipped ParallelCluster scenario through the whole backend: EC2 instances tagged as ParallelCluster tags
them, EC2 state-change events, and a real slurmctld laid out as ParallelCluster's head node, where nodes are
bound to instances with scontrol update (static nodes in slurm.conf, dynamic ones by the resume program)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from topokeeper.contract.ports import Metric
from topokeeper.sim.aws.alarms import AlarmState
from topokeeper.sim.head_node import ChrootHeadNode
from topokeeper.sim.parallelcluster import CLUSTER_TAG, HEAD_NODE_TAG, QUEUE_TAG
from topokeeper.sim.scenario import Scenario, load_scenario
from topokeeper.sim.simulator import play
from topokeeper.sim.stack import BUCKET
from topokeeper.sim.world import World, running
from topokeeper.wire import parse_show_topology, registration_prefix

pytestmark = pytest.mark.slurm

SCENARIO = Path(__file__).resolve().parents[3] / "layers/core/python/topokeeper/sim/scenarios/parallelcluster.yaml"
BINDINGS_CHANGED = "Slurm Node Bindings Changed"


def _leaves(world: World, partition: str) -> dict[str, list[str]]:
    """Leaf switch -> its Slurm nodes, as slurmctld shows the partition's live topology; a leaf live updates emptied
    (no-topology once the last dynamic node is bound) stays, empty, until a reconfigure (headnode/incremental.py)."""
    switches = parse_show_topology(world.head.live_topology()[partition])
    return {name: list(s["nodes"]) for name, s in switches.items() if s["level"] == 0 and s["nodes"]}  # type: ignore[call-overload]


def _expected_leaves(world: World, group: str) -> dict[str, list[str]]:
    """Leaf -> Slurm nodes as EC2's topology places the instances bound to them; no instance: no-topology."""
    assert world.parallelcluster is not None
    expected: dict[str, list[str]] = {}
    for instance in world.parallelcluster.nodes(group):
        placement = world.emulator.network.placement(instance.instance_id)
        assert placement is not None
        expected.setdefault(placement.network_nodes[-1], []).append(instance.slurm_name)
    running_names = {i.slurm_name for i in world.parallelcluster.nodes(group)}
    queue = next(g.partition for g in world.scenario.cluster.instance_groups if g.name == group)
    unbacked = [name for name in world.partitions()[str(queue)] if name not in running_names]
    if unbacked:
        expected["no-topology"] = unbacked
    return {leaf: sorted(names) for leaf, names in expected.items()}


def _replanned_after_stale_bindings(records: list[dict[str, Any]], node: str) -> bool:
    """The apply was refused for ``node``'s binding, and the plan made from the refusal's table applied."""
    stale = [r for r in records if r["outcome"] == "stale_bindings" and node in (r["error"] or "")]
    applied = [
        r
        for r in records
        if r["outcome"] == "applied" and any(t["detail_type"] == BINDINGS_CHANGED for t in r["triggers"])
    ]
    return bool(stale) and bool(applied) and applied[-1]["completed_at"] > stale[0]["completed_at"]


def test_the_parallelcluster_scenario_names_and_places_nodes_as_slurmctld_binds_them() -> None:
    scenario = load_scenario(SCENARIO)
    with running(scenario, head_node="chroot") as world:
        result = play(world, scenario, lambda _: None)
        assert world.parallelcluster is not None

        # The world is ParallelCluster's: a tagged EC2 head node is the SSM target, compute instances carry
        # their cluster and queue, and slurmctld runs in the ParallelCluster layout.
        assert result.head_node.endswith("laid out as a parallelcluster head node")
        ec2 = world.emulator.client("ec2")
        (head,) = ec2.describe_instances(InstanceIds=[world.head_node_id])["Reservations"][0]["Instances"]
        assert {t["Key"]: t["Value"] for t in head["Tags"]}[HEAD_NODE_TAG] == "true"
        assert world.cluster.head_node == world.head_node_id and world.head_node_id.startswith("i-")
        for instance in world.parallelcluster.nodes():
            (described,) = ec2.describe_instances(InstanceIds=[instance.instance_id])["Reservations"][0]["Instances"]
            tags = {t["Key"]: t["Value"] for t in described["Tags"]}
            assert (tags[CLUSTER_TAG], described["PrivateIpAddress"]) == ("pcluster", instance.private_ip)
            assert tags[QUEUE_TAG] == ("q1" if instance.group == "p5" else "cpu")

        # Every step ends with the live topology equal to the plan AWS and slurmctld's bindings imply. The
        # scale-up is placed by its own EC2 events: the new instances match no NodeAddr of the stored table, so
        # the reconcile reads the head node's table first and plans with the resumed nodes' bindings.
        create, scale, wait, replace, delete, last = result.steps
        assert [s.step for s in result.steps] == ["create", "scale", "wait", "replace", "delete", "wait"]
        assert all(step.converged for step in result.steps)
        # Written live, a node launched after a write's plan goes in the next write, not the next write interval;
        # one bound between a plan and its apply is deferred and placed by the retry its result asks for.
        assert [r["outcome"] for r in scale.audit_records] == ["applied"] * len(scale.audit_records)
        triggers = {t["detail_type"] for r in scale.audit_records for t in r["triggers"]}
        assert "EC2 Instance State-change Notification" in triggers
        assert triggers <= {"EC2 Instance State-change Notification", "Slurm Node Bindings Changed"}
        moved = [m["node"] for r in scale.audit_records for m in r["nodes_moved"]]
        assert sorted(moved) == [f"q1-dy-p5-{n}" for n in range(1, 5)]  # each once
        assert wait.audit_records == []  # nothing left for the drift check to place

        # The first apply named the nodes as slurmctld does (no ip-... names refused as unknown), and powered-down
        # dynamic nodes are no nodes without topology: no failure, no alarm, no topology retries.
        assert [r["outcome"] for r in create.audit_records] == ["applied"] * len(create.audit_records)
        assert world.metrics.state("pcluster", Metric.APPLY_FAILURES) is AlarmState.OK
        assert not any(m == Metric.APPLY_FAILURES.value for _, _, m, _ in world.metrics.points)
        without = [v for _, _, m, v in world.metrics.points if m == Metric.NODES_WITHOUT_TOPOLOGY.value]
        assert without and max(without) == 0
        retries = [t for s in result.steps for r in s.audit_records for t in r["triggers"]]
        assert not any(t["detail_type"] == "Topology Retry" for t in retries)

        # The replaced static node was re-bound to its new instance, which its events' reconcile read first.
        (rebound,) = replace.audit_records
        assert (rebound["outcome"], [m["node"] for m in rebound["nodes_moved"]]) == ("applied", ["q1-st-p5-1"])
        assert {t["detail_type"] for t in rebound["triggers"]} == {"EC2 Instance State-change Notification"}
        # The powered-down node (NodeAddr back to its name): refused once as stale today and replanned at once; an
        # applier that tolerates a powering-down node applies instead, and the drift check places it. Either way
        # the story ends with the node under no-topology.
        down = delete.audit_records + last.audit_records
        stale_down = [r for r in down if r["outcome"] == "stale_bindings"]
        assert not stale_down or _replanned_after_stale_bindings(down, "q1-dy-p5-4")
        assert down[-1]["outcome"] == "applied"

        # slurmctld's bindings, and the live topology naming q1-st/q1-dy nodes under the leaves of their instances.
        assert isinstance(world.head, ChrootHeadNode)
        table = {record.name: record.address for record in world.head.node_table()}
        replaced = next(i for i in world.parallelcluster.nodes("p5") if i.slurm_name == "q1-st-p5-1")
        assert replaced.replaces is not None and table["q1-st-p5-1"] == replaced.private_ip
        assert table["q1-dy-p5-4"] == "q1-dy-p5-4"
        live = _leaves(world, "q1")
        assert live == _expected_leaves(world, "p5")
        assert sorted(name for names in live.values() for name in names) == sorted(
            [f"q1-st-p5-{n}" for n in range(1, 5)] + [f"q1-dy-p5-{n}" for n in range(1, 9)]
        )
        assert live["no-topology"] == sorted(f"q1-dy-p5-{n}" for n in range(4, 9))
        assert len([leaf for leaf in live if leaf != "no-topology"]) >= 2  # the replacement moved to another leaf
        assert world.head.controller.partition_topologies() == {"q1": "tree-q1", "cpu": None}

        # Slurm 26.05 here: no registration entries (its slurmctld ignores a resumed node's slurmd-supplied
        # topology); the 25.11 tests read them (tests/integration/slurm/test_registration_in_simulator.py).
        s3 = world.emulator.client("s3")
        entries = s3.list_objects_v2(Bucket=BUCKET, Prefix=registration_prefix("pcluster"))
        assert entries["KeyCount"] == 0


def test_a_rolling_scale_up_is_never_refused_whole_for_nodes_bound_meanwhile() -> None:
    """The resume program binds a node every second, while SSM takes 2 s to deliver a plan: an apply during the
    scale-up finds nodes bound since its plan. It applies every other node and defers those (no stale_bindings
    refusal of the whole bundle), and the next plan places them: every node ends under its instance's leaf."""
    document = yaml.safe_load(SCENARIO.read_text())
    document["cluster"]["instance_groups"][1].update(dynamic=40)
    document["steps"] = [{"scale": {"group": "p5", "to": 44, "over_seconds": 40}}, {"wait": {"seconds": 300}}]
    document["min_write_interval_seconds"] = 20  # writes during the scale-up, not only after it
    scenario = Scenario.model_validate(document)
    with running(scenario, head_node="chroot") as world:
        result = play(world, scenario, lambda _: None)

        _, scale, wait = result.steps
        records = scale.audit_records + wait.audit_records
        assert [r for r in records if r["outcome"] == "stale_bindings"] == []
        deferred = {node for r in records for node in r["nodes_deferred"]}
        assert deferred and deferred <= {f"q1-dy-p5-{n}" for n in range(1, 41)}  # it did happen, and was absorbed
        assert all(r["outcome"] == "applied" for r in records)
        # Each by live updates, the one emptying no-topology (the last dynamic node bound) too: no reconfigure.
        assert [r["placed_by"]["file"] for r in records if "file" in r["placed_by"]] == []
        assert wait.converged
        assert _leaves(world, "q1") == _expected_leaves(world, "p5")
