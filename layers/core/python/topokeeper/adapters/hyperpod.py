"""SageMaker HyperPod facts: DescribeCluster, ListClusterNodes, DescribeClusterNode, legacy mapping.

The result is the same ``AwsSnapshot`` a user writes with three CLI calls, so ``topokeeper plan`` and
the reconcile function plan from identical input.
"""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

from botocore.exceptions import ClientError

from topokeeper.adapters.aws import aws_errors, error_code
from topokeeper.adapters.ec2 import InstanceTopologyReader, not_visible_warning, undescribed_warning
from topokeeper.contract.errors import InputError
from topokeeper.domain.catalog import Capability, lookup

if TYPE_CHECKING:  # the login sync uses this module but never reads a cluster's facts
    from topokeeper.engine.snapshot import AwsSnapshot

LEGACY_MAPPING_FILE = "provisioning_parameters.json"
LEGACY_MAPPING_MAX_BYTES = 1024 * 1024
log = logging.getLogger("topokeeper")
TOPOLOGY_STATUSES = frozenset({"Running", "SystemUpdating", "DeepHealthCheckInProgress"})


def provisioning_parameters_object(lifecycle_uri: str) -> tuple[str, str]:
    """(bucket, key) of provisioning_parameters.json for a group's LifeCycleConfig.SourceS3Uri."""
    parsed = urlparse(lifecycle_uri)
    key = parsed.path.strip("/")
    if not key.endswith(LEGACY_MAPPING_FILE):
        key = f"{key}/{LEGACY_MAPPING_FILE}".lstrip("/")
    return parsed.netloc, key


def list_cluster_nodes(sagemaker: Any, cluster: str) -> list[dict[str, Any]]:
    """Every ListClusterNodes summary of ``cluster`` (pages of 100)."""
    nodes: list[dict[str, Any]] = []
    paginator = sagemaker.get_paginator("list_cluster_nodes")
    for page in paginator.paginate(ClusterName=cluster, PaginationConfig={"PageSize": 100}):
        nodes.extend(page.get("ClusterNodeSummaries", []))
    return nodes


def topology_candidates(nodes: list[dict[str, Any]]) -> list[str]:
    """The instance ids worth a DescribeInstanceTopology question: only running instances of a type with network
    topology report it, and asking for others spends the 1-per-second bucket."""
    return [
        node["InstanceId"]
        for node in nodes
        if node.get("InstanceStatus", {}).get("Status") in TOPOLOGY_STATUSES
        and lookup(node["InstanceType"]).capability is not Capability.NONE
    ]


class HyperPodFacts:
    def __init__(self, sagemaker: Any, s3: Any, topology: InstanceTopologyReader) -> None:
        self._sagemaker = sagemaker
        self._s3 = s3
        self._topology = topology

    @aws_errors()
    def read(self, cluster: str) -> AwsSnapshot:
        described = self._sagemaker.describe_cluster(ClusterName=cluster)
        described.pop("ResponseMetadata", None)
        # Kubernetes names an EKS cluster's nodes by instance id: host names (one call per node) are a Slurm need.
        eks = "Eks" in (described.get("Orchestrator") or {})
        nodes = [
            node if eks else self._complete(cluster, node) for node in list_cluster_nodes(self._sagemaker, cluster)
        ]
        capable = topology_candidates(nodes)
        topology = self._topology.read(
            cluster,
            capable,
            {node["InstanceId"]: str(node.get("LaunchTime", "")) for node in nodes},
            {node["InstanceId"]: str(node["InstanceType"]) for node in nodes},
        )
        from topokeeper.engine.snapshot import AwsSnapshot  # noqa: PLC0415 - loaded at init by the functions that read facts

        return AwsSnapshot.model_validate(
            {
                "describe_cluster": described,
                "nodes": nodes,
                "instance_topology": topology,
                "slurm": {"partitions": {} if eks else self._legacy_mapping(described)},
                "warnings": not_visible_warning(self._topology.not_visible)
                + undescribed_warning(self._topology.undescribed, len(capable)),
                "undescribed": len(self._topology.undescribed),
            }
        )

    def _complete(self, cluster: str, node: dict[str, Any]) -> dict[str, Any]:
        """Ask DescribeClusterNode only for what the list lacks: the host name, or an UltraServer id."""
        ultraserver = lookup(node["InstanceType"]).capability is Capability.ULTRASERVER
        if node.get("PrivateDnsHostname") and (node.get("UltraServerInfo") or not ultraserver):
            return node
        details = self._sagemaker.describe_cluster_node(ClusterName=cluster, NodeId=node["InstanceId"])["NodeDetails"]
        return {**node, **{key: value for key, value in details.items() if value}}

    def _legacy_mapping(self, described: dict[str, Any]) -> dict[str, str]:
        """Clusters configured before API-driven Slurm keep partitions in the lifecycle bucket."""
        found = legacy_provisioning_parameters(self._s3, described.get("InstanceGroups", []))
        return legacy_partitions(*found) if found else {}


