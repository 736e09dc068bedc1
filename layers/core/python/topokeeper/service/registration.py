"""Registration entries: each running instance of a ParallelCluster cluster gets its node's topology, published
for the node's start action to hand to slurmd (``slurmd --conf "topology=..."``, Slurm 25.11), so slurmctld places
the node the moment it registers, before the head node's files or ``scontrol update`` reach it.

The value comes from the plan being published (the same planner output the head node writes), so a node
placed at registration is where the plan says. Entries are bound to the cluster and instance, not signed: a
forged one can only place one node (its characters are Slurm names only), which verify reports and the
update path moves back; signing would cost a KMS Sign per node and the node would need the stack's public key.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from topokeeper.contract.config import ClusterConfig, Mode, Orchestrator
from topokeeper.contract.errors import TopokeeperError
from topokeeper.contract.ports import ClusterState, PlanStore, log
from topokeeper.domain.models import PRESENT_STATUSES, SlurmFormat
from topokeeper.service.state import cluster_mode
from topokeeper.wire import (
    REGISTRATION_SERIES,
    Registration,
    RegistrationError,
    check_topology_value,
    registration_text,
)

if TYPE_CHECKING:
    from topokeeper.engine.snapshot import AwsSnapshot
    from topokeeper.render.bundle import Bundle, ExpectedUnit, RenderedPlan


def _tree_paths(units: Mapping[str, ExpectedUnit]) -> dict[str, str]:
    """{node: "top:...:leaf"} of one tree's expected units."""
    parents = {child: name for name, unit in units.items() for child in unit.switches}
    paths: dict[str, str] = {}
    for name, unit in units.items():
        chain, at = [name], parents.get(name)
        while at is not None and len(chain) <= len(units):  # bounded: a cycle cannot loop
            chain.append(at)
            at = parents.get(at)
        for node in unit.nodes:
            paths[node] = ":".join(reversed(chain))
    return paths


def placements(bundle: Bundle) -> dict[str, str]:
    """{node: its whole Topology= value} as the bundle's topologies place it (every topology it is in, in the
    bundle's order); a node in no tree or block has none."""
    parts: dict[str, list[str]] = {}
    for name, units in bundle.topologies.items():
        if any(unit.kind == "block" for unit in units.values()):
            paths = {node: block for block, unit in units.items() for node in unit.nodes}
        else:
            paths = _tree_paths(units)
        for node, path in paths.items():
            parts.setdefault(node, []).append(f"{name}:{path}")
    return {node: ",".join(values) for node, values in parts.items()}


def instance_values(bundle: Bundle, raw: AwsSnapshot) -> dict[str, str]:
    """{instance id: its node's Topology= value} for each present instance the bundle binds to a placed node
    (by NodeAddr: ParallelCluster binds a node to its instance's private IP; none for an address two nodes hold)."""
    bound: dict[str, list[str]] = {}
    for node, address in (bundle.bindings or {}).items():
        bound.setdefault(address, []).append(node)
    # An address two nodes are bound to (one's binding not yet reset): which node the instance runs as is unknown.
    node_of = {address: nodes[0] for address, nodes in bound.items() if len(nodes) == 1}
    placed = placements(bundle)
    values: dict[str, str] = {}
    for instance in raw.nodes:
        node = node_of.get(instance.PrivatePrimaryIp or "", "")
        if instance.InstanceStatus.Status in PRESENT_STATUSES and node in placed:
            values[instance.InstanceId] = placed[node]
    return values


def registers(cluster: ClusterConfig, state: ClusterState, rendered: RenderedPlan) -> bool:
    """Entries only for ParallelCluster clusters topokeeper writes (never in verify mode: a node placed at
    registration is a write), on the Slurm series whose slurmctld places a resumed node as its slurmd says (25.11)."""
    version = rendered.plan.slurm_version
    return (
        cluster.orchestrator is Orchestrator.EC2
        and cluster_mode(cluster, state) is Mode.ENFORCE
        and rendered.plan.slurm_format is SlurmFormat.YAML
        and (version.major, version.minor) in REGISTRATION_SERIES
    )


def publish_registrations(
    plans: PlanStore, cluster: ClusterConfig, state: ClusterState, raw: AwsSnapshot, rendered: RenderedPlan
) -> int:
    """Publish the entries that are new or changed since the plan ``state`` last published; returns how many."""
    if not registers(cluster, state, rendered):
        return 0
    values = instance_values(rendered.bundle, raw)
    if state.desired_sha256 is not None and values:
        try:
            before = instance_values(plans.bundle(cluster.name, state.desired_sha256), raw)
        except TopokeeperError:  # the previous plan cannot be read: publish every entry again (idempotent)
            before = {}
        values = {instance: value for instance, value in values.items() if before.get(instance) != value}
    entries: dict[str, str] = {}
    for instance, value in sorted(values.items()):
        try:
            entries[instance] = registration_text(
                Registration(cluster.name, instance, value, state.generation, rendered.sha256)
            )
        except RegistrationError as error:  # refused at the source too: the node's slurmd never sees it
            log.warning("registration entry for %s not published: %s", instance, error)
    if entries:
        try:
            plans.put_registrations(cluster.name, entries)
        except TopokeeperError as error:  # entries only spare a wait: the plan goes on, the update route places
            log.warning("registration entries of %s not published: %s", cluster.name, error)
            return 0
    return len(entries)


def registering_nodes(
    cluster: ClusterConfig, state: ClusterState, raw: AwsSnapshot, rendered: RenderedPlan
) -> list[str]:
    """The nodes of ``rendered`` whose instance has an entry (sorted): what a delivered bundle lists as
    ``registering``, so the head node leaves those not registered yet to their slurmd (wire.REGISTERING_KEY)."""
    if not registers(cluster, state, rendered):
        return []
    node_of = {address: node for node, address in (rendered.bundle.bindings or {}).items()}
    by_instance = {instance.InstanceId: instance.PrivatePrimaryIp or "" for instance in raw.nodes}
    nodes: list[str] = []
    for instance, value in instance_values(rendered.bundle, raw).items():
        try:
            check_topology_value(value)
        except RegistrationError:
            continue  # never published (publish_registrations logs it): the update route places it
        nodes.append(node_of[by_instance[instance]])
    return sorted(nodes)


def with_registering(bundle: Bundle, nodes: Sequence[str]) -> Bundle:
    """``bundle`` as delivered: listing ``nodes`` as registering (signed with the rest); as is when none."""
    return bundle.model_copy(update={"registering": sorted(nodes)}) if nodes else bundle
