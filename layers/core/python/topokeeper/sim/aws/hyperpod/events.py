"""The EventBridge events HyperPod sends: Cluster State Change (on every change of a cluster) and Cluster Node
Health Event (a node turning unhealthy or healthy again). CloudTrail's events for the API calls are the API's."""

from __future__ import annotations

from typing import TYPE_CHECKING

from topokeeper.sim.aws.events import HYPERPOD, EventEmitter
from topokeeper.sim.aws.hyperpod.shapes import Shapes
from topokeeper.sim.aws.protocol import epoch

if TYPE_CHECKING:
    from topokeeper.sim.aws.hyperpod.model import Cluster, ClusterNode


class HyperPodEvents:
    def __init__(self, emitter: EventEmitter, shapes: Shapes) -> None:
        self._events = emitter
        self._shapes = shapes

    def state_change(self, cluster: Cluster) -> None:
        described = self._shapes.describe(cluster)
        detail = {key: value for key, value in described.items() if key != "CreationTime"}
        detail["CreationTime"] = int(epoch(cluster.creation_time) * 1000)
        detail["FailureMessage"] = cluster.failure_message
        self._events.emit(
            HYPERPOD,
            source="aws.sagemaker",
            detail_type="SageMaker HyperPod Cluster State Change",
            detail=detail,
            resources=[cluster.arn],
        )

    def node_health(self, cluster: Cluster, node: ClusterNode, *, healthy: bool, reason: str) -> None:
        automatic = cluster.config.get("NodeRecovery", "Automatic") == "Automatic"
        if healthy:
            summary = {
                "HealthStatus": "Healthy",
                "HealthStatusReason": reason or "The node passed health checks and is healthy.",
                "RepairAction": "None",
                "Recommendation": "None",
            }
        else:
            summary = {
                "HealthStatus": "Unhealthy",
                "HealthStatusReason": reason
                or "HyperPod Health Monitoring Agent (HMA) has detected a fault on this node and it is unhealthy.",
                "RepairAction": "Replace" if automatic else "None",
                "Recommendation": "Please Replace the Faulty Node.",
            }
        self._events.emit(
            HYPERPOD,
            source="aws.sagemaker",
            detail_type="SageMaker HyperPod Cluster Node Health Event",
            detail={
                "ClusterName": cluster.name,
                "ClusterArn": cluster.arn,
                "InstanceId": node.instance_id,
                "Tags": {},
                "HealthSummary": summary,
            },
            resources=[cluster.arn],
        )
