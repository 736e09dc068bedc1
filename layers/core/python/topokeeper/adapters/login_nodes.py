"""The login nodes of a HyperPod or plain-EC2 cluster, the ledger of the targets topokeeper registered (their
``UpdateLoginTargets`` records go through ``topokeeper.adapters.audit_trail.AuditTrail`` like every record), and
the ledger of the host identity installs sent to EC2 login nodes (one per instance launch)."""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime, timedelta
from typing import Any

from botocore.exceptions import ClientError

from topokeeper.adapters.aws import aws_errors, error_code
from topokeeper.adapters.ec2 import described_instance
from topokeeper.adapters.hyperpod import legacy_provisioning_parameters
from topokeeper.contract.errors import InputError
from topokeeper.contract.ports import InstallClaim, LaunchedInstance, LoginNode

LOGIN_NODE_TYPE = "Login"
# The login sync's word for a node that serves (HyperPod's InstanceStatus); EC2's "running" maps to it.
RUNNING_STATUS = "Running"
log = logging.getLogger("topokeeper")


class HyperPodLoginNodes:
    """The instance group with ``SlurmConfig.NodeType`` Login (legacy: ``login_group`` in
    provisioning_parameters.json); each node's IP from DescribeClusterNode (ListClusterNodes has none)."""

    def __init__(self, sagemaker: Any, s3: Any) -> None:
        self._sagemaker = sagemaker
        self._s3 = s3

    def login_nodes(self, cluster: str) -> list[LoginNode] | None:
        with aws_errors():
            described = self._sagemaker.describe_cluster(ClusterName=cluster)
        group = self._login_group(described.get("InstanceGroups", []))
        if group is None:
            return None
        nodes: list[LoginNode] = []
        with aws_errors():
            paginator = self._sagemaker.get_paginator("list_cluster_nodes")
            pages = paginator.paginate(
                ClusterName=cluster, InstanceGroupNameContains=group, PaginationConfig={"PageSize": 100}
            )
            for page in pages:
                for summary in page.get("ClusterNodeSummaries", []):
                    if summary.get("InstanceGroupName") != group:  # "Contains" also matches longer names
                        continue
                    details = self._sagemaker.describe_cluster_node(ClusterName=cluster, NodeId=summary["InstanceId"])[
                        "NodeDetails"
                    ]
                    nodes.append(
                        LoginNode(
                            node_id=str(details["InstanceId"]),
                            private_ip=details.get("PrivatePrimaryIp"),
                            status=str(details.get("InstanceStatus", {}).get("Status", "")),
                        )
                    )
        return nodes

    def _login_group(self, groups: list[dict[str, Any]]) -> str | None:
        for group in groups:
            if (group.get("SlurmConfig") or {}).get("NodeType") == LOGIN_NODE_TYPE:
                return str(group["InstanceGroupName"])
        with aws_errors():
            found = legacy_provisioning_parameters(self._s3, groups)
        login_group = found[0].get("login_group") if found else None
        return str(login_group) if login_group else None


class DynamoLoginLedger:
    """One item per cluster in the state table: ``pk=CLUSTER#<name>``, ``sk=LOGIN#TARGETS``."""

    def __init__(self, dynamodb: Any, table: str) -> None:
        self._db = dynamodb
        self._table = table

    @staticmethod
    def _key(cluster: str) -> dict[str, Any]:
        return {"pk": {"S": f"CLUSTER#{cluster}"}, "sk": {"S": "LOGIN#TARGETS"}}

    def managed(self, cluster: str) -> frozenset[str]:
        with aws_errors():
            item = self._db.get_item(TableName=self._table, Key=self._key(cluster), ConsistentRead=True).get("Item")
        return frozenset(json.loads(item["ips"]["S"])) if item else frozenset()

    def record(self, cluster: str, ips: frozenset[str]) -> None:
        item = {**self._key(cluster), "ips": {"S": json.dumps(sorted(ips))}}
        with aws_errors():
            self._db.put_item(TableName=self._table, Item=item)


