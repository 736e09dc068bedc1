"""The HyperPod model through real boto3 clients: shapes, pagination, determinism, scaling, replacement."""

from __future__ import annotations

import base64
import re
from typing import Any

import pytest
from botocore.exceptions import ClientError, ParamValidationError

from tests.integration.aws.support import all_nodes, cluster_request, group
from topokeeper.sim.aws_emulator import ApiError, AwsEmulator, ManualClock

ARN = re.compile(r"arn:aws:sagemaker:us-east-1:123456789012:cluster/[a-z0-9]{12}")
INSTANCE_ID = re.compile(r"i-[0-9a-f]{17}")
HOSTNAME = re.compile(r"ip-10-1-(\d{1,3})-(\d{1,3})\.ec2\.internal")


def _error(info: pytest.ExceptionInfo[ClientError]) -> tuple[str, str]:
    error = info.value.response["Error"]
    return error["Code"], error["Message"]


def test_create_cluster_with_the_documented_request_shape(aws: AwsEmulator) -> None:
    sagemaker = aws.client("sagemaker")
    request = cluster_request(
        "ml-training-cluster",
        group("p5-train", "ml.p5.48xlarge", 2, partition="ml-p5"),
        group("gb200", "ml.p6e-gb200.36xlarge", 2, partition="ml-p6e"),
        group("preprocess", "ml.c7i.4xlarge", 1, partition="cpu"),
        group("login", "ml.m5.xlarge", 1, node_type="Login"),
    )
    request["Tags"] = [{"Key": "Project", "Value": "ML-Training"}]
    arn = sagemaker.create_cluster(**request)["ClusterArn"]  # botocore validates the request client-side

    assert ARN.fullmatch(arn)
    described = sagemaker.describe_cluster(ClusterName=arn)
    assert described["ClusterName"] == "ml-training-cluster"
    assert described["ClusterStatus"] == "InService"
    assert described["Orchestrator"] == {"Slurm": {"SlurmConfigStrategy": "Merge"}}
    groups = {g["InstanceGroupName"]: g for g in described["InstanceGroups"]}
    assert groups["controller"]["SlurmConfig"] == {"NodeType": "Controller"}
    assert groups["p5-train"]["SlurmConfig"] == {"NodeType": "Compute", "PartitionNames": ["ml-p5"]}
    assert (groups["p5-train"]["CurrentCount"], groups["p5-train"]["TargetCount"]) == (2, 2)
    assert {g["Status"] for g in groups.values()} == {"InService"}
    assert sagemaker.describe_cluster(ClusterName="ml-training-cluster")["ClusterArn"] == arn
    summaries = sagemaker.list_clusters()["ClusterSummaries"]
    assert [(s["ClusterName"], s["ClusterArn"], s["ClusterStatus"]) for s in summaries] == [
        ("ml-training-cluster", arn, "InService")
    ]


def test_botocore_rejects_a_request_it_can_check_and_the_emulator_what_aws_checks(aws: AwsEmulator) -> None:
    sagemaker = aws.client("sagemaker")
    broken = cluster_request()
    del broken["InstanceGroups"][0]["ExecutionRole"]
    with pytest.raises(ParamValidationError):
        sagemaker.create_cluster(**broken)  # required member: botocore's own validation
    with pytest.raises(ApiError, match="ExecutionRole"):
        aws.hyperpod.create_cluster(broken)  # the control API checks what boto3 would

    bad_type = cluster_request("c1", group("gpu", "ml.p9.96xlarge", 1))
    with pytest.raises(ClientError) as info:
        sagemaker.create_cluster(**bad_type)  # an enum: botocore does not check it, AWS does
    assert _error(info)[0] == "ValidationException"
    assert "ml.p9.96xlarge" in _error(info)[1]

    no_partition = cluster_request("c2", group("gpu", "ml.p5.48xlarge", 1))
    del no_partition["InstanceGroups"][1]["SlurmConfig"]["PartitionNames"]
    with pytest.raises(ClientError) as info:
        sagemaker.create_cluster(**no_partition)
    assert "PartitionNames is required" in _error(info)[1]

    two_controllers = cluster_request("c3", group("ctl2", "ml.m5.xlarge", 1, node_type="Controller"))
    with pytest.raises(ClientError) as info:
        sagemaker.create_cluster(**two_controllers)
    assert "Exactly one instance group must have NodeType Controller" in _error(info)[1]

    with pytest.raises(ClientError) as info:
        sagemaker.create_cluster(**cluster_request("bad_name!"))
    assert _error(info)[0] == "ValidationException"
    assert "regular expression pattern" in _error(info)[1]

    sagemaker.create_cluster(**cluster_request("taken"))
    with pytest.raises(ClientError) as info:
        sagemaker.create_cluster(**cluster_request("taken"))
    assert _error(info)[0] == "ResourceInUse"
    with pytest.raises(ClientError) as info:
        sagemaker.describe_cluster(ClusterName="missing")
    assert _error(info)[0] == "ResourceNotFound"


