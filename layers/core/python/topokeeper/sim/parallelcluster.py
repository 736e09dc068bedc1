"""ParallelCluster in the simulator: Slurm on plain EC2, named and bound as ParallelCluster 3 does it.

The cluster is EC2 instances (moto's) tagged as ParallelCluster tags them: every instance carries
``parallelcluster:cluster-name`` and ``parallelcluster:node-type`` (``HeadNode`` or ``Compute``), compute
instances their ``parallelcluster:queue-name`` and ``parallelcluster:compute-resource-name``; topokeeper finds
them with ``ec2.cluster_tag`` and ``ec2.partition_tag`` (``DISCOVERY``). The head node also carries
``topokeeper:head-node=true``, which the stack's SendCommand permission requires.

Each compute resource (a scenario instance group whose ``partition`` is its queue) has ``count`` static nodes
``<queue>-st-<cr>-<n>`` and ``dynamic`` nodes ``<queue>-dy-<cr>-<n>``, all defined in slurm.conf from the start.
What changes is which instance backs a node. ParallelCluster binds one with ``scontrol update NodeName=...
NodeAddr=<private ip> NodeHostName=<host>`` on the head node: its resume program right after launching a
dynamic node's instance, clustermgtd after launching a replacement for a static node. A powered-down dynamic
node is unbound (NodeAddr and NodeHostName back to its name) before its instance is terminated. EC2 emits its
state-change events for every launch (pending, running) and termination (shutting-down, terminated).
"""

from __future__ import annotations

import ipaddress
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from topokeeper.contract.config import PARALLELCLUSTER_DISCOVERY
from topokeeper.contract.event_schemas import EC2_STATE_DETAIL_TYPE
from topokeeper.domain.catalog import ec2_instance_type
from topokeeper.sim.aws.emulator import AwsEmulator
from topokeeper.sim.aws.events import EC2
from topokeeper.sim.scenario import ClusterSpec, InstanceGroup

DISCOVERY = PARALLELCLUSTER_DISCOVERY
CLUSTER_TAG = DISCOVERY.cluster_tag
QUEUE_TAG = DISCOVERY.partition_tag
COMPUTE_RESOURCE_TAG = "parallelcluster:compute-resource-name"
NODE_TYPE_TAG = "parallelcluster:node-type"
VERSION_TAG = "parallelcluster:version"
VERSION = "3.13.0"  # the ParallelCluster release the tags claim
HEAD_NODE_TAG = "topokeeper:head-node"  # infra/constants.py HEAD_NODE_TAG: SendCommand is allowed on it only
# Private IPs are handed out in order from the default VPC's range (never reused), so a seed tells one story.
_FIRST_ADDRESS = ipaddress.IPv4Address("172.31.0.10")

NEEDS_SLURMCTLD = (
    "orchestrator parallelcluster needs the real slurmctld head node: ParallelCluster binds nodes to instances with"
    " scontrol update, which the file-only head node does not model"
)

Bind = Callable[[str, str, str], None]  # NodeName, NodeAddr, NodeHostName: scontrol update on the head node


def _nothing(_: Instance) -> None:
    pass


@dataclass(frozen=True)
class Instance:
    """A running instance and the Slurm node it backs (``replaces``: the instance it replaced, if any)."""

    instance_id: str
    slurm_name: str
    group: str
    instance_type: str
    private_ip: str
    launch_time: datetime
    replaces: str | None = None

    @property
    def hostname(self) -> str:
        return "ip-" + self.private_ip.replace(".", "-")


@dataclass
class SlurmNode:
    name: str
    group: str  # the compute resource
    static: bool
    instance: Instance | None = None  # None: powered down (NodeAddr is the node's name)