class Ec2LoginNodes:
    """A plain-EC2 cluster's login nodes: the instances whose ``login_tag`` is the cluster's name (pages of
    DescribeInstances with one tag filter, no call per node); their IPs from DescribeInstances."""

    def __init__(self, ec2: Any, login_tag: str) -> None:
        self._ec2 = ec2
        self._tag = login_tag

    def login_nodes(self, cluster: str) -> list[LoginNode]:
        if set(cluster) & {"*", "?"}:  # EC2 filter wildcards would match other clusters' login nodes
            raise InputError("cluster", f"a login tag value may not contain * or ? (EC2 filter wildcards): {cluster!r}")
        nodes: list[LoginNode] = []
        with aws_errors():
            pages = self._ec2.get_paginator("describe_instances").paginate(
                Filters=[{"Name": f"tag:{self._tag}", "Values": [cluster]}]
            )
            for page in pages:
                for reservation in page.get("Reservations", []):
                    for instance in reservation.get("Instances", []):
                        state = str(instance.get("State", {}).get("Name", ""))
                        nodes.append(
                            LoginNode(
                                node_id=str(instance["InstanceId"]),
                                private_ip=instance.get("PrivateIpAddress"),
                                status=RUNNING_STATUS if state == "running" else state,
                            )
                        )
        return sorted(nodes, key=lambda node: node.node_id)


def launched_instance(ec2: Any, instance_id: str) -> LaunchedInstance | None:
    """The instance an EC2 state-change event names, or None while DescribeInstances does not know it yet."""
    instance = described_instance(ec2, instance_id)
    if instance is None:
        return None
    launched = instance["LaunchTime"]
    return LaunchedInstance(
        instance_id=str(instance["InstanceId"]),
        state=str(instance.get("State", {}).get("Name", "")),
        launch_time=launched if isinstance(launched, datetime) else datetime.fromisoformat(str(launched)),
        tags={tag["Key"]: tag["Value"] for tag in instance.get("Tags", [])},
        private_ip=instance.get("PrivateIpAddress"),
    )


class DynamoLoginInstallLedger:
    """One item per launch of an EC2 login node in the state table: ``pk=CLUSTER#<name>``,
    ``sk=LOGIN#INSTALL#<instance>#<launch time>``; ``state`` claimed, sent or released (nothing deletes items).

    A claim older than ``lease`` (the function's timeout: its holder is gone) may be taken over."""

    def __init__(self, dynamodb: Any, table: str, lease: timedelta, retention: timedelta = timedelta(days=30)) -> None:
        self._db = dynamodb
        self._table = table
        self._lease = lease
        self._retention = retention

    @staticmethod
    def _key(cluster: str, instance_id: str, launch_time: datetime) -> dict[str, Any]:
        launched = launch_time.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        return {"pk": {"S": f"CLUSTER#{cluster}"}, "sk": {"S": f"LOGIN#INSTALL#{instance_id}#{launched}"}}

    def _item(self, key: dict[str, Any], state: str, now: datetime, **extra: str) -> dict[str, Any]:
        expires = str(int((now + self._retention).timestamp()))
        item = {**key, "state": {"S": state}, "at": {"N": str(int(now.timestamp()))}, "expires_at": {"N": expires}}
        return item | {name: {"S": value} for name, value in extra.items()}

    def claim(self, cluster: str, instance_id: str, launch_time: datetime, now: datetime) -> InstallClaim:
        key = self._key(cluster, instance_id, launch_time)
        stale = str(int((now - self._lease).timestamp()))
        condition = "attribute_not_exists(pk) OR #state = :released OR (#state = :claimed AND #at < :stale)"
        values = {":released": {"S": "released"}, ":claimed": {"S": "claimed"}, ":stale": {"N": stale}}
        if self._put_if(self._item(key, "claimed", now), condition, values):
            return InstallClaim.CLAIMED
        with aws_errors():
            item = self._db.get_item(TableName=self._table, Key=key, ConsistentRead=True).get("Item", {})
        return InstallClaim.SENT if item.get("state", {}).get("S") == "sent" else InstallClaim.IN_FLIGHT

    def sent(self, cluster: str, instance_id: str, launch_time: datetime, command_id: str, now: datetime) -> None:
        item = self._item(self._key(cluster, instance_id, launch_time), "sent", now, command_id=command_id)
        with aws_errors():
            self._db.put_item(TableName=self._table, Item=item)

    def release(self, cluster: str, instance_id: str, launch_time: datetime, now: datetime) -> None:
        """After a failed send: the retry may claim at once."""
        item = self._item(self._key(cluster, instance_id, launch_time), "released", now)
        self._put_if(item, "#state = :claimed", {":claimed": {"S": "claimed"}})

    def _put_if(self, item: dict[str, Any], condition: str, values: dict[str, Any]) -> bool:
        """PutItem under ``condition``; False when the condition does not hold."""
        names = {name: name[1:] for name in ("#state", "#at") if name in condition}
        try:
            self._db.put_item(
                TableName=self._table,
                Item=item,
                ConditionExpression=condition,
                ExpressionAttributeNames=names,
                ExpressionAttributeValues=values,
            )
        except ClientError as error:
            if error_code(error) == "ConditionalCheckFailedException":
                return False
            with aws_errors():
                raise
        return True