def test_pages_read_newest_first_and_a_listing_sees_nodes_launched_between_its_pages(aws: AwsEmulator) -> None:
    sagemaker = aws.client("sagemaker")
    sagemaker.create_cluster(**cluster_request("paged", group("p5", "ml.p5.48xlarge", 24)))
    oldest_first = [n["InstanceId"] for n in all_nodes(sagemaker, "paged", page_size=7)]
    pages = sagemaker.get_paginator("list_cluster_nodes").paginate(
        ClusterName="paged", SortOrder="Descending", PaginationConfig={"PageSize": 7}
    )
    assert [n["InstanceId"] for page in pages for n in page["ClusterNodeSummaries"]] == oldest_first[::-1]
    first = sagemaker.list_cluster_nodes(ClusterName="paged", MaxResults=20)
    added, _ = aws.hyperpod.scale("paged", "p5", 30)  # six more between the first page and the second
    second = sagemaker.list_cluster_nodes(ClusterName="paged", MaxResults=20, NextToken=first["NextToken"])
    listed = [n["InstanceId"] for n in first["ClusterNodeSummaries"] + second["ClusterNodeSummaries"]]
    assert listed == oldest_first + added and "NextToken" not in second


def test_a_token_of_another_sort_or_a_forged_one_is_a_validation_error(aws: AwsEmulator) -> None:
    sagemaker = aws.client("sagemaker")
    sagemaker.create_cluster(**cluster_request("tokens", group("p5", "ml.p5.48xlarge", 24)))
    by_name = sagemaker.list_cluster_nodes(ClusterName="tokens", SortBy="NAME", MaxResults=5)["NextToken"]
    forged = base64.urlsafe_b64encode(b'[[1], {"a": 2}]').decode()
    for token, sort in ((by_name, "CREATION_TIME"), (forged, "NAME"), (forged, "CREATION_TIME")):
        with pytest.raises(sagemaker.exceptions.ClientError, match="ValidationException"):
            sagemaker.list_cluster_nodes(ClusterName="tokens", SortBy=sort, MaxResults=5, NextToken=token)


def test_pagination_over_250_nodes_returns_each_node_once(aws: AwsEmulator) -> None:
    sagemaker = aws.client("sagemaker")
    sagemaker.create_cluster(**cluster_request("big", group("p5", "ml.p5.48xlarge", 249)))

    nodes = all_nodes(sagemaker, "big", page_size=100)

    assert len(nodes) == 250
    assert len({n["InstanceId"] for n in nodes}) == 250
    assert len({n["PrivateDnsHostname"] for n in nodes}) == 250
    assert aws.calls["ListClusterNodes"] == 3
    first = sagemaker.list_cluster_nodes(ClusterName="big")
    assert len(first["ClusterNodeSummaries"]) == 10  # AWS's default page is undocumented; 10 here
    assert "NextToken" in first
    descending = all_nodes(sagemaker, "big", page_size=7)
    assert [n["InstanceId"] for n in descending] == [n["InstanceId"] for n in nodes]
    newest_first = sagemaker.list_cluster_nodes(ClusterName="big", SortOrder="Descending", MaxResults=5)
    assert newest_first["ClusterNodeSummaries"][0]["InstanceId"] == nodes[-1]["InstanceId"]
    with pytest.raises(ClientError) as info:
        sagemaker.list_cluster_nodes(ClusterName="big", MaxResults=101)
    assert _error(info)[0] == "ValidationException"
    assert "less than or equal to 100" in _error(info)[1]
    only_p5 = sagemaker.list_cluster_nodes(ClusterName="big", InstanceGroupNameContains="p5", MaxResults=100)
    assert {n["InstanceGroupName"] for n in only_p5["ClusterNodeSummaries"]} == {"p5"}


