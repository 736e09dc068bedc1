"""The login nodes of a HyperPod cluster and the ledger of the targets topokeeper registered (their
``UpdateLoginTargets`` records go through ``topokeeper.adapters.audit_trail.AuditTrail`` like every record)."""

from __future__ import annotations

import json
import logging
from typing import Any

from topokeeper.adapters.aws import aws_errors
from topokeeper.adapters.hyperpod import legacy_provisioning_parameters
from topokeeper.ports import LoginNode

LOGIN_NODE_TYPE = "Login"
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
