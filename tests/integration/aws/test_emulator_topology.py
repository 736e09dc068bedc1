"""EC2 DescribeInstanceTopology as AWS answers it: limits, throttling, eventual consistency, layouts."""

from __future__ import annotations

import re
from datetime import UTC
from typing import Any

import pytest
from botocore.config import Config
from botocore.exceptions import ClientError

from tests.integration.aws.support import all_nodes, cluster_request, group
from topokeeper.domain.models import PlannerConfig
from topokeeper.engine.snapshot import build_snapshot, parse_snapshot_document
from topokeeper.sim.aws_emulator import AwsEmulator, ManualClock, NetworkLayout

NETWORK_NODE = re.compile(r"nn-[0-9a-f]{17}")
NO_RETRIES = Config(retries={"total_max_attempts": 1})


def _ec2(aws: AwsEmulator) -> Any:
    return aws.client("ec2", config=NO_RETRIES)


def _code(info: pytest.ExceptionInfo[ClientError]) -> str:
    return str(info.value.response["Error"]["Code"])


def _cluster(aws: AwsEmulator, *groups: dict[str, Any]) -> list[dict[str, Any]]:
    sagemaker = aws.client("sagemaker")
    sagemaker.create_cluster(**cluster_request("topo", *groups))
    return all_nodes(sagemaker, "topo")


def _pages(ec2: Any, clock: ManualClock | None = None, **kwargs: Any) -> list[dict[str, Any]]:
    """Every page of one DescribeInstanceTopology question (a second of the clock between pages)."""
    pages = [ec2.describe_instance_topology(**kwargs)]
    while token := pages[-1].get("NextToken"):
        if clock is not None:
            clock.advance(1)
        pages.append(ec2.describe_instance_topology(**kwargs, NextToken=token))
    return pages


def _items(ec2: Any, clock: ManualClock | None = None, **kwargs: Any) -> list[dict[str, Any]]:
    return [item for page in _pages(ec2, clock, **kwargs) for item in page["Instances"]]


def test_100_ids_answer_in_pages_of_20_and_101_are_refused(aws: AwsEmulator, clock: ManualClock) -> None:
    nodes = _cluster(aws, group("p5", "ml.p5.48xlarge", 100))
    ids = [n["InstanceId"] for n in nodes]
    ec2 = _ec2(aws)

    pages = _pages(ec2, clock, InstanceIds=ids[1:101])
    assert [len(page["Instances"]) for page in pages] == [20] * 5
    assert "NextToken" not in pages[-1]
    assert aws.calls["DescribeInstanceTopology"] == 5  # every page is a call against the 1/s bucket
    answer = {"Instances": [item for page in pages for item in page["Instances"]]}
    assert [i["InstanceId"] for i in answer["Instances"]] == sorted(ids[1:101])
    for item in answer["Instances"]:
        assert item["InstanceType"] == "p5.48xlarge"
        assert len(item["NetworkNodes"]) == 3
        assert all(NETWORK_NODE.fullmatch(n) for n in item["NetworkNodes"])
        assert (item["AvailabilityZone"], item["ZoneId"]) == ("us-east-1a", "use1-az1")
        assert "CapacityBlockId" not in item

    clock.advance(1)
    with pytest.raises(ClientError) as info:
        ec2.describe_instance_topology(InstanceIds=[*ids, "i-0123456789abcdef0"])
    assert _code(info) == "InvalidParameterValue"
    assert "instance-ids cannot contain over 100 values" in str(info.value)

    clock.advance(1)
    with pytest.raises(ClientError) as info:
        ec2.describe_instance_topology(InstanceIds=ids[:2], MaxResults=5)
    assert _code(info) == "InvalidParameterCombination"


def test_one_request_per_second_then_request_limit_exceeded(aws: AwsEmulator, clock: ManualClock) -> None:
    ec2 = _ec2(aws)
    ec2.describe_instance_topology()
    with pytest.raises(ClientError) as info:
        ec2.describe_instance_topology()
    assert _code(info) == "RequestLimitExceeded"
    assert info.value.response["ResponseMetadata"]["HTTPStatusCode"] == 503
    clock.advance(0.5)
    with pytest.raises(ClientError):
        ec2.describe_instance_topology()
    clock.advance(1.0)
    ec2.describe_instance_topology()
    assert aws.calls["DescribeInstanceTopology"] == 4  # throttled requests were received too