def _node_shape_checks(node: dict[str, Any]) -> None:
    assert INSTANCE_ID.fullmatch(node["InstanceId"])
    match = HOSTNAME.fullmatch(node["PrivateDnsHostname"])
    assert match
    assert all(0 <= int(part) <= 255 for part in match.groups())
    assert node["InstanceStatus"]["Status"] == "Running"


def test_nodes_look_like_aws_and_ultraservers_are_reported(aws: AwsEmulator) -> None:
    sagemaker = aws.client("sagemaker")
    sagemaker.create_cluster(**cluster_request())
    nodes = all_nodes(sagemaker, "llm-train")
    for node in nodes:
        _node_shape_checks(node)
    gb200 = [n for n in nodes if n["InstanceType"] == "ml.p6e-gb200.36xlarge"]
    assert len({n["UltraServerInfo"]["Id"] for n in gb200}) == 1  # 18 instances fill one UltraServer
    assert {n["UltraServerInfo"]["Type"] for n in gb200} == {"ml.u-p6e-gb200x72"}
    assert all("UltraServerInfo" not in n for n in nodes if n not in gb200)

    details = sagemaker.describe_cluster_node(ClusterName="llm-train", NodeId=gb200[0]["InstanceId"])["NodeDetails"]
    assert details["PrivateDnsHostname"] == gb200[0]["PrivateDnsHostname"]
    assert details["PrivateDnsHostname"] == "ip-" + details["PrivatePrimaryIp"].replace(".", "-") + ".ec2.internal"
    assert details["Placement"] == {"AvailabilityZone": "us-east-1a", "AvailabilityZoneId": "use1-az1"}
    assert details["UltraServerInfo"] == gb200[0]["UltraServerInfo"]
    assert details["LifeCycleConfig"]["OnCreate"] == "on_create.sh"
    by_logical = sagemaker.describe_cluster_node(ClusterName="llm-train", NodeLogicalId=details["NodeLogicalId"])
    assert by_logical["NodeDetails"]["InstanceId"] == details["InstanceId"]


def _scenario(seed: int) -> list[tuple[str, str]]:
    with AwsEmulator(seed=seed, clock=ManualClock()) as aws:
        sagemaker = aws.client("sagemaker")
        sagemaker.create_cluster(**cluster_request())
        nodes = all_nodes(sagemaker, "llm-train")
        arn = sagemaker.describe_cluster(ClusterName="llm-train")["ClusterArn"]
        return [(arn, "")] + [(n["InstanceId"], n["PrivateDnsHostname"]) for n in nodes]


def test_ids_and_host_names_are_deterministic_per_seed() -> None:
    assert _scenario(11) == _scenario(11)
    assert _scenario(11) != _scenario(12)


