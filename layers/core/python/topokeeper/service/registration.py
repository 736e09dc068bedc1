"""Registration entries: each running instance of a ParallelCluster cluster gets its node's topology, published
for the node's start action to hand to slurmd (``slurmd --conf "topology=..."``, Slurm 25.11), so slurmctld places
the node the moment it registers, before the head node's files or ``scontrol update`` reach it.

The value comes from the plan being published (the same planner output the head node writes), so a node
placed at registration is where the plan says. Every reconcile brings the entries to its plan, before the write
pacing (an entry costs slurmctld nothing) and whether or not the plan changed: the state table records, per
instance id, a digest of the value published, so an entry is put only when missing or changed (a new instance on a
terminated one's address and leaf included), and an instance EC2 no longer lists has its entry and record deleted
(not left to a lifecycle rule, which expires by age, not by termination: a day at the soonest, and a running
instance's entry with the rest). Entries are bound to the cluster and instance, not signed: a
forged one can only place one node (its characters are Slurm names only), which verify reports and the
update path moves back; signing would cost a KMS Sign per node and the node would need the stack's public key.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from topokeeper.contract.config import ClusterConfig, Mode, Orchestrator
from topokeeper.contract.errors import TopokeeperError
from topokeeper.contract.ports import ClusterState, PlanStore, StateStore, log
from topokeeper.domain.models import PRESENT_STATUSES, SlurmFormat, SlurmVersion
from topokeeper.service.state import cluster_mode
from topokeeper.wire import (
    REGISTRATION_SERIES,
    Registration,
    RegistrationError,
    registration_text,
)

if TYPE_CHECKING:
    from topokeeper.engine.snapshot import AwsSnapshot
    from topokeeper.render.bundle import Bundle, ExpectedUnit, RenderedPlan

# S3 calls for entries in one reconcile, each way (puts, deletes), a few at once: about 10 s at most before the
# write; the rest at the next reconcile.
MAX_ENTRY_CALLS = 1000
DELETE_BATCH = 100


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
    return _registering(cluster, state, rendered.plan.slurm_version, rendered.plan.slurm_format)


def may_register(cluster: ClusterConfig, state: ClusterState) -> bool:
    """``registers`` before planning: with the version a plan would take (the head node's, else the configured)."""
    text = state.slurm_version or cluster.slurm_version
    version = None if text is None else SlurmVersion.parse(text)
    return version is not None and _registering(cluster, state, version, version.format)


def _registering(cluster: ClusterConfig, state: ClusterState, version: SlurmVersion, slurm_format: SlurmFormat) -> bool:
    return (
        cluster.orchestrator is Orchestrator.EC2
        and cluster_mode(cluster, state) is Mode.ENFORCE
        and slurm_format is SlurmFormat.YAML
        and (version.major, version.minor) in REGISTRATION_SERIES
    )


def value_digest(value: str) -> str:
    """What the state table records of a published entry: enough to tell that its value changed."""
    return hashlib.sha256(value.encode()).hexdigest()[:16]


def publish_registrations(
    cluster: ClusterConfig,
    state: ClusterState,
    raw: AwsSnapshot,
    rendered: RenderedPlan,
    *,
    plans: PlanStore,
    ledger: StateStore,
) -> frozenset[str]:
    """Bring the cluster's entries to ``rendered``, whether or not the plan changed: put each running instance's entry
    that was never published or whose value changed (``ledger`` records what was: keyed by instance id, so an
    instance reusing a terminated one's address still gets its own), and delete the entries of instances no longer
    present (so none stays readable for ever). Returns the instances whose entry is now current. Reconcile calls
    it before the write pacing: an entry costs slurmctld nothing, and its node may boot before
    ``min_write_interval`` has passed."""
    if not registers(cluster, state, rendered):
        return frozenset()
    try:
        published = ledger.registrations(cluster.name)
    except TopokeeperError as error:  # entries only spare a wait: the plan goes on, the update route places
        log.warning("registration entries of %s not published: %s", cluster.name, error)
        return frozenset()
    values = instance_values(rendered.bundle, raw)
    current = {instance for instance, value in values.items() if published.get(instance) == value_digest(value)}
    entries: dict[str, str] = {}
    for instance, value in sorted(values.items()):
        if instance in current:
            continue
        if len(entries) == MAX_ENTRY_CALLS:
            break  # the rest at the next reconcile; their nodes are not listed as registering meanwhile
        try:
            entries[instance] = registration_text(
                Registration(cluster.name, instance, value, state.generation, rendered.sha256)
            )
        except RegistrationError as error:  # refused at the source too: the node's slurmd never sees it
            log.warning("registration entry for %s not published: %s", instance, error)
    # Only an instance EC2 no longer lists loses its entry: one present but unplaced for now (its node table row
    # not read yet, its topology not reported) keeps it, and gets a new one when its value changes.
    present = {node.InstanceId for node in raw.nodes if node.InstanceStatus.Status in PRESENT_STATUSES}
    _delete(plans, ledger, cluster.name, sorted(set(published) - present))
    if not entries:
        return frozenset(current)
    try:
        plans.put_registrations(cluster.name, entries)
        ledger.record_registrations(cluster.name, {i: value_digest(values[i]) for i in entries}, ())
    except TopokeeperError as error:  # not recorded: the next reconcile puts them again (idempotent)
        log.warning("registration entries of %s not published: %s", cluster.name, error)
        return frozenset(current)
    return frozenset(current | set(entries))


def _delete(plans: PlanStore, ledger: StateStore, cluster: str, gone: list[str]) -> None:
    """Delete the entries of instances that are gone, and their records, a batch at a time and at most
    MAX_ENTRY_CALLS a reconcile (a scale-down must not delay the write; the rest go at the next reconcile). What
    was deleted is recorded even when a later batch fails, so refused deletes never grow the work of each reconcile
    beyond the cap."""
    gone = gone[:MAX_ENTRY_CALLS]
    for start in range(0, len(gone), DELETE_BATCH):
        batch = gone[start : start + DELETE_BATCH]
        try:
            plans.delete_registrations(cluster, batch)
            ledger.record_registrations(cluster, {}, batch)
        except TopokeeperError as error:
            log.warning("registration entries of %s not deleted: %s", cluster, error)
            return


def registering_nodes(bundle: Bundle, raw: AwsSnapshot, current: frozenset[str]) -> list[str]:
    """The nodes whose instance's entry is ``current`` (sorted): what a delivered bundle lists as ``registering``,
    so the head node leaves those not registered yet to their slurmd (wire.REGISTERING_KEY). An entry S3 refused
    is not current: its node is placed by update at once rather than after the registration wait."""
    node_of = {address: node for node, address in (bundle.bindings or {}).items()}
    return sorted(node_of[node.PrivatePrimaryIp or ""] for node in raw.nodes if node.InstanceId in current)


def with_registering(bundle: Bundle, nodes: Sequence[str]) -> Bundle:
    """``bundle`` as delivered: listing ``nodes`` as registering (signed with the rest); as is when none."""
    return bundle.model_copy(update={"registering": sorted(nodes)}) if nodes else bundle
