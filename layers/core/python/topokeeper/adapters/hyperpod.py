"""SageMaker HyperPod facts: DescribeCluster, ListClusterNodes, DescribeClusterNode, legacy mapping.

The result is the same ``AwsSnapshot`` a user writes with three CLI calls, so ``topokeeper plan`` and
the reconcile function plan from identical input.
"""

from __future__ import annotations

import json
import logging
from typing import Any
from urllib.parse import urlparse

from botocore.exceptions import ClientError

from topokeeper.adapters.ec2 import InstanceTopologyReader
from topokeeper.domain.catalog import Capability, lookup
from topokeeper.engine.snapshot import AwsSnapshot

LEGACY_MAPPING_FILE = "provisioning_parameters.json"
log = logging.getLogger("topokeeper")
TOPOLOGY_STATUSES = frozenset({"Running", "SystemUpdating", "DeepHealthCheckInProgress"})


def provisioning_parameters_object(lifecycle_uri: str) -> tuple[str, str]:
    """(bucket, key) of provisioning_parameters.json for a group's LifeCycleConfig.SourceS3Uri."""
    parsed = urlparse(lifecycle_uri)
    key = parsed.path.strip("/")
    if not key.endswith(LEGACY_MAPPING_FILE):
        key = f"{key}/{LEGACY_MAPPING_FILE}".lstrip("/")
    return parsed.netloc, key


class HyperPodFacts:
    def __init__(self, sagemaker: Any, s3: Any, topology: InstanceTopologyReader) -> None:
        self._sagemaker = sagemaker
        self._s3 = s3
        self._topology = topology

    def read(self, cluster: str) -> AwsSnapshot:
        described = self._sagemaker.describe_cluster(ClusterName=cluster)
        described.pop("ResponseMetadata", None)
        # Kubernetes names an EKS cluster's nodes by instance id: host names (one call per node) are a Slurm need.
        eks = "Eks" in (described.get("Orchestrator") or {})
        nodes = [node if eks else self._complete(cluster, node) for node in self._list_nodes(cluster)]
        # Only running instances report topology; asking for others spends the 1-per-second bucket.
        capable = [
            node["InstanceId"]
            for node in nodes
            if node.get("InstanceStatus", {}).get("Status") in TOPOLOGY_STATUSES
            and lookup(node["InstanceType"]).capability is not Capability.NONE
        ]
        return AwsSnapshot.model_validate(
            {
                "describe_cluster": described,
                "nodes": nodes,
                "instance_topology": self._topology.read(
                    cluster, capable, {node["InstanceId"]: str(node.get("LaunchTime", "")) for node in nodes}
                ),
                "slurm": {"partitions": {} if eks else self._legacy_mapping(described)},
            }
        )

    def _list_nodes(self, cluster: str) -> list[dict[str, Any]]:
        nodes: list[dict[str, Any]] = []
        paginator = self._sagemaker.get_paginator("list_cluster_nodes")
        for page in paginator.paginate(ClusterName=cluster, PaginationConfig={"PageSize": 100}):
            nodes.extend(page.get("ClusterNodeSummaries", []))
        return nodes

    def _complete(self, cluster: str, node: dict[str, Any]) -> dict[str, Any]:
        """Ask DescribeClusterNode only for what the list lacks: the host name, or an UltraServer id."""
        ultraserver = lookup(node["InstanceType"]).capability is Capability.ULTRASERVER
        if node.get("PrivateDnsHostname") and (node.get("UltraServerInfo") or not ultraserver):
            return node
        details = self._sagemaker.describe_cluster_node(ClusterName=cluster, NodeId=node["InstanceId"])["NodeDetails"]
        return {**node, **{key: value for key, value in details.items() if value}}

    def _legacy_mapping(self, described: dict[str, Any]) -> dict[str, str]:
        """Clusters configured before API-driven Slurm keep partitions in the lifecycle bucket."""
        parameters = legacy_provisioning_parameters(self._s3, described.get("InstanceGroups", []))
        return {
            str(worker["instance_group_name"]): str(worker["partition_name"])
            for worker in (parameters or {}).get("worker_groups", [])
            if worker.get("instance_group_name") and worker.get("partition_name")
        }


def legacy_provisioning_parameters(s3: Any, groups: list[dict[str, Any]]) -> dict[str, Any] | None:
    """provisioning_parameters.json of a cluster configured before API-driven Slurm (no SlurmConfig): the
    first group's lifecycle bucket that has one. None for API-driven clusters and when no group has one."""
    if any(group.get("SlurmConfig") for group in groups):
        return None
    for group in groups:
        uri = (group.get("LifeCycleConfig") or {}).get("SourceS3Uri")
        if not uri:
            continue
        bucket, key = provisioning_parameters_object(uri)
        try:
            body = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
        except ClientError as error:
            # No file, or (without s3:ListBucket, which the stack does not grant) 403 for a missing one:
            # this group's lifecycle scripts carry no mapping. The planner warns of unmapped groups.
            code = error.response.get("Error", {}).get("Code")
            if code in ("NoSuchKey", "404", "NotFound", "AccessDenied", "403"):
                log.warning("no legacy partition mapping at s3://%s/%s: %s", bucket, key, code)
                continue
            raise
        parameters: dict[str, Any] = json.loads(body)
        return parameters
    return None