def test_scale_up_and_down_with_update_cluster_and_the_control_api(aws: AwsEmulator) -> None:
    sagemaker = aws.client("sagemaker")
    sagemaker.create_cluster(**cluster_request())
    before = all_nodes(sagemaker, "llm-train")
    p5_before = [n["InstanceId"] for n in before if n["InstanceGroupName"] == "p5-train"]

    sagemaker.update_cluster(
        ClusterName="llm-train", InstanceGroups=[group("p5-train", "ml.p5.48xlarge", 6, partition="ml-p5")]
    )
    grown = [n["InstanceId"] for n in all_nodes(sagemaker, "llm-train") if n["InstanceGroupName"] == "p5-train"]
    assert grown[:4] == p5_before
    assert len(grown) == 6

    sagemaker.update_cluster(
        ClusterName="llm-train", InstanceGroups=[group("p5-train", "ml.p5.48xlarge", 3, partition="ml-p5")]
    )
    shrunk = [n["InstanceId"] for n in all_nodes(sagemaker, "llm-train") if n["InstanceGroupName"] == "p5-train"]
    assert shrunk == p5_before[:3]  # the newest nodes go first

    added, removed = aws.hyperpod.scale("llm-train", "gb200", 20)
    assert (len(added), removed) == (2, [])
    groups = {g["InstanceGroupName"]: g for g in sagemaker.describe_cluster(ClusterName="llm-train")["InstanceGroups"]}
    assert (groups["gb200"]["CurrentCount"], groups["gb200"]["TargetCount"]) == (20, 20)
    assert (groups["p5-train"]["CurrentCount"], groups["p5-train"]["TargetCount"]) == (3, 3)

    sagemaker.update_cluster(
        ClusterName="llm-train",
        InstanceGroups=[group("cpu", "ml.c7i.4xlarge", 2, partition="cpu")],
        InstanceGroupsToDelete=["p5-train"],
    )
    names = {n["InstanceGroupName"] for n in all_nodes(sagemaker, "llm-train")}
    assert names == {"controller", "gb200", "cpu"}
    with pytest.raises(ClientError) as info:
        sagemaker.update_cluster(
            ClusterName="llm-train", InstanceGroups=[group("cpu", "ml.m5.xlarge", 2, partition="cpu")]
        )
    assert "cannot be changed" in _error(info)[1]


def test_batch_delete_reports_unknown_ids_and_protects_the_controller(aws: AwsEmulator) -> None:
    sagemaker = aws.client("sagemaker")
    sagemaker.create_cluster(**cluster_request())
    nodes = all_nodes(sagemaker, "llm-train")
    controller = next(n["InstanceId"] for n in nodes if n["InstanceGroupName"] == "controller")
    worker = next(n["InstanceId"] for n in nodes if n["InstanceGroupName"] == "p5-train")

    result = sagemaker.batch_delete_cluster_nodes(
        ClusterName="llm-train", NodeIds=[worker, "i-0123456789abcdef0", controller]
    )

    assert result["Successful"] == [worker]
    failed = {f["NodeId"]: f["Code"] for f in result["Failed"]}
    assert failed == {"i-0123456789abcdef0": "NodeIdNotFound", controller: "InvalidNodeStatus"}
    remaining = {n["InstanceId"] for n in all_nodes(sagemaker, "llm-train")}
    assert worker not in remaining
    assert controller in remaining
    p5 = next(
        g
        for g in sagemaker.describe_cluster(ClusterName="llm-train")["InstanceGroups"]
        if g["InstanceGroupName"] == "p5-train"
    )
    assert (p5["CurrentCount"], p5["TargetCount"]) == (3, 3)

    listed = sagemaker.list_cluster_nodes(ClusterName="llm-train", IncludeNodeLogicalIds=True, MaxResults=3)
    logical = listed["ClusterNodeSummaries"][1]["NodeLogicalId"]
    by_logical = sagemaker.batch_delete_cluster_nodes(ClusterName="llm-train", NodeLogicalIds=[logical, "gone-1"])
    assert by_logical["SuccessfulNodeLogicalIds"] == [logical]
    assert [f["NodeLogicalId"] for f in by_logical["FailedNodeLogicalIds"]] == ["gone-1"]


