"""Node-to-topology latency: from a node's launch to its first appearance in the live topology on the head node.

The world tells the tracker every node it launches (with its launch time) and, after every head-node write,
the node names the live topology shows (``scontrol show topology``). A node has appeared the first time its
name is in the live topology at or after its launch. A replacement that keeps its predecessor's host name
is not measured (its name was in the topology before it launched), nor is a node of a type without
topology (it never appears); both are left out of ``nodes``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from pydantic import BaseModel

from topokeeper.domain.models import PLACEHOLDER_UNITS
from topokeeper.wire import expand

_NODES = re.compile(r"\bNodes=(\S+)")
_UNIT = re.compile(r"\s*(?:SwitchName|BlockName)=(\S+)")
_SAME_MOMENT = 1e-3  # seconds
_PLACEHOLDERS = PLACEHOLDER_UNITS


class NodeLatency(BaseModel):
    """Seconds from launch to the live topology, over the nodes launched in a step (or a whole run)."""

    nodes: int  # measured nodes that appeared
    p50: float | None
    p99: float | None
    max: float | None
    slowest: str | None  # the node that took ``max``
    unplaced: int = 0  # measured nodes launched but not in the live topology when the step ended


def percentile(values: list[float], fraction: float) -> float | None:
    """Nearest-rank percentile (the smallest value with at least ``fraction`` of the values at or below it)."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(fraction * len(ordered)))
    return ordered[rank - 1]


def summarize(latencies: Mapping[str, float], unplaced: int = 0) -> NodeLatency:
    values = list(latencies.values())
    slowest = max(sorted(latencies), key=lambda name: latencies[name]) if latencies else None
    return NodeLatency(
        nodes=len(values),
        p50=percentile(values, 0.50),
        p99=percentile(values, 0.99),
        max=max(values) if values else None,
        slowest=slowest,
        unplaced=unplaced,
    )


def topology_node_names(live: Mapping[str, str]) -> set[str]:
    """Every node name the live topology places (``Nodes=`` of each switch or block, any partition), but for
    the nodes kept schedulable in the placeholder for nodes without topology data yet: they are not placed."""
    names: set[str] = set()
    waiting: set[str] = set()
    for text in live.values():
        for line in text.splitlines():
            unit = _UNIT.match(line)
            nodes = {name for expression in _NODES.findall(line) for name in expand(expression)}
            (waiting if unit and unit.group(1) in _PLACEHOLDERS else names).update(nodes)
    return names - waiting


@dataclass
class _Launch:
    name: str
    launched_at: float
    appeared_at: float | None = None


class LatencyTracker:
    """Launches in, live-topology observations in, latencies out (simulated seconds throughout)."""

    def __init__(self) -> None:
        self._launches: dict[str, _Launch] = {}  # instance id -> its launch

    def launched(self, instance_id: str, name: str, at: float) -> None:
        """A measured node launched (call again freely: the first launch time is kept)."""
        self._launches.setdefault(instance_id, _Launch(name, at))

    def observe(self, live_names: Iterable[str], at: float) -> None:
        """The live topology at ``at`` places ``live_names``."""
        present = set(live_names)
        for launch in self._launches.values():
            if launch.appeared_at is None and launch.name in present and at >= launch.launched_at:
                launch.appeared_at = at

    def forget_except(self, instance_ids: Iterable[str]) -> None:
        """Drop nodes that no longer exist and never appeared (deleted before they made it)."""
        keep = set(instance_ids)
        for instance_id in [i for i, launch in self._launches.items() if i not in keep and launch.appeared_at is None]:
            del self._launches[instance_id]

    def between(self, start: float, end: float) -> tuple[dict[str, float], int]:
        """Latency per node name of the nodes launched in [start, end], and how many of them have not appeared.
        Launch times come from timestamps (microseconds): a launch within a millisecond of ``start`` is in."""
        latencies: dict[str, float] = {}
        unplaced = 0
        for launch in self._launches.values():
            if not start - _SAME_MOMENT <= launch.launched_at <= end:
                continue
            if launch.appeared_at is None:
                unplaced += 1
            else:
                latencies[launch.name] = round(launch.appeared_at - launch.launched_at, 3)
        return dict(sorted(latencies.items())), unplaced
