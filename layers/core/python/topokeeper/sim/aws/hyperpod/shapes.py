"""HyperPod's response shapes: DescribeCluster, ClusterNodeSummary, ClusterNodeDetails, UltraServerInfo.

Keys are the ones botocore's SageMaker model declares, so a response carries what the configuration gave and AWS
would echo, and nothing botocore would not parse.
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any

from botocore.model import Shape

from topokeeper.domain.catalog import lookup
from topokeeper.sim.aws.network import NetworkModel, zone_id
from topokeeper.sim.aws.protocol import service_model

if TYPE_CHECKING:
    from topokeeper.sim.aws.hyperpod.model import Cluster, ClusterNode, InstanceGroup


def sagemaker_shape(shape: str) -> Shape:
    model = service_model("sagemaker")
    if model is None:
        raise RuntimeError("botocore has no SageMaker model")
    return model.shape_for(shape)


class Shapes:
    """Builds the responses; placements (leaf, UltraServer) come from the network model."""

    def __init__(self, network: NetworkModel) -> None:
        self._network = network
        self._group_detail_keys = frozenset(sagemaker_shape("ClusterInstanceGroupDetails").members)
        self._describe_keys = frozenset(sagemaker_shape("DescribeClusterResponse").members)

    def group_details(self, group: InstanceGroup, current_count: int) -> dict[str, Any]:
        details = {k: copy.deepcopy(v) for k, v in group.spec.items() if k in self._group_detail_keys}
        if "MinInstanceCount" in group.spec:
            details["MinCount"] = group.spec["MinInstanceCount"]
        details["CurrentCount"] = current_count
        details["TargetCount"] = group.target_count
        details["Status"] = group.status
        return details

    def describe(self, cluster: Cluster) -> dict[str, Any]:
        counts = cluster.sizes  # kept as nodes come and go: every state-change event describes the cluster
        result: dict[str, Any] = {
            "ClusterArn": cluster.arn,
            "ClusterName": cluster.name,
            "ClusterStatus": cluster.status,
            "CreationTime": cluster.creation_time,
            "InstanceGroups": [self.group_details(g, counts[g.name]) for g in cluster.groups.values()],
        }
        if cluster.failure_message:
            result["FailureMessage"] = cluster.failure_message
        for key, value in cluster.config.items():
            if key in self._describe_keys and key not in result:
                result[key] = copy.deepcopy(value)
        return result

    def ultraserver(self, node: ClusterNode) -> dict[str, str] | None:
        placement = self._network.placement(node.instance_id)
        ultraserver = lookup(node.instance_type).ultraserver
        if placement is None or placement.ultraserver_id is None or ultraserver is None:
            return None
        return {"Id": placement.ultraserver_id, "Type": ultraserver.type}

    def summary(self, node: ClusterNode, *, logical_ids: bool = False) -> dict[str, Any]:
        summary: dict[str, Any] = {
            "InstanceGroupName": node.group,
            "InstanceId": node.instance_id,
            "InstanceType": node.instance_type,
            "LaunchTime": node.launch_time,
            "InstanceStatus": {"Status": node.status, "Message": node.message},
            "PrivateDnsHostname": node.hostname,
        }
        if logical_ids:
            summary["NodeLogicalId"] = node.logical_id
        ultraserver = self.ultraserver(node)
        if ultraserver:
            summary["UltraServerInfo"] = ultraserver
        return summary

    def details(self, cluster: Cluster, node: ClusterNode) -> dict[str, Any]:
        spec = cluster.groups[node.group].spec
        details: dict[str, Any] = {
            "InstanceGroupName": node.group,
            "InstanceId": node.instance_id,
            "NodeLogicalId": node.logical_id,
            "InstanceStatus": {"Status": node.status, "Message": node.message},
            "InstanceType": node.instance_type,
            "LaunchTime": node.launch_time,
            "PrivatePrimaryIp": node.private_ip,
            "PrivateDnsHostname": node.hostname,
            "Placement": {
                "AvailabilityZone": node.availability_zone,
                "AvailabilityZoneId": zone_id(node.availability_zone),
            },
            "CapacityType": "OnDemand",
        }
        for key in ("LifeCycleConfig", "ThreadsPerCore", "InstanceStorageConfigs", "OverrideVpcConfig"):
            if key in spec:
                details[key] = copy.deepcopy(spec[key])
        ultraserver = self.ultraserver(node)
        if ultraserver:
            details["UltraServerInfo"] = ultraserver
        return details