def test_replace_keeps_the_host_name_and_changes_the_instance_id(aws: AwsEmulator) -> None:
    sagemaker = aws.client("sagemaker")
    sagemaker.create_cluster(**cluster_request())
    nodes = all_nodes(sagemaker, "llm-train")
    gb = next(n for n in nodes if n["InstanceGroupName"] == "gb200")
    p5 = next(n for n in nodes if n["InstanceGroupName"] == "p5-train")

    result = sagemaker.batch_replace_cluster_nodes(
        ClusterName="llm-train", NodeIds=[gb["InstanceId"], p5["InstanceId"], "i-0123456789abcdef0"]
    )

    assert result["Successful"] == [gb["InstanceId"], p5["InstanceId"]]
    assert result["Failed"][0]["ErrorCode"] == "InstanceIdNotFound"
    after = {n["PrivateDnsHostname"]: n for n in all_nodes(sagemaker, "llm-train")}
    assert len(after) == len(nodes)
    new_gb, new_p5 = after[gb["PrivateDnsHostname"]], after[p5["PrivateDnsHostname"]]
    assert new_gb["InstanceId"] != gb["InstanceId"]
    assert new_p5["InstanceId"] != p5["InstanceId"]
    assert new_gb["UltraServerInfo"]["Id"] != gb["UltraServerInfo"]["Id"]  # fresh hardware elsewhere
    assert aws.network.placement(new_p5["InstanceId"]).unit != aws.network.placement(nodes[2]["InstanceId"]).unit
    assert aws.hyperpod.node(new_gb["InstanceId"]).replaces == gb["InstanceId"]

    old_leaf = aws.network.placement(new_p5["InstanceId"])
    replaced = aws.hyperpod.replace(new_p5["InstanceId"], move=False)
    assert aws.network.placement(replaced[new_p5["InstanceId"]]).network_nodes == old_leaf.network_nodes


def test_reboot_keeps_the_node_and_counts(aws: AwsEmulator) -> None:
    sagemaker = aws.client("sagemaker")
    sagemaker.create_cluster(**cluster_request())
    node = all_nodes(sagemaker, "llm-train")[1]["InstanceId"]
    result = sagemaker.batch_reboot_cluster_nodes(ClusterName="llm-train", NodeIds=[node])
    assert result == {"Successful": [node], "Failed": [], "ResponseMetadata": result["ResponseMetadata"]}
    assert aws.hyperpod.node(node).reboots == 1
    assert node in {n["InstanceId"] for n in all_nodes(sagemaker, "llm-train")}


def test_set_status_shows_in_list_cluster_nodes_and_delete_cluster(aws: AwsEmulator) -> None:
    sagemaker = aws.client("sagemaker")
    arn = sagemaker.create_cluster(**cluster_request())["ClusterArn"]
    node = all_nodes(sagemaker, "llm-train")[2]["InstanceId"]
    aws.hyperpod.set_status(node, "Failure", "NvidiaErrorTerminate")
    status = next(n for n in all_nodes(sagemaker, "llm-train") if n["InstanceId"] == node)["InstanceStatus"]
    assert status == {"Status": "Failure", "Message": "NvidiaErrorTerminate"}
    with pytest.raises(ValueError, match="ClusterInstanceStatus"):
        aws.hyperpod.set_status(node, "Failed")

    assert sagemaker.delete_cluster(ClusterName="llm-train")["ClusterArn"] == arn
    assert sagemaker.list_clusters()["ClusterSummaries"] == []


def test_each_group_s_current_count_is_its_listed_nodes_through_scaling_replacement_and_deletion(
    aws: AwsEmulator,
) -> None:
    sagemaker = aws.client("sagemaker")
    sagemaker.create_cluster(**cluster_request())

    def counts() -> tuple[dict[str, int], dict[str, int]]:
        described = sagemaker.describe_cluster(ClusterName="llm-train")["InstanceGroups"]
        listed: dict[str, int] = {}
        for node in all_nodes(sagemaker, "llm-train"):
            listed[node["InstanceGroupName"]] = listed.get(node["InstanceGroupName"], 0) + 1
        return {g["InstanceGroupName"]: g["CurrentCount"] for g in described if g["CurrentCount"]}, listed

    aws.hyperpod.scale("llm-train", "p5-train", 6)
    worker = next(n["InstanceId"] for n in all_nodes(sagemaker, "llm-train") if n["InstanceGroupName"] == "p5-train")
    sagemaker.batch_replace_cluster_nodes(ClusterName="llm-train", NodeIds=[worker])
    described, listed = counts()
    assert described == listed and listed["p5-train"] == 6
    sagemaker.batch_delete_cluster_nodes(ClusterName="llm-train", NodeIds=[worker])  # replaced: no longer listed
    aws.hyperpod.scale("llm-train", "p5-train", 2)
    described, listed = counts()
    assert described == listed and listed["p5-train"] == 2