@dataclass
class ParallelCluster:
    emulator: AwsEmulator
    spec: ClusterSpec
    bind: Bind
    head_node_id: str | None = None
    resumed: Callable[[Instance], None] = _nothing  # after the resume program bound a dynamic node (it boots)
    _nodes: dict[str, SlurmNode] = field(default_factory=dict)
    _addresses: int = 0
    _image: str | None = None
    _ec2: Any = None

    def __post_init__(self) -> None:
        for group in self.spec.instance_groups:
            if group.role != "compute" or group.partition is None:
                continue
            for kind, count in (("st", group.count), ("dy", group.dynamic)):
                for number in range(1, count + 1):
                    name = f"{group.partition}-{kind}-{group.name}-{number}"
                    self._nodes[name] = SlurmNode(name, group.name, kind == "st")

    # ------------------------------------------------------------ creation

    def launch_head_node(self) -> str:
        """The head node's instance (before the stack exists: its id goes into the config and the rules)."""
        # moto draws instance ids from its own random source; seeded, the same scenario gets the same ids.
        url = f"{self.emulator.endpoint_url}/moto-api/seed?a={self.spec.seed}"  # our own server on 127.0.0.1
        with urllib.request.urlopen(urllib.request.Request(url, method="POST"), timeout=30):  # noqa: S310
            pass
        controller = next(g for g in self.spec.instance_groups if g.role == "controller")
        tags = {NODE_TYPE_TAG: "HeadNode", "Name": "HeadNode", HEAD_NODE_TAG: "true"}
        self.head_node_id = self._launch(controller, tags).instance_id
        return self.head_node_id

    def create(self) -> None:
        """Every static node's instance, bound in slurm.conf (``addresses``) as the cluster starts."""
        for node in self._nodes.values():
            if node.static:
                node.instance = self._launch_for(node)

    def partitions(self) -> dict[str, list[str]]:
        """Queue -> every Slurm node of its compute resources, powered down or not (slurm.conf's)."""
        queue_of = {g.name: g.partition for g in self.spec.instance_groups if g.partition}
        found: dict[str, list[str]] = {}
        for node in self._nodes.values():
            found.setdefault(str(queue_of[node.group]), []).append(node.name)
        return {queue: sorted(names) for queue, names in sorted(found.items())}

    def addresses(self) -> dict[str, str]:
        """NodeAddr of every bound node."""
        return {n.name: n.instance.private_ip for n in self._nodes.values() if n.instance is not None}

    def dynamic_nodes(self) -> list[str]:
        """Every dynamic node's name (those the resume program powers up)."""
        return sorted(n.name for n in self._nodes.values() if not n.static)

    def nodes(self, group: str | None = None) -> list[Instance]:
        """The running instances and their nodes, by node name."""
        return [
            node.instance
            for node in sorted(self._nodes.values(), key=lambda n: n.name)
            if node.instance is not None and group in (None, node.group)
        ]

    # ------------------------------------------------------------ what ParallelCluster does

    def scale(self, group: str, count: int) -> None:
        """Power dynamic nodes up (lowest number first) or down (highest first) until ``count`` run."""
        running = len(self.nodes(group))
        if count > running:
            for node in self._dynamic(group, bound=False)[: count - running]:
                self._power_up(node)
        elif count < running:
            for node in self._dynamic(group, bound=True)[::-1][: running - count]:
                self._power_down(node)

    def power_down(self, group: str, count: int) -> list[str]:
        """The ``count`` highest-numbered dynamic nodes that run."""
        chosen = self._dynamic(group, bound=True)[::-1][:count]
        for node in chosen:
            self._power_down(node)
        return [node.name for node in chosen]

    def replace(self, group: str, count: int) -> list[str]:
        """clustermgtd's replacement of unhealthy nodes (static first): the instance is terminated, a new one
        launched, and the same node re-bound to the new instance's address."""
        bound = [n for n in self._ordered(group) if n.instance is not None]
        chosen = sorted(bound, key=lambda n: not n.static)[:count]
        for node in chosen:
            old = node.instance
            assert old is not None  # noqa: S101 - chosen among bound nodes
            self._terminate(old)
            node.instance = self._launch_for(node, replaces=old.instance_id)
            self.bind(node.name, node.instance.private_ip, node.instance.hostname)
        return [node.name for node in chosen]

    def _power_up(self, node: SlurmNode) -> None:
        """The resume program: launch, then bind the node to the instance at once."""
        node.instance = self._launch_for(node)
        self.bind(node.name, node.instance.private_ip, node.instance.hostname)
        self.resumed(node.instance)

    def _power_down(self, node: SlurmNode) -> None:
        """clustermgtd: the node's address back to its name, then the instance terminated."""
        instance = node.instance
        node.instance = None
        self.bind(node.name, node.name, node.name)
        if instance is not None:
            self._terminate(instance)

    def _ordered(self, group: str) -> list[SlurmNode]:
        nodes = [n for n in self._nodes.values() if n.group == group]
        return sorted(nodes, key=lambda n: (n.name.rsplit("-", 1)[0], int(n.name.rsplit("-", 1)[1])))

    def _dynamic(self, group: str, *, bound: bool) -> list[SlurmNode]:
        return [n for n in self._ordered(group) if not n.static and (n.instance is not None) == bound]

    # ------------------------------------------------------------ EC2

    def _launch_for(self, node: SlurmNode, replaces: str | None = None) -> Instance:
        group = next(g for g in self.spec.instance_groups if g.name == node.group)
        tags = {
            NODE_TYPE_TAG: "Compute",
            "Name": "Compute",
            QUEUE_TAG: str(group.partition),
            COMPUTE_RESOURCE_TAG: group.name,
        }
        return self._launch(group, tags, node.name, replaces)

    def _launch(
        self, group: InstanceGroup, tags: dict[str, str], slurm_name: str = "", replaces: str | None = None
    ) -> Instance:
        address = str(_FIRST_ADDRESS + self._addresses)
        self._addresses += 1
        all_tags = {CLUSTER_TAG: self.spec.name, VERSION_TAG: VERSION, **tags}
        with self._uncounted() as ec2:
            if self._image is None:  # the cluster's AMI (listing moto's 1,300 public ones takes seconds)
                image = ec2.register_image(Name=f"aws-parallelcluster-{VERSION}-amzn2023-hvm-x86_64-sim")
                self._image = str(image["ImageId"])
            (launched,) = ec2.run_instances(
                ImageId=self._image,
                MinCount=1,
                MaxCount=1,
                InstanceType=ec2_instance_type(group.type),
                PrivateIpAddress=address,
                Placement={"AvailabilityZone": f"{self.emulator.region}a"},
                TagSpecifications=[
                    {"ResourceType": "instance", "Tags": [{"Key": k, "Value": v} for k, v in sorted(all_tags.items())]}
                ],
            )["Instances"]
        instance_id = str(launched["InstanceId"])
        for state in ("pending", "running"):
            self._state_change(instance_id, state)
        return Instance(
            instance_id,
            slurm_name,
            group.name,
            ec2_instance_type(group.type),
            address,
            self.emulator.clock.now(),
            replaces,
        )

    def _terminate(self, instance: Instance) -> None:
        with self._uncounted() as ec2:
            ec2.terminate_instances(InstanceIds=[instance.instance_id])
        for state in ("shutting-down", "terminated"):
            self._state_change(instance.instance_id, state)

    def _state_change(self, instance_id: str, state: str) -> None:
        arn = f"arn:aws:ec2:{self.emulator.region}:{self.emulator.account_id}:instance/{instance_id}"
        self.emulator.events.emit(
            EC2,
            source="aws.ec2",
            detail_type=EC2_STATE_DETAIL_TYPE,
            detail={"instance-id": instance_id, "state": state},
            resources=[arn],
        )

    @contextmanager
    def _uncounted(self) -> Iterator[Any]:
        """ParallelCluster's own EC2 calls, not topokeeper's."""
        if self._ec2 is None:
            self._ec2 = self.emulator.client("ec2")
        with self.emulator.calls.uncounted():
            yield self._ec2
