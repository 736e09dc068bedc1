"""EventBridge patterns (one source for the CDK stack, the simulator and the tests) and Parser models.

Models are lenient where AWS samples are sloppy (epoch-millisecond times, placeholder ARNs, unknown
keys) and strict where safety depends on it (instance ids, command ids, applier documents).
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Annotated, Any

from aws_lambda_powertools.utilities.parser.models import EventBridgeModel
from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field

from topokeeper.contract.constants import (
    CLOUDTRAIL_DETAIL_TYPE,
    CLOUDTRAIL_SERVICE_EVENT_DETAIL_TYPE,
    HYPERPOD_SOURCE,
    INSTANCE_ID,
    MANAGED_TOPOLOGY_EVENT,
    RUN_SHELL_DOCUMENT,
)
from topokeeper.contract.ports import ApplyResult
from topokeeper.wire import AGENT_DETAIL_TYPES, AGENT_SOURCE

HYPERPOD_DETAIL_TYPES = (
    "SageMaker HyperPod Cluster State Change",
    "SageMaker HyperPod Cluster Node Health Event",
    "SageMaker HyperPod Cluster Event",
)
CLOUDTRAIL_EVENT_NAMES = (
    "CreateCluster",
    "UpdateCluster",
    "DeleteCluster",
    "BatchDeleteClusterNodes",
    "BatchReplaceClusterNodes",
    "BatchRebootClusterNodes",
    "UpdateClusterSoftware",
    "BatchAddClusterNodes",
    "MoveClusterNodes",  # names a source and a target cluster: both change
)
MOVE_CLUSTER_NODES = "MoveClusterNodes"
EC2_STATE_DETAIL_TYPE = "EC2 Instance State-change Notification"
EC2_STATES = ("pending", "running", "stopping", "stopped", "shutting-down", "terminated")
SSM_INVOCATION_DETAIL_TYPE = "EC2 Command Invocation Status-change Notification"
SSM_TERMINAL_STATUSES = ("Success", "Failed", "TimedOut", "Cancelled", "Undeliverable", "Terminated")


def change_patterns() -> dict[str, dict[str, Any]]:
    """Rules whose events mean "a cluster may have changed" -> the ingest function."""
    return {
        "HyperPodEvents": {"source": [HYPERPOD_SOURCE], "detail-type": list(HYPERPOD_DETAIL_TYPES)},
        "HyperPodApiCalls": {
            "source": [HYPERPOD_SOURCE],
            "detail-type": [CLOUDTRAIL_DETAIL_TYPE],
            "detail": {
                "eventSource": ["sagemaker.amazonaws.com"],
                "eventName": list(CLOUDTRAIL_EVENT_NAMES),
                "errorCode": [{"exists": False}],
            },
        },
        "HyperPodTopologyUpdates": {
            "source": [HYPERPOD_SOURCE],
            "detail-type": [CLOUDTRAIL_DETAIL_TYPE, CLOUDTRAIL_SERVICE_EVENT_DETAIL_TYPE],
            "detail": {
                "eventSource": ["sagemaker.amazonaws.com"],
                "eventName": [MANAGED_TOPOLOGY_EVENT],
                "errorCode": [{"exists": False}],
            },
        },
        "Ec2InstanceStates": {
            "source": ["aws.ec2"],
            "detail-type": [EC2_STATE_DETAIL_TYPE],
            "detail": {"state": list(EC2_STATES)},
        },
    }


def result_patterns(head_nodes: list[str]) -> dict[str, dict[str, Any]]:
    """Rules whose events carry a delivery outcome -> the result function."""
    patterns: dict[str, dict[str, Any]] = {
        # Every cluster's source and the legacy one; the result function sorts them out.
        "AgentResults": {
            "source": [{"prefix": AGENT_SOURCE}],
            "detail-type": list(AGENT_DETAIL_TYPES),
        }
    }
    if head_nodes:
        patterns["SsmCommandResults"] = {
            "source": ["aws.ssm"],
            "detail-type": [SSM_INVOCATION_DETAIL_TYPE],
            "detail": {
                "document-name": [RUN_SHELL_DOCUMENT],
                "instance-id": sorted(head_nodes),
                "status": list(SSM_TERMINAL_STATUSES),
            },
        }
    return patterns


def _epoch_millis(value: Any) -> Any:
    if isinstance(value, int | float):
        try:
            return datetime.fromtimestamp(value / 1000, tz=UTC)
        except (OverflowError, OSError, ValueError):  # past year 9999, or NaN
            raise ValueError(f"not a time in epoch milliseconds: {value!r}") from None
    return value


EpochMillis = Annotated[datetime, BeforeValidator(_epoch_millis)]
_COMMAND_ID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def _instance_id(value: str) -> str:
    if not INSTANCE_ID.fullmatch(value):
        raise ValueError(f"not an EC2 instance id: {value!r}")
    return value


def _command_id(value: str) -> str:
    if not _COMMAND_ID.fullmatch(value):
        raise ValueError(f"not an SSM command id: {value!r}")
    return value


# The detail models are built on first use (``defer_build``): an event needs one of them, and every function
# imports this module (its names), most never validating a detail.
class _Lenient(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True, defer_build=True)


class ClusterStateDetail(_Lenient):
    ClusterArn: str
    ClusterName: str
    ClusterStatus: str | None = None
    CreationTime: EpochMillis | None = None


class NodeHealthDetail(_Lenient):
    ClusterArn: str | None = None
    ClusterName: str
    InstanceId: str | None = None  # documentation samples carry invalid ids; only used for logs


class ClusterEventDetails(_Lenient):
    ClusterArn: str | None = None
    ClusterName: str
    EventTime: EpochMillis | None = None
    ResourceType: str | None = None
    Description: str | None = None


class ClusterEventDetail(_Lenient):
    EventDetails: ClusterEventDetails


class CloudTrailDetail(_Lenient):
    eventSource: str
    eventName: str
    eventID: str | None = None
    requestParameters: dict[str, Any] | None = None
    responseElements: dict[str, Any] | None = None
    serviceEventDetails: dict[str, Any] | None = None  # a service event's parameters
    errorCode: str | None = None


class Ec2StateDetail(_Lenient):
    instance_id: Annotated[str, AfterValidator(_instance_id)] = Field(alias="instance-id")
    state: str


class SsmInvocationDetail(_Lenient):
    command_id: Annotated[str, AfterValidator(_command_id)] = Field(alias="command-id")
    instance_id: str = Field(alias="instance-id")
    document_name: str = Field(alias="document-name")
    status: str


class AgentResultDetail(BaseModel):
    model_config = ConfigDict(extra="allow", defer_build=True)  # built on first use, as the detail models above
    cluster: str
    plan_sha256: str | None = None
    etag: str | None = None
    version_id: str | None = None
    host: str | None = None
    result: ApplyResult
    verify_request: str | None = None  # the backend's verify request this verify answers (agent.py)

    @property
    def references(self) -> set[str]:
        """The S3 object the agent applied, as the agent channel names a delivery (version id, else ETag)."""
        return {ref for ref in (self.version_id, (self.etag or "").strip('"')) if ref}

    @property
    def reference(self) -> str:
        """The one name the agent channel gives this object's delivery (``AgentChannel.deliver``)."""
        return self.version_id or (self.etag or "").strip('"')


class TopokeeperEvent(EventBridgeModel):
    """Any event our rules deliver; ``detail`` is parsed per detail-type by the services."""

    detail: dict[str, Any]


# A deferred reconcile (debounce, write interval, delivery in flight) returns its message to the queue,
# which SQS counts as a receive: allow many before the dead-letter queue, which is for poison messages.
WORK_QUEUE_MAX_RECEIVES = 50