def test_pages_without_ids_and_run_instances_are_included(aws: AwsEmulator) -> None:
    aws.rate_limits.enabled = False
    nodes = _cluster(aws, group("p5", "ml.p5.48xlarge", 44))
    ec2 = _ec2(aws)
    launched = ec2.run_instances(ImageId="ami-12345678", MinCount=3, MaxCount=3, InstanceType="p5en.48xlarge")
    ec2_ids = {i["InstanceId"] for i in launched["Instances"]}

    pages = list(ec2.get_paginator("describe_instance_topology").paginate(PaginationConfig={"PageSize": 20}))
    seen = [i["InstanceId"] for page in pages for i in page["Instances"]]

    assert len(pages) == 3
    assert len(seen) == len(set(seen)) == 48
    assert set(seen) == {n["InstanceId"] for n in nodes} | ec2_ids
    default_page = ec2.describe_instance_topology()
    assert len(default_page["Instances"]) == 20
    p5en = ec2.describe_instance_topology(Filters=[{"Name": "instance-type", "Values": ["p5en*"]}])["Instances"]
    assert {i["InstanceId"] for i in p5en} == ec2_ids
    assert all(len(i["NetworkNodes"]) == 3 for i in p5en)
    controller = next(n["InstanceId"] for n in nodes if n["InstanceGroupName"] == "controller")
    cpu = ec2.describe_instance_topology(InstanceIds=[controller])["Instances"][0]
    assert cpu["InstanceType"] == "m5.4xlarge"
    assert "NetworkNodes" not in cpu  # not topology-capable


def test_topology_not_yet_available_after_launch(aws: AwsEmulator, clock: ManualClock) -> None:
    nodes = _cluster(aws, group("gb200", "ml.p6e-gb200.36xlarge", 2, partition="ml-p6e"))
    ec2 = _ec2(aws)
    aws.network.new_instance_delay_seconds = 30
    added, _ = aws.hyperpod.scale("topo", "gb200", 3)
    aws.network.hold(nodes[1]["InstanceId"], calls=1)

    ids = [nodes[1]["InstanceId"], *added]
    early = {i["InstanceId"]: i for i in ec2.describe_instance_topology(InstanceIds=ids)["Instances"]}
    assert early[added[0]]["NetworkNodes"] == []
    assert "CapacityBlockId" not in early[added[0]]
    assert early[nodes[1]["InstanceId"]]["NetworkNodes"] == []

    clock.advance(5)
    middle = {i["InstanceId"]: i for i in ec2.describe_instance_topology(InstanceIds=ids)["Instances"]}
    assert middle[added[0]]["NetworkNodes"] == []
    assert len(middle[nodes[1]["InstanceId"]]["NetworkNodes"]) == 3  # held for one answer only

    clock.advance(30)
    late = {i["InstanceId"]: i for i in ec2.describe_instance_topology(InstanceIds=ids)["Instances"]}
    assert late[added[0]]["NetworkNodes"] == late[nodes[1]["InstanceId"]]["NetworkNodes"]
    assert late[added[0]]["CapacityBlockId"] == late[nodes[1]["InstanceId"]]["CapacityBlockId"]


def test_layouts_layers_and_ultraservers() -> None:
    layout = NetworkLayout(nodes_per_leaf=2, leaves_per_spine=2, spines_per_core=2)
    with AwsEmulator(seed=3, clock=ManualClock(), layout=layout) as aws:
        aws.rate_limits.enabled = False
        nodes = _cluster(
            aws,
            group("p5", "ml.p5.48xlarge", 9, partition="ml-p5"),
            group("b200", "ml.p6-b200.48xlarge", 2, partition="ml-b200"),
            group("gb200", "ml.p6e-gb200.36xlarge", 20, partition="ml-p6e"),
        )
        ids = [n["InstanceId"] for n in nodes]
        items = {i["InstanceId"]: i for i in _items(_ec2(aws), InstanceIds=ids)}
        by_group: dict[str, list[dict[str, Any]]] = {}
        for node in nodes:
            by_group.setdefault(node["InstanceGroupName"], []).append(items[node["InstanceId"]])

        p5 = [tuple(i["NetworkNodes"]) for i in by_group["p5"]]
        assert len({path[2] for path in p5}) == 5  # 9 nodes, 2 per leaf
        assert len({path[1] for path in p5}) == 3  # 2 leaves per spine
        assert len({path[0] for path in p5}) == 2  # 2 spines per top node
        assert all(len(i["NetworkNodes"]) == 4 for i in by_group["b200"])
        gb = by_group["gb200"]
        blocks = {i["CapacityBlockId"] for i in gb}
        assert len(blocks) == 2  # 18 + 2
        for block in blocks:
            members = [i for i in gb if i["CapacityBlockId"] == block]
            assert len({tuple(i["NetworkNodes"]) for i in members}) == 1  # an UltraServer shares its leaf
        us_ids = {n["UltraServerInfo"]["Id"] for n in nodes if n["InstanceGroupName"] == "gb200"}
        assert len(us_ids) == 2


def test_hyperpod_nodes_can_be_hidden_from_ec2(aws: AwsEmulator, clock: ManualClock) -> None:
    """As if the nodes lived in SageMaker's service account: EC2 does not know their ids."""
    nodes = _cluster(aws)
    aws.network.expose_hyperpod_nodes = False
    ids = sorted(n["InstanceId"] for n in nodes[:3])
    with pytest.raises(ClientError) as info:
        _ec2(aws).describe_instance_topology(InstanceIds=ids)
    assert _code(info) == "InvalidInstanceID.NotFound"
    assert info.value.response["Error"]["Message"] == f"The instance IDs '{', '.join(ids)}' do not exist"

    # ... or, the other answer AWS might give, leaves them out silently
    aws.network.unknown_ids = "omit"
    clock.advance(1)
    assert _ec2(aws).describe_instance_topology(InstanceIds=ids)["Instances"] == []


