"""HyperPod's clusters, instance groups and nodes, and the changes to them: the operations behind the API
(``api``), and the control the simulator drives directly (``scale``, ``replace``, ``set_status``, ...).

Changes take effect at once: a cluster is ``InService`` as soon as it is created, new nodes are
``Running``, deleted nodes are gone. Their EC2 topology can be held back with the network model.
Every change emits HyperPod's events (``events``); responses are built by ``shapes``.
"""

from __future__ import annotations

import copy
import ipaddress
import re
import threading
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from topokeeper.domain.catalog import hyperpod_offers
from topokeeper.sim.aws.clock import Clock
from topokeeper.sim.aws.events import EventEmitter
from topokeeper.sim.aws.hyperpod.events import HyperPodEvents
from topokeeper.sim.aws.hyperpod.managed_topology import ManagedTopology
from topokeeper.sim.aws.hyperpod.shapes import Shapes, sagemaker_shape
from topokeeper.sim.aws.ids import IdFactory
from topokeeper.sim.aws.network import NetworkModel, Placement
from topokeeper.sim.aws.protocol import ApiError, operation_model, validate_input

NODE_STATUSES = (
    "Running",
    "Failure",
    "Pending",
    "ShuttingDown",
    "SystemUpdating",
    "DeepHealthCheckInProgress",
    "NotFound",
    "DetachInProgress",
    "AttachInProgress",
)
# Node statuses whose nodes HyperPod keeps in slurm.conf (and in the topology it manages).
SLURM_LISTED_STATUSES = ("Running", "Pending", "SystemUpdating", "DeepHealthCheckInProgress")
# Accepted besides botocore's ClusterInstanceType enum (the project's examples use ml.c7i.4xlarge).
EXTRA_INSTANCE_TYPES = re.compile(r"ml\.c7i\.(large|xlarge|\d+xlarge|metal-\d+xl)")
_SLURM_NODE_TYPES = ("Controller", "Login", "Compute")


@dataclass
class ClusterNode:
    """One HyperPod node. ``replaces`` is the instance it replaced, if any."""

    instance_id: str
    logical_id: str
    cluster: str
    group: str
    instance_type: str
    private_ip: str
    hostname: str
    launch_time: datetime
    availability_zone: str
    sequence: int
    status: str = "Running"
    message: str = ""
    reboots: int = 0
    replaces: str | None = None

    @property
    def slurm_name(self) -> str:
        return self.hostname.split(".", 1)[0]

    def copy(self) -> ClusterNode:
        """What ``dataclasses.replace(node)`` gives (every field is immutable), at a fifth of its cost: the
        simulator reads a thousand-node cluster's nodes for every event."""
        node = object.__new__(ClusterNode)
        node.__dict__.update(self.__dict__)
        return node


@dataclass
class InstanceGroup:
    name: str
    spec: dict[str, Any]  # the ClusterInstanceGroupSpecification as last given
    status: str = "InService"

    @property
    def instance_type(self) -> str:
        return str(self.spec.get("InstanceType", ""))

    @property
    def target_count(self) -> int:
        return int(self.spec.get("InstanceCount", 0))

    @property
    def node_type(self) -> str | None:
        slurm = self.spec.get("SlurmConfig") or {}
        return slurm.get("NodeType")


@dataclass
class Cluster:
    name: str
    arn: str
    creation_time: datetime
    config: dict[str, Any]  # VpcConfig, Orchestrator, NodeRecovery, Tags, ... as given
    groups: dict[str, InstanceGroup] = field(default_factory=dict)
    nodes: dict[str, ClusterNode] = field(default_factory=dict)
    # instance id -> (Slurm name, group) of every node in ``nodes``, kept with it: the simulator reads it per event.
    members: dict[str, tuple[str, str]] = field(default_factory=dict)
    sizes: Counter[str] = field(default_factory=Counter)  # group -> its nodes in ``nodes``, kept with it (per event)
    changes: int = 0  # nodes launched and dropped: a cached listing of ``nodes`` holds while it stays
    status: str = "InService"
    failure_message: str = ""

    @property
    def cluster_id(self) -> str:
        return self.arn.rsplit("/", 1)[-1]

    def group_nodes(self, group: str) -> list[ClusterNode]:
        return sorted((n for n in self.nodes.values() if n.group == group), key=lambda n: n.sequence)


