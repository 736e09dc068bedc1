"""The ``UpdatePartitionTopology`` audit record: one per changed partition per delivery outcome.

Its schema is a contract (tests pin it): EventBridge consumers, the history table and CloudTrail Lake
all read the same fields. The id is derived from the cluster, partition, plan and outcome, so a
retried result is recorded once.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Collection
from datetime import datetime
from typing import Any

from topokeeper.contract.ports import ApplyResult, AuditRecord, NodeMove, Outcome, PendingDelivery, PlacementRoute
from topokeeper.engine.planner import FOLDED
from topokeeper.render.bundle import leaf_units

MAX_LISTED_NODES = 200  # keeps a record well under EventBridge's 256 KB; counts are always exact
MAX_WARNINGS, MAX_WARNING_CHARS = 20, 500
# The head node wrote and loaded nothing of the plan: its records list no node as added, removed or moved.
NOTHING_MOVED = frozenset(
    {
        Outcome.REFUSED,
        Outcome.BAD_SIGNATURE,
        Outcome.REPLAYED,
        Outcome.STALE_BINDINGS,
        Outcome.ROLLED_BACK,
        Outcome.UNDELIVERABLE,
        Outcome.AGENT_OUTDATED,
    }
)


def _partitions(plan_document: dict[str, Any] | None) -> dict[str, dict[str, Any]]:
    if not plan_document:
        return {}
    return {p["name"]: p for p in plan_document["partitions"]}


def placements(partition: dict[str, Any] | None) -> dict[str, str]:
    """A plan document partition's {node: its leaf switch or block}; flat partitions place no node."""
    if not partition:
        return {}
    return {node: name for name, nodes in leaf_units(partition) for node in nodes}


def plan_moves(old: dict[str, Any] | None, new: dict[str, Any]) -> list[NodeMove]:
    """Nodes in both plans of a partition whose leaf or block changed (joins and leaves are added/removed)."""
    before, after = placements(old), placements(new)
    return [
        NodeMove(node=node, before=before[node], after=after[node])
        for node in sorted(before.keys() & after.keys())
        if before[node] != after[node]
    ]


def placement_routes(
    nodes: list[str], delivery: PendingDelivery, result: ApplyResult | None
) -> dict[PlacementRoute, list[str]]:
    """{route: nodes} for the nodes a record adds or moves: registration where the plan's instances have entries and
    the head node found the node already placed as planned; else how the apply loaded the rest."""
    if result is None:
        return {}
    paths: dict[str | None, PlacementRoute] = {"incremental": "update", "whole_file": "file"}
    loaded = paths.get(result.apply_path)
    registered = [*result.nodes_placed_before, *result.nodes_left_to_registration]
    before = set(registered) if delivery.registration else set()
    routes: dict[PlacementRoute, list[str]] = {}
    for node in nodes:
        route: PlacementRoute | None = "registration" if node in before else loaded
        if route is not None:
            routes.setdefault(route, []).append(node)
    return routes


def _audit_id(cluster: str, partition: str, plan_sha256: str, outcome: Outcome, reference: str) -> str:
    key = json.dumps([cluster, partition, plan_sha256, outcome.value, reference])
    return hashlib.sha256(key.encode()).hexdigest()[:32]


def build_records(
    *,
    cluster_name: str,
    previous: dict[str, Any] | None,
    desired: dict[str, Any],
    delivery: PendingDelivery,
    outcome: Outcome,
    error: str | None,
    completed_at: datetime,
    result: ApplyResult | None = None,
    moved: bool = True,
    deferred: Collection[str] = (),
) -> list[AuditRecord]:
    """One record per partition whose rendered content differs between the previous and desired plan, rewritten
    to repair live drift (its live content was not the plan's), or holding nodes left to registration earlier that
    this apply placed. Its nodes are what moved on the head node: none if it moved nothing, never a ``deferred`` one."""
    before = _partitions(previous)
    after_wait = set(result.nodes_placed_after_wait) if result is not None and moved else set()
    records = []
    for name, partition in sorted(_partitions(desired).items()):
        old = before.get(name)
        unchanged = old is not None and old["sha256"] == partition["sha256"]
        old_nodes = set(old["nodes"]) if old else set()
        new_nodes = set(partition["nodes"])
        if unchanged and name not in delivery.repair and not new_nodes & after_wait:
            continue
        waiting = sorted(new_nodes & set(deferred)) if moved else []
        added, removed = sorted(new_nodes - old_nodes - set(waiting)), sorted(old_nodes - new_nodes)
        if unchanged:  # a drift repair: what the verify found live, for this partition's nodes
            nodes_moved = [move for move in delivery.repair_moves if move.node in new_nodes]
        else:
            nodes_moved = plan_moves(old, partition)
        nodes_moved = [move for move in nodes_moved if move.node not in waiting]
        if not moved:
            added, removed, nodes_moved = [], [], []
        warnings = [*desired.get("warnings", []), *partition.get("warnings", [])]
        placed = placements(partition)  # a node written without topology was placed by no route
        loaded = {*added, *(m.node for m in nodes_moved), *(new_nodes & after_wait)}
        routes = placement_routes(sorted(loaded & placed.keys()), delivery, result)
        records.append(
            AuditRecord(
                audit_id=_audit_id(cluster_name, name, desired["sha256"], outcome, delivery.handle.reference),
                cluster_name=cluster_name,
                cluster_arn=desired["cluster"]["arn"],
                partition=name,
                reason="drift-repair" if unchanged else "plan-change",
                kind=partition["kind"],
                topology=partition["assignment"],
                before_sha256=old["sha256"] if old and not unchanged else None,
                after_sha256=partition["sha256"],
                plan_sha256=desired["sha256"],
                previous_plan_sha256=previous["sha256"] if previous else None,
                nodes_added=added[:MAX_LISTED_NODES],
                nodes_removed=removed[:MAX_LISTED_NODES],
                nodes_added_count=len(added),
                nodes_removed_count=len(removed),
                nodes_moved=nodes_moved[:MAX_LISTED_NODES],
                nodes_moved_count=len(nodes_moved),
                nodes_deferred=waiting[:MAX_LISTED_NODES],
                nodes_deferred_count=len(waiting),
                node_count=len(new_nodes),
                switch_count=len(partition.get("switches", [])),
                block_count=len(partition.get("blocks", [])),
                triggers=delivery.triggers,
                trigger_count=delivery.trigger_count,
                channel=delivery.handle.channel.value,
                delivery_reference=delivery.handle.reference,
                target=delivery.handle.target,
                outcome=outcome,
                error=error,
                warnings=[w[:MAX_WARNING_CHARS] for w in warnings][:MAX_WARNINGS],
                folds=[w[:MAX_WARNING_CHARS] for w in warnings if f" partition {name} {FOLDED} " in w],
                placed_by={route: nodes[:MAX_LISTED_NODES] for route, nodes in routes.items()},
                placed_by_count={route: len(nodes) for route, nodes in routes.items()},
                generation=delivery.generation,
                requested_at=delivery.handle.sent_at,
                completed_at=completed_at,
            )
        )
    return records