def test_an_unknown_id_fails_the_whole_request(aws: AwsEmulator) -> None:
    nodes = _cluster(aws)
    known = nodes[1]["InstanceId"]
    with pytest.raises(ClientError) as info:
        _ec2(aws).describe_instance_topology(InstanceIds=[known, "i-0000000000000dead"])
    assert _code(info) == "InvalidInstanceID.NotFound"
    assert info.value.response["Error"]["Message"] == "The instance ID 'i-0000000000000dead' does not exist"


def test_the_planner_reads_what_the_emulator_answers(aws: AwsEmulator, clock: ManualClock) -> None:
    """The responses are exactly what topokeeper's snapshot parser consumes."""
    sagemaker = aws.client("sagemaker")
    nodes = _cluster(
        aws,
        group("p5-train", "ml.p5.48xlarge", 17, partition="ml-p5"),
        group("gb200", "ml.p6e-gb200.36xlarge", 36, partition="ml-p6e"),
        group("preprocess", "ml.c7i.4xlarge", 4, partition="preprocess"),
    )
    ids = [n["InstanceId"] for n in nodes]
    ec2 = _ec2(aws)
    topology = []
    for start in range(0, len(ids), 100):
        clock.advance(1)
        topology += _items(ec2, clock, InstanceIds=ids[start : start + 100])
    described = sagemaker.describe_cluster(ClusterName="topo")
    described.pop("ResponseMetadata")
    document = {"describe_cluster": described, "nodes": nodes, "instance_topology": topology}

    snapshot = build_snapshot(parse_snapshot_document(document), PlannerConfig())

    partitions = {p.name: p for p in snapshot.partitions}
    assert set(partitions) == {"ml-p5", "ml-p6e", "preprocess"}
    assert len(partitions["ml-p5"].nodes) == 17
    assert all(len(n.network_nodes) == 3 for n in partitions["ml-p5"].nodes)
    assert len({n.ultraserver_id for n in partitions["ml-p6e"].nodes}) == 2
    assert snapshot.warnings == ()


def test_without_ids_pages_hold_up_to_100_of_the_filtered_type(aws: AwsEmulator, clock: ManualClock) -> None:
    """The sweep topokeeper uses for a large gap: botocore checks MaxResults' minimum only, AWS the maximum."""
    nodes = _cluster(aws, group("p5", "ml.p5.48xlarge", 230), group("p5en", "ml.p5en.48xlarge", 30))
    ec2 = _ec2(aws)
    sweep = {"Filters": [{"Name": "instance-type", "Values": ["p5.48xlarge"]}], "MaxResults": 100}

    pages = _pages(ec2, clock, **sweep)

    assert [len(page["Instances"]) for page in pages] == [100, 100, 30]
    assert aws.calls["DescribeInstanceTopology"] == 3
    p5 = {n["InstanceId"] for n in nodes if n["InstanceType"] == "ml.p5.48xlarge"}
    assert [i["InstanceId"] for page in pages for i in page["Instances"]] == sorted(p5)
    for too_many in (101, 1000):
        clock.advance(1)
        with pytest.raises(ClientError) as info:
            ec2.describe_instance_topology(**{**sweep, "MaxResults": too_many})
        assert _code(info) == "InvalidParameterValue"
    clock.advance(1)
    with pytest.raises(ClientError) as info:
        ec2.describe_instance_topology(**sweep, InstanceIds=sorted(p5)[:5])
    assert _code(info) == "InvalidParameterCombination"


def test_ec2_topology_delay_runs_from_launch_not_from_the_first_question(aws: AwsEmulator, clock: ManualClock) -> None:
    # AWS reports a new instance's network nodes some time after its launch, whether anyone asked before or not:
    # an instance nobody asked about for longer than the delay is answered in full on the first question.
    aws.network.new_instance_delay_seconds = 30
    ec2 = _ec2(aws)
    (old,) = ec2.run_instances(ImageId="ami-12345678", MinCount=1, MaxCount=1, InstanceType="p5.48xlarge")["Instances"]
    assert old["LaunchTime"].replace(tzinfo=None) == clock.now().astimezone(UTC).replace(tzinfo=None, microsecond=0)
    clock.advance(40)
    (new,) = ec2.run_instances(ImageId="ami-12345678", MinCount=1, MaxCount=1, InstanceType="p5.48xlarge")["Instances"]
    clock.advance(10)
    answers = {
        i["InstanceId"]: i
        for i in ec2.describe_instance_topology(InstanceIds=[old["InstanceId"], new["InstanceId"]])["Instances"]
    }
    assert len(answers[old["InstanceId"]]["NetworkNodes"]) == 3
    assert answers[new["InstanceId"]]["NetworkNodes"] == []  # launched 10 s ago
    clock.advance(20)
    (late,) = ec2.describe_instance_topology(InstanceIds=[new["InstanceId"]])["Instances"]
    assert len(late["NetworkNodes"]) == 3