class HyperPodModel:
    """HyperPod clusters of the emulator's account and region."""

    def __init__(
        self,
        *,
        account_id: str,
        region: str,
        availability_zone: str,
        clock: Clock,
        ids: IdFactory,
        network: NetworkModel,
        events: EventEmitter,
        lock: threading.RLock,
        subnet: str = "10.1.0.0/16",
    ) -> None:
        self.account_id = account_id
        self.region = region
        self.availability_zone = availability_zone
        self.replace_moves = True  # a replacement lands on another leaf / UltraServer when there is room
        self.replace_new_ip = False  # a replacement gets another private IP (as a login node's may)
        self.extra_instance_types = EXTRA_INSTANCE_TYPES
        # A cluster created before API-driven Slurm (no SlurmConfig): group -> partition, what its lifecycle
        # scripts write into slurm.conf from its provisioning_parameters.json (by cluster name).
        self.lifecycle_partitions: dict[str, dict[str, str]] = {}
        self._clock = clock
        self._ids = ids
        self._network = network
        self.emitter = events  # CloudTrail's events for API calls go here too (``api``)
        self.lock = lock
        self.shapes = Shapes(network)
        self._events = HyperPodEvents(events, self.shapes)
        # HyperPod writing the Slurm topology itself, for the clusters the simulator switches it on for.
        self.managed_topology = ManagedTopology(self, network, events, ids, clock)
        self._subnet = ipaddress.ip_network(subnet)
        self._ip_rng = ids.rng("private-ip")
        self._used_ips: set[str] = set()
        self._clusters: dict[str, Cluster] = {}
        self._node_cluster: dict[str, str] = {}
        self._sequence = 0
        self._allowed_types = frozenset(sagemaker_shape("ClusterInstanceType").enum)

    # ================================================================ reading

    def node(self, node_id: str) -> ClusterNode:
        """A copy of the node (by instance id)."""
        with self.lock:
            return self._node(node_id).copy()

    def nodes(self, cluster: str, group: str | None = None) -> list[ClusterNode]:
        """Copies of a cluster's nodes (or one group's), oldest first."""
        with self.lock:
            found = self.cluster(cluster)
            return [
                n.copy() for n in sorted(found.nodes.values(), key=lambda n: n.sequence) if group in (None, n.group)
            ]

    def membership(self, cluster: str) -> dict[str, tuple[str, str]]:
        """Instance id -> (Slurm name, group) of a cluster's nodes, as ``nodes`` lists them (no order)."""
        with self.lock:
            return dict(self.cluster(cluster).members)

    def slurm_members(self, cluster: str) -> dict[str, list[ClusterNode]]:
        """Partition -> copies of the nodes HyperPod lists in it in slurm.conf, by Slurm name."""
        with self.lock:
            found = self.cluster(cluster)
            members: dict[str, list[ClusterNode]] = {}
            for group in found.groups.values():
                for partition in self._partitions(found.name, group):
                    members.setdefault(partition, [])
            for node in sorted(found.nodes.values(), key=lambda n: n.slurm_name):
                if node.status not in SLURM_LISTED_STATUSES:
                    continue
                for partition in self._partitions(found.name, found.groups[node.group]):
                    members[partition].append(node.copy())
            return members

    def _partitions(self, cluster: str, group: InstanceGroup) -> list[str]:
        slurm = group.spec.get("SlurmConfig")
        if slurm is None:
            partition = self.lifecycle_partitions.get(cluster, {}).get(group.name)
            return [partition] if partition else []
        return list(slurm.get("PartitionNames") or [])

    def describe_cluster(self, cluster: str) -> dict[str, Any]:
        """DescribeCluster's response."""
        with self.lock:
            return self.shapes.describe(self.cluster(cluster))

    # ================================================================ control

    def create_cluster(self, request: Mapping[str, Any]) -> str:
        """CreateCluster with a request as boto3 takes it (and validated as AWS would); returns the ARN."""
        request = copy.deepcopy(dict(request))
        validate_request("CreateCluster", request, client_checks=True)
        with self.lock:
            name = str(request.get("ClusterName", ""))
            if name in self._clusters:
                raise ApiError("ResourceInUse", f"Cluster with name {name} already exists.")
            groups = request.get("InstanceGroups") or []
            self._check_groups(groups, request.get("Orchestrator"))
            arn = f"arn:aws:sagemaker:{self.region}:{self.account_id}:cluster/{self._ids.cluster_suffix()}"
            config = {k: v for k, v in request.items() if k not in ("ClusterName", "InstanceGroups")}
            cluster = Cluster(name=name, arn=arn, creation_time=self._clock.now(), config=config)
            self._clusters[name] = cluster
            for spec in groups:
                cluster.groups[spec["InstanceGroupName"]] = InstanceGroup(spec["InstanceGroupName"], spec)
                for _ in range(int(spec["InstanceCount"])):
                    self._launch(cluster, spec["InstanceGroupName"])
            self._events.state_change(cluster)
            self.managed_topology.nodes_changed(name)
            return arn

    def update_cluster(self, request: Mapping[str, Any]) -> str:
        """UpdateCluster: groups in ``InstanceGroups`` are updated (scaled to InstanceCount) or added,
        ``InstanceGroupsToDelete`` are removed with their nodes."""
        request = copy.deepcopy(dict(request))
        validate_request("UpdateCluster", request, client_checks=True)
        with self.lock:
            cluster = self.cluster(str(request.get("ClusterName", "")))
            updates = {spec["InstanceGroupName"]: spec for spec in request.get("InstanceGroups") or []}
            deletes = list(request.get("InstanceGroupsToDelete") or [])
            self._check_update(cluster, updates, deletes)
            prospective = {name: group.spec for name, group in cluster.groups.items() if name not in deletes}
            prospective.update(updates)
            orchestrator = request.get("Orchestrator", cluster.config.get("Orchestrator"))
            self._check_groups(list(prospective.values()), orchestrator, changed=set(updates))
            for key in ("Orchestrator", "NodeRecovery", "NodeProvisioningMode", "ClusterRole", "AutoScaling"):
                if key in request:
                    cluster.config[key] = request[key]
            for name in deletes:
                for node in cluster.group_nodes(name):
                    self._remove(cluster, node)
                del cluster.groups[name]
            for name, spec in updates.items():
                if name in cluster.groups:
                    cluster.groups[name].spec = spec
                else:
                    cluster.groups[name] = InstanceGroup(name, spec)
                self._scale_to(cluster, name, int(spec["InstanceCount"]))
            self._events.state_change(cluster)
            self.managed_topology.nodes_changed(cluster.name)
            return cluster.arn

    @staticmethod
    def _check_update(cluster: Cluster, updates: Mapping[str, Mapping[str, Any]], deletes: list[str]) -> None:
        for name in deletes:
            if name not in cluster.groups:
                raise ApiError("ValidationException", f"Instance group {name} does not exist in the cluster.")
            if cluster.groups[name].node_type == "Controller":
                raise ApiError("ValidationException", f"Instance group {name} is the Slurm controller group.")
            if name in updates:
                raise ApiError("ValidationException", f"Instance group {name} is both updated and deleted.")
        for name, spec in updates.items():
            old = cluster.groups.get(name)
            if old is None:
                continue
            if spec.get("InstanceType", old.instance_type) != old.instance_type:
                raise ApiError("ValidationException", f"InstanceType of instance group {name} cannot be changed.")
            if (spec.get("SlurmConfig") or {}).get("NodeType", old.node_type) != old.node_type:
                raise ApiError("ValidationException", f"SlurmConfig.NodeType of instance group {name} is immutable.")

    def delete_cluster(self, cluster: str) -> str:
        with self.lock:
            found = self.cluster(cluster)
            found.status = "Deleting"
            self._events.state_change(found)
            for node in list(found.nodes.values()):
                self._remove(found, node)
            del self._clusters[found.name]
            self.managed_topology.forget(found.name)
            return found.arn

    def scale(self, cluster: str, group: str, count: int) -> tuple[list[str], list[str]]:
        """Set a group's instance count; returns (added, removed) instance ids. Newest nodes go first."""
        if count < 0:
            raise ValueError("count must be >= 0")
        with self.lock:
            found = self.cluster(cluster)
            if group not in found.groups:
                raise KeyError(group)
            found.groups[group].spec["InstanceCount"] = count
            added, removed = self._scale_to(found, group, count)
            self._events.state_change(found)
            self.managed_topology.nodes_changed(found.name)
            return added, removed

    def delete_nodes(self, cluster: str, node_ids: Iterable[str]) -> tuple[list[str], list[dict[str, str]]]:
        """BatchDeleteClusterNodes: (Successful, Failed). The group's target count drops with each node."""
        with self.lock:
            found = self.cluster(cluster)
            successful: list[str] = []
            failed: list[dict[str, str]] = []
            for node_id in dict.fromkeys(node_ids):
                node = found.nodes.get(node_id)
                if node is None:
                    failed.append(
                        {"Code": "NodeIdNotFound", "Message": f"Node {node_id} not found.", "NodeId": node_id}
                    )
                elif found.groups[node.group].node_type == "Controller":
                    message = f"Node {node_id} is a Slurm controller node and cannot be deleted."
                    failed.append({"Code": "InvalidNodeStatus", "Message": message, "NodeId": node_id})
                else:
                    spec = found.groups[node.group].spec
                    spec["InstanceCount"] = max(0, int(spec["InstanceCount"]) - 1)
                    self._remove(found, node)
                    successful.append(node_id)
            if successful:
                self._events.state_change(found)
                self.managed_topology.nodes_changed(found.name)
            return successful, failed

    def replace(
        self, node_ids: str | Iterable[str], *, move: bool | None = None, new_ip: bool = False
    ) -> dict[str, str]:
        """Replace nodes: same host name and IP (unless ``new_ip``), a new instance id, and with ``move`` (default
        ``replace_moves``) a slot on another leaf or UltraServer, else the same slot. Returns {old: new}."""
        ids = [node_ids] if isinstance(node_ids, str) else list(node_ids)
        with self.lock:
            replaced: dict[str, str] = {}
            for node_id in dict.fromkeys(ids):
                old = self._node(node_id)
                cluster = self._clusters[old.cluster]
                placement = self._network.placement(old.instance_id)
                should_move = self.replace_moves if move is None else move
                new = self._launch(
                    cluster,
                    old.group,
                    ip=None if new_ip or self.replace_new_ip else old.private_ip,
                    move_from=placement if should_move else None,
                    replaces=old.instance_id,
                    release_first=not should_move,
                )
                replaced[node_id] = new.instance_id
                self.managed_topology.nodes_changed(cluster.name)
            return replaced

    def reboot(self, node_ids: str | Iterable[str]) -> list[str]:
        ids = [node_ids] if isinstance(node_ids, str) else list(node_ids)
        with self.lock:
            for node_id in ids:
                self._node(node_id).reboots += 1
            return ids

    def set_status(self, node_id: str, status: str, message: str = "") -> None:
        """Set a node's InstanceStatus. Failure emits a Node Health Event (Unhealthy); leaving Failure for
        Running emits one (Healthy)."""
        if status not in NODE_STATUSES:
            raise ValueError(f"not a ClusterInstanceStatus: {status!r} (one of {', '.join(NODE_STATUSES)})")
        with self.lock:
            node = self._node(node_id)
            previous = node.status
            node.status = status
            node.message = message
            cluster = self._clusters[node.cluster]
            if status == "Failure" and previous != "Failure":
                self._events.node_health(cluster, node, healthy=False, reason=message)
            elif status == "Running" and previous == "Failure":
                self._events.node_health(cluster, node, healthy=True, reason=message)

    # ================================================================ internals

    def cluster(self, name_or_arn: str) -> Cluster:
        """The cluster itself (not a copy), by name or ARN; hold ``lock``."""
        name = name_or_arn
        if name_or_arn.startswith("arn:"):
            name = next((c.name for c in self._clusters.values() if c.arn == name_or_arn), "")
        found = self._clusters.get(name)
        if found is None:
            raise ApiError("ResourceNotFound", f"Cluster {name_or_arn} not found.")
        return found

    def all_clusters(self) -> list[Cluster]:
        """The clusters themselves (not copies); hold ``lock``."""
        return list(self._clusters.values())

    def _node(self, node_id: str) -> ClusterNode:
        cluster = self._node_cluster.get(node_id)
        if cluster is None:
            raise KeyError(f"no HyperPod node {node_id}")
        return self._clusters[cluster].nodes[node_id]

    def _allowed(self, instance_type: str) -> bool:
        """botocore's enum, or a type the catalog knows HyperPod offers (one newer than the installed botocore)."""
        return (
            instance_type in self._allowed_types
            or hyperpod_offers(instance_type)
            or bool(self.extra_instance_types.fullmatch(instance_type))
        )

    def _check_groups(
        self, groups: list[dict[str, Any]], orchestrator: Mapping[str, Any] | None, changed: set[str] | None = None
    ) -> None:
        names = [g["InstanceGroupName"] for g in groups]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ApiError("ValidationException", f"Instance group names must be unique: {', '.join(duplicates)}")
        for group in groups:
            if changed is not None and group["InstanceGroupName"] not in changed:
                continue
            instance_type = group.get("InstanceType")
            if not instance_type:
                raise ApiError(
                    "ValidationException", f"Instance group {group['InstanceGroupName']} has no InstanceType."
                )
            if not self._allowed(instance_type):
                raise ApiError(
                    "ValidationException",
                    f"1 validation error detected: Value '{instance_type}' at 'instanceGroups.member.instanceType' "
                    "failed to satisfy constraint: Member must satisfy enum value set",
                )
        self._check_slurm(groups, orchestrator)

    @staticmethod
    def _check_slurm(groups: list[dict[str, Any]], orchestrator: Mapping[str, Any] | None) -> None:
        """API-driven Slurm: one Controller group, at most one Login, one partition per Compute group."""
        if orchestrator is not None and len([k for k in ("Eks", "Slurm") if k in orchestrator]) != 1:
            raise ApiError("ValidationException", "You must provide exactly one orchestrator configuration.")
        with_slurm = [g for g in groups if g.get("SlurmConfig")]
        if not with_slurm:
            return
        if len(with_slurm) != len(groups):
            raise ApiError("ValidationException", "SlurmConfig must be set on every instance group or on none.")
        if orchestrator is not None and "Eks" in orchestrator:
            raise ApiError("ValidationException", "SlurmConfig is only supported for Slurm-orchestrated clusters.")
        kinds = [g["SlurmConfig"].get("NodeType") for g in groups]
        if kinds.count("Controller") != 1:
            raise ApiError("ValidationException", "Exactly one instance group must have NodeType Controller.")
        if kinds.count("Login") > 1:
            raise ApiError("ValidationException", "At most one instance group can have NodeType Login.")
        for group in groups:
            slurm = group["SlurmConfig"]
            partitions = slurm.get("PartitionNames") or []
            if slurm.get("NodeType") not in _SLURM_NODE_TYPES:
                raise ApiError("ValidationException", f"Unknown NodeType {slurm.get('NodeType')!r}.")
            if slurm["NodeType"] == "Compute" and not partitions:
                raise ApiError(
                    "ValidationException", f"PartitionNames is required for Compute group {group['InstanceGroupName']}."
                )
            if slurm["NodeType"] != "Compute" and partitions:
                raise ApiError(
                    "ValidationException", f"PartitionNames is not allowed for {slurm['NodeType']} node types."
                )

    def _allocate_ip(self) -> str:
        network = int(self._subnet.network_address)
        for _ in range(100_000):
            offset = self._ip_rng.randrange(4, self._subnet.num_addresses - 1)
            if offset % 256 in (0, 255):
                continue
            candidate = str(ipaddress.ip_address(network + offset))
            if candidate not in self._used_ips:
                self._used_ips.add(candidate)
                return candidate
        raise RuntimeError(f"subnet {self._subnet} is full")

    def _dns_suffix(self) -> str:
        return "ec2.internal" if self.region == "us-east-1" else f"{self.region}.compute.internal"

    def _launch(
        self,
        cluster: Cluster,
        group: str,
        *,
        ip: str | None = None,
        move_from: Placement | None = None,
        replaces: str | None = None,
        release_first: bool = False,
    ) -> ClusterNode:
        spec = cluster.groups[group].spec
        same_as = None
        if replaces is not None and release_first:
            same_as = self._network.placement(replaces)
            self._drop(cluster, cluster.nodes[replaces], keep_ip=True)
        instance_id = self._ids.instance_id()
        private_ip = ip or self._allocate_ip()
        self._sequence += 1
        node = ClusterNode(
            instance_id=instance_id,
            logical_id=self._ids.uuid("node-logical-id"),
            cluster=cluster.name,
            group=group,
            instance_type=str(spec["InstanceType"]),
            private_ip=private_ip,
            hostname=f"ip-{private_ip.replace('.', '-')}.{self._dns_suffix()}",
            launch_time=self._clock.now(),
            availability_zone=self.availability_zone,
            sequence=self._sequence,
            replaces=replaces,
        )
        self._network.place(
            instance_id, node.instance_type, node.availability_zone, move_from=move_from, same_as=same_as
        )
        if replaces is not None and not release_first:
            self._drop(cluster, cluster.nodes[replaces], keep_ip=True)
        cluster.nodes[instance_id] = node
        cluster.members[instance_id] = (node.slurm_name, group)
        cluster.sizes[group] += 1
        cluster.changes += 1
        self._node_cluster[instance_id] = cluster.name
        return node

    def _drop(self, cluster: Cluster, node: ClusterNode, *, keep_ip: bool) -> None:
        self._network.release(node.instance_id)
        if cluster.nodes.pop(node.instance_id, None) is not None:
            cluster.sizes[node.group] -= 1
        cluster.members.pop(node.instance_id, None)
        cluster.changes += 1
        self._node_cluster.pop(node.instance_id, None)
        if not keep_ip:
            self._used_ips.discard(node.private_ip)

    def _remove(self, cluster: Cluster, node: ClusterNode) -> None:
        self._drop(cluster, node, keep_ip=False)

    def _scale_to(self, cluster: Cluster, group: str, count: int) -> tuple[list[str], list[str]]:
        size = cluster.sizes[group]
        added = [self._launch(cluster, group).instance_id for _ in range(count - size)]
        removed = []
        for node in reversed(cluster.group_nodes(group)[count:] if count < size else []):
            self._remove(cluster, node)
            removed.append(node.instance_id)
        return added, removed


def validate_request(operation: str, params: Mapping[str, Any], *, client_checks: bool = False) -> None:
    # ClusterInstanceType is checked by the model, which also accepts EXTRA_INSTANCE_TYPES.
    validate_input(
        operation_model("sagemaker", operation),
        params,
        skip_enum_shapes={"ClusterInstanceType"},
        client_checks=client_checks,
    )