def legacy_provisioning_parameters(s3: Any, groups: list[dict[str, Any]]) -> tuple[dict[str, Any], str] | None:
    """provisioning_parameters.json of a cluster configured before API-driven Slurm (no SlurmConfig), with the
    S3 object it came from: the first group's lifecycle bucket that has one. None for API-driven clusters and
    when no group has one. At most 1 MB is read; a file that is not a JSON object is one ``InputError`` naming
    the object (retrying cannot fix the file)."""
    if any(group.get("SlurmConfig") for group in groups):
        return None
    for group in groups:
        uri = (group.get("LifeCycleConfig") or {}).get("SourceS3Uri")
        if not uri:
            continue
        bucket, key = provisioning_parameters_object(uri)
        try:
            # One byte over the limit tells a file that is too large from one that just fits.
            response = s3.get_object(Bucket=bucket, Key=key, Range=f"bytes=0-{LEGACY_MAPPING_MAX_BYTES}")
            body = response["Body"].read(LEGACY_MAPPING_MAX_BYTES + 1)
        except ClientError as error:
            # No file, or (without s3:ListBucket, which the stack does not grant) 403 for a missing one:
            # this group's lifecycle scripts carry no mapping. The planner warns of unmapped groups.
            code = error_code(error)
            if code in ("NoSuchKey", "404", "NotFound", "AccessDenied", "403"):
                log.warning("no legacy partition mapping at s3://%s/%s: %s", bucket, key, code)
                continue
            raise
        source = f"s3://{bucket}/{key}"
        if len(body) > LEGACY_MAPPING_MAX_BYTES:
            raise InputError(
                source, f"larger than {LEGACY_MAPPING_MAX_BYTES} bytes; not a provisioning_parameters.json"
            )
        try:
            parameters = json.loads(body)
        except (UnicodeDecodeError, json.JSONDecodeError) as error:
            raise InputError(source, f"not valid JSON: {error}") from error
        if not isinstance(parameters, dict):
            raise InputError(source, "must be a JSON object")
        return parameters, source
    return None


def legacy_partitions(parameters: dict[str, Any], source: str) -> dict[str, str]:
    """``worker_groups[].{instance_group_name, partition_name}`` of a provisioning_parameters.json; anything
    malformed is one ``InputError`` naming the S3 object and the field."""
    workers = parameters.get("worker_groups", [])
    if not isinstance(workers, list):
        raise InputError(f"{source}:worker_groups", "must be a list")
    mapping: dict[str, str] = {}
    for index, worker in enumerate(workers):
        if not isinstance(worker, dict):
            raise InputError(f"{source}:worker_groups[{index}]", "must be an object")
        group, partition = worker.get("instance_group_name"), worker.get("partition_name")
        for name, value in (("instance_group_name", group), ("partition_name", partition)):
            if value is not None and not isinstance(value, str):
                raise InputError(f"{source}:worker_groups[{index}].{name}", "must be a string")
        if group and partition:
            mapping[group] = partition
    return mapping
