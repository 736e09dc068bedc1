"""Adding an instance type is one catalog entry: a made-up UltraServer type, added to ``CATALOG`` alone, is accepted
by the emulator and scenario validation, reported by HyperPod and EC2 as its entry says, planned as a block
partition of its UltraServer size, and given a Kueue UltraServer Topology and its accelerators."""

from __future__ import annotations

from typing import Any

import pytest
from botocore.exceptions import ClientError

from tests.integration.aws.support import all_nodes, cluster_request, group
from topokeeper.domain import catalog
from topokeeper.domain.catalog import Accelerator, InstanceTypeInfo, UltraServer
from topokeeper.domain.models import PlannerConfig, TopologyKind
from topokeeper.engine.planner import plan
from topokeeper.engine.snapshot import build_snapshot, parse_snapshot_document
from topokeeper.kueue.objects import ULTRASERVER_TOPOLOGY, example_jobs, plan_kueue
from topokeeper.sim.aws_emulator import AwsEmulator, ManualClock
from topokeeper.sim.scenario import InstanceGroup

NEW_TYPE = "p9u.48xlarge"  # no such type: nothing but the entry below can know it
NEW_ENTRY = InstanceTypeInfo(
    network_layers=3,
    ultraserver=UltraServer(size=8, type="ml.u-p9ux64"),
    accelerator=Accelerator("nvidia.com/gpu", per_instance=8),
    hyperpod=True,
    source="a test's made-up type",
)


@pytest.fixture
def new_type(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(catalog.CATALOG, NEW_TYPE, NEW_ENTRY)


def _request() -> dict[str, Any]:
    return cluster_request("new-type", group("p9u", f"ml.{NEW_TYPE}", 16, partition="ml-p9u"))


def test_without_the_entry_the_type_is_unknown(aws: AwsEmulator) -> None:
    with pytest.raises(ClientError, match="Member must satisfy enum value set"):
        aws.client("sagemaker").create_cluster(**_request())
    with pytest.raises(ValueError, match="not an instance type SageMaker HyperPod accepts"):
        InstanceGroup(name="p9u", type=f"ml.{NEW_TYPE}", count=1, partition="ml-p9u")


@pytest.mark.usefixtures("new_type")
def test_one_entry_flows_through_emulator_planner_and_kueue(aws: AwsEmulator, clock: ManualClock) -> None:
    InstanceGroup(name="p9u", type=f"ml.{NEW_TYPE}", count=16, partition="ml-p9u")  # scenario validation
    sagemaker = aws.client("sagemaker")
    sagemaker.create_cluster(**_request())
    nodes = [n for n in all_nodes(sagemaker, "new-type") if n["InstanceType"] == f"ml.{NEW_TYPE}"]

    # The emulator's shapes: HyperPod's UltraServerInfo and EC2's topology, as the entry says.
    assert {n["UltraServerInfo"]["Type"] for n in nodes} == {"ml.u-p9ux64"}
    ultraservers = {n["UltraServerInfo"]["Id"] for n in nodes}
    assert len(ultraservers) == 2  # 16 instances, 8 per UltraServer
    clock.advance(1)
    ids = [n["InstanceId"] for n in nodes]
    topology = aws.client("ec2").describe_instance_topology(InstanceIds=ids)["Instances"]
    assert {len(item["NetworkNodes"]) for item in topology} == {3}
    assert {item["InstanceType"] for item in topology} == {NEW_TYPE}

    # The planner: a block partition, one block per UltraServer, the block size the entry's.
    described = sagemaker.describe_cluster(ClusterName="new-type")
    described.pop("ResponseMetadata")
    document = {"describe_cluster": described, "nodes": nodes, "instance_topology": topology}
    snapshot = build_snapshot(parse_snapshot_document(document), PlannerConfig(), "26.05")
    (partition,) = plan(snapshot).partitions
    assert partition.kind is TopologyKind.BLOCK
    assert partition.topology.kind is TopologyKind.BLOCK
    assert partition.topology.block_sizes == (8,)
    assert {block.name for block in partition.topology.blocks} == ultraservers

    # Kueue: the UltraServer Topology, and an example pod that takes all of a node's accelerators.
    (kueue_partition,) = snapshot.partitions
    kueue = plan_kueue(kueue_partition.nodes)
    (flavor,) = kueue.flavors
    assert (flavor.topology, flavor.instance_type_label) == (ULTRASERVER_TOPOLOGY, f"ml.{NEW_TYPE}")
    jobs = example_jobs(kueue, flavor, "queue")
    pod = jobs[f"{flavor.name}-job-preferred.yaml"]["spec"]["template"]["spec"]
    assert pod["containers"][0]["resources"] == {"limits": {"nvidia.com/gpu": 8}}
    assert kueue.warnings == ()
