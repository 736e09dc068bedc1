"""Builders for the emulator tests: cluster requests, and SQS queues subscribed to EventBridge rules."""

from __future__ import annotations

import json
from typing import Any

ROLE = "arn:aws:iam::123456789012:role/HyperPodExecRole"
LIFECYCLE = {"SourceS3Uri": "s3://sagemaker-us-east-1-123456789012/lifecycle/", "OnCreate": "on_create.sh"}


def group(name: str, instance_type: str, count: int, node_type: str = "Compute", **extra: Any) -> dict[str, Any]:
    slurm: dict[str, Any] = {"NodeType": node_type}
    if node_type == "Compute":
        slurm["PartitionNames"] = [extra.pop("partition", name)]
    return {
        "InstanceGroupName": name,
        "InstanceType": instance_type,
        "InstanceCount": count,
        "ExecutionRole": ROLE,
        "LifeCycleConfig": LIFECYCLE,
        "ThreadsPerCore": 1,
        "SlurmConfig": slurm,
        **extra,
    }


def cluster_request(name: str = "llm-train", *groups: dict[str, Any]) -> dict[str, Any]:
    """A CreateCluster request: a controller plus ``groups`` (by default 4 p5 and 18 p6e-gb200)."""
    chosen = list(groups) or [
        group("p5-train", "ml.p5.48xlarge", 4, partition="ml-p5"),
        group("gb200", "ml.p6e-gb200.36xlarge", 18, partition="ml-p6e"),
    ]
    return {
        "ClusterName": name,
        "InstanceGroups": [group("controller", "ml.m5.4xlarge", 1, node_type="Controller"), *chosen],
        "Orchestrator": {"Slurm": {"SlurmConfigStrategy": "Merge"}},
        "VpcConfig": {"SecurityGroupIds": ["sg-0123456789abcdef0"], "Subnets": ["subnet-0123456789abcdef0"]},
        "NodeRecovery": "Automatic",
    }


def all_nodes(sagemaker: Any, cluster: str, page_size: int = 100) -> list[dict[str, Any]]:
    paginator = sagemaker.get_paginator("list_cluster_nodes")
    pages = paginator.paginate(ClusterName=cluster, PaginationConfig={"PageSize": page_size})
    return [node for page in pages for node in page["ClusterNodeSummaries"]]


def subscribe(aws: Any, name: str, pattern: dict[str, Any]) -> str:
    """An SQS queue that receives what an EventBridge rule with ``pattern`` matches; returns its URL."""
    sqs, events = aws.client("sqs"), aws.client("events")
    url = sqs.create_queue(QueueName=name)["QueueUrl"]
    arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    events.put_rule(Name=name, EventPattern=json.dumps(pattern))
    events.put_targets(Rule=name, Targets=[{"Id": "queue", "Arn": arn}])
    return str(url)


def drain(aws: Any, url: str) -> list[dict[str, Any]]:
    """Every message now in the queue, parsed (the queue is emptied)."""
    sqs = aws.client("sqs")
    bodies: list[dict[str, Any]] = []
    while True:
        messages = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=0).get("Messages", [])
        if not messages:
            return bodies
        for message in messages:
            bodies.append(json.loads(message["Body"]))
            sqs.delete_message(QueueUrl=url, ReceiptHandle=message["ReceiptHandle"])
