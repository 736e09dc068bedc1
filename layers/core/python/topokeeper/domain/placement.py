"""Where jobs land: placement figures per partition, from facts about jobs, nodes and the live topology.

Pure: no I/O, no clock (``now`` is a fact), standard library and the wire contract only, so the CLI, the drift
check and a test compute the same figures from the same facts. The facts hold no job name, comment or user
name (anyone on the cluster writes those): a job is its id, partition, state, nodes, size and the placement it
asked for (``--switches``, ``--segment``), and Slurm's pending reason.

A node is free for a job now when Slurm would allocate it at once: idle, or idle and powered down (a CLOUD node
Slurm resumes for the job: ``sbatch --test-only`` counts it, so the largest placeable job does too, and the
figure without a resume is given beside it). Whole nodes only: the figures are for exclusive multi-node jobs.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from topokeeper.computenode.hostfile import unit_names
from topokeeper.wire import (
    MAX_HOSTLIST_NAMES,
    PLACEMENT_FACTS_SCHEMA,
    HostlistError,
    compress,
    expand,
    parse_show_topology,
)

# One class per node, for the counts per leaf and block (NODE_CLASSES order is the tables' column order).
IDLE = "idle"
POWERED_DOWN = "powered_down"
NODE_CLASSES = (IDLE, POWERED_DOWN, "allocated", "mixed", "drained", "down", "unavailable")
FREE_CLASSES = frozenset({IDLE, POWERED_DOWN})
_DOWN_BASES = frozenset({"DOWN", "ERROR", "FUTURE", "UNKNOWN"})
# Flags that keep an idle node from a new job now (a node powering up or down, or not answering, is not
# allocated until it settles; maintenance and reservations hold it for others).
_HOLDING_FLAGS = frozenset(
    {
        "COMPLETING",
        "MAINTENANCE",
        "NOT_RESPONDING",
        "POWER_DOWN",
        "POWERING_DOWN",
        "POWERING_UP",
        "REBOOT_ISSUED",
        "REBOOT_REQUESTED",
        "RESERVED",
    }
)
RUNNING_STATES = frozenset({"RUNNING", "CONFIGURING", "SUSPENDED", "COMPLETING"})  # squeue -O: CONFIGURING
MAX_TEXT = 64  # characters of a Slurm-supplied string (a reason, a state) kept in the facts


class PlacementError(ValueError):
    """The facts cannot be read; the message names the file or field."""


@dataclass(frozen=True)
class Job:
    job_id: str
    partition: str
    state: str  # Slurm's base state: RUNNING, PENDING, ...
    nodes: tuple[str, ...]  # expanded; empty while pending
    node_count: int
    switches: int = 0  # --switches asked (0: none)
    segment: int = 0  # --segment asked (0: none)
    reason: str = ""
    since: int = 0  # epoch seconds: eligible since (pending) or started (running)


@dataclass(frozen=True)
class Node:
    name: str
    states: tuple[str, ...]  # Slurm's base state first, then its flags
    partitions: tuple[str, ...]


@dataclass(frozen=True)
class Topology:
    """One topology as slurmctld holds it: its leaves (tree) or base blocks, in topology order."""

    name: str
    kind: str  # "tree" or "block"
    units: tuple[tuple[str, tuple[str, ...]], ...]


@dataclass(frozen=True)
class Facts:
    jobs: tuple[Job, ...]
    nodes: tuple[Node, ...]
    topologies: Mapping[str, Topology]  # partition -> its topology (absent: none known)
    now: int


@dataclass(frozen=True)
class Unit:
    name: str
    counts: Mapping[str, int]  # the partition's nodes in this leaf or block, by class

    @property
    def free(self) -> int:
        return sum(self.counts.get(name, 0) for name in FREE_CLASSES)

    @property
    def size(self) -> int:
        return sum(self.counts.values())


@dataclass(frozen=True)
class Spread:
    job_id: str
    nodes: int
    units: tuple[str, ...]  # the leaves or blocks it spans, in topology order
    fewest: int  # the fewest leaves or blocks of the partition that hold its size

    @property
    def beyond_need(self) -> bool:
        return len(self.units) > self.fewest


@dataclass(frozen=True)
class Pending:
    job_id: str
    nodes: int
    switches: int
    segment: int
    reason: str
    seconds: int  # waiting since eligible
    on_topology: bool  # the partition has the free nodes, but not within the leaves or blocks asked


@dataclass(frozen=True)
class PartitionFigures:
    partition: str
    topology: str | None
    kind: str | None
    units: tuple[Unit, ...]
    outside: Mapping[str, int]  # the partition's nodes in no leaf or block, by class
    largest: int  # the largest whole-node job one leaf or block can start now (resuming powered-down nodes)
    largest_without_resume: int  # the same from idle, powered-up nodes alone
    largest_units: tuple[str, ...]  # where ``largest`` fits
    typical_job_nodes: int | None  # the median size of the partition's jobs (None: no job)
    stranded_free: int  # free nodes in leaves or blocks with fewer free than the typical job
    spread: tuple[Spread, ...] = field(default_factory=tuple)
    pending: tuple[Pending, ...] = field(default_factory=tuple)

    @property
    def free(self) -> int:
        return sum(unit.free for unit in self.units)

    @property
    def fragmentation(self) -> float:
        """The share of the free nodes the typical job cannot use in one leaf or block (0 with none free)."""
        return round(self.stranded_free / self.free, 3) if self.free else 0.0


def node_class(states: Sequence[str]) -> str:
    """One of NODE_CLASSES for Slurm's node state list (base state first, then flags)."""
    flags = frozenset(states[1:])
    base = states[0] if states else "UNKNOWN"
    if base in _DOWN_BASES or "FAIL" in flags:
        return "down"
    if "DRAIN" in flags:
        return "drained"
    if base == "ALLOCATED":
        return "allocated"
    if base == "MIXED":
        return "mixed"
    if base != "IDLE" or flags & _HOLDING_FLAGS:
        return "unavailable"
    return POWERED_DOWN if "POWERED_DOWN" in flags else IDLE


def topology_from_text(name: str, text: str) -> Topology:
    """``scontrol show topology NAME`` output: its leaves (tree) or base blocks."""
    try:
        units = parse_show_topology(text)
    except ValueError as error:
        raise PlacementError(f"topology {name}: unreadable scontrol output: {error}") from None
    kind = "block" if any(unit["kind"] == "block" for unit in units.values()) else "tree"
    # The nodes' order inside a leaf or block does not change a figure: parse_show_topology's sorted names.
    members: dict[str, list[str]] = {unit: units[unit]["nodes"] for unit in unit_names(units)}  # type: ignore[misc]
    ordered = tuple((unit, tuple(nodes)) for unit, nodes in members.items() if nodes)
    if not ordered:
        raise PlacementError(f"topology {name}: no switch or block with nodes")
    return Topology(name=name, kind=kind, units=ordered)


def assign_topologies(nodes: Iterable[Node], topologies: Sequence[Topology]) -> dict[str, Topology]:
    """Each partition's topology: the one that holds most of its nodes (the first given on a tie; none if no
    topology holds any), as a partition without ``Topology=`` has the cluster's one."""
    members: dict[str, set[str]] = {}
    for node in nodes:
        for partition in node.partitions:
            members.setdefault(partition, set()).add(node.name)
    covered = [{name for _, unit_nodes in topology.units for name in unit_nodes} for topology in topologies]
    found: dict[str, Topology] = {}
    for partition, names in members.items():
        best = max(range(len(topologies)), key=lambda index: (len(names & covered[index]), -index), default=None)
        if best is not None and names & covered[best]:
            found[partition] = topologies[best]
    return found


def _fewest(sizes_desc: Sequence[int], nodes: int) -> int:
    total = 0
    for count, size in enumerate(sizes_desc, start=1):
        total += size
        if total >= nodes:
            return count
    return max(len(sizes_desc), 1)


def _fits_within_topology(free_desc: Sequence[int], job: Job) -> bool:
    """Whether the free nodes give the job the leaves or blocks it asked for (none asked: any free nodes)."""
    if job.segment > 0:
        return sum(free // job.segment for free in free_desc) * job.segment >= job.node_count
    if job.switches > 0:
        return sum(free_desc[: job.switches]) >= job.node_count
    return sum(free_desc) >= job.node_count


def _spread(job: Job, unit_of: Mapping[str, str], order: Mapping[str, int], sizes_desc: Sequence[int]) -> Spread:
    spanned = sorted({unit_of.get(name, "") for name in job.nodes} - {""}, key=order.__getitem__)
    return Spread(
        job_id=job.job_id, nodes=len(job.nodes), units=tuple(spanned), fewest=_fewest(sizes_desc, len(job.nodes))
    )


def _pending(job: Job, now: int, free_desc: Sequence[int]) -> Pending:
    asked = job.switches > 0 or job.segment > 0
    on_topology = asked and sum(free_desc) >= job.node_count and not _fits_within_topology(free_desc, job)
    return Pending(
        job_id=job.job_id,
        nodes=job.node_count,
        switches=job.switches,
        segment=job.segment,
        reason=job.reason,
        seconds=max(now - job.since, 0) if job.since else 0,
        on_topology=on_topology,
    )


def _median(values: Sequence[int]) -> int | None:
    ordered = sorted(values)
    return ordered[(len(ordered) - 1) // 2] if ordered else None


def _units(topology: Topology | None, classes: Mapping[str, str]) -> tuple[tuple[Unit, ...], dict[str, str]]:
    """The partition's nodes (``classes``: node -> class) per leaf or block, and node -> its leaf or block."""
    unit_of: dict[str, str] = {}
    units: list[Unit] = []
    for name, unit_nodes in topology.units if topology else ():
        counts = dict.fromkeys(NODE_CLASSES, 0)
        for node in unit_nodes:
            if node in classes and node not in unit_of:  # a node printed under two units counts in the first
                unit_of[node] = name
                counts[classes[node]] += 1
        if sum(counts.values()):
            units.append(Unit(name=name, counts=counts))
    return tuple(units), unit_of


def partition_figures(
    partition: str, classes: Mapping[str, str], jobs: Sequence[Job], topology: Topology | None, now: int
) -> PartitionFigures:
    """The figures of one partition: ``classes`` maps each of its nodes to its class, ``jobs`` are its jobs."""
    units, unit_of = _units(topology, classes)
    outside = dict.fromkeys(NODE_CLASSES, 0)
    for node, node_class_name in classes.items():
        if node not in unit_of:
            outside[node_class_name] += 1
    free = [unit.free for unit in units]
    largest = max(free, default=0)
    sizes_desc = sorted((unit.size for unit in units), reverse=True)
    free_desc = sorted(free, reverse=True)
    order = {unit.name: index for index, unit in enumerate(units)}
    typical = _median([job.node_count for job in jobs if job.node_count > 0])
    running = [job for job in jobs if job.state in RUNNING_STATES and len(job.nodes) > 1]
    return PartitionFigures(
        partition=partition,
        topology=topology.name if topology else None,
        kind=topology.kind if topology else None,
        units=units,
        outside=outside,
        largest=largest,
        largest_without_resume=max((unit.counts[IDLE] for unit in units), default=0),
        largest_units=tuple(unit.name for unit in units if largest and unit.free == largest),
        typical_job_nodes=typical,
        stranded_free=sum(value for value in free if typical is not None and value < typical),
        spread=tuple(_spread(job, unit_of, order, sizes_desc) for job in running if units),
        pending=tuple(_pending(job, now, free_desc) for job in jobs if job.state == "PENDING"),
    )


def figures(facts: Facts) -> tuple[PartitionFigures, ...]:
    """Every partition's figures, by partition name."""
    classes: dict[str, dict[str, str]] = {}
    for node in facts.nodes:
        for partition in node.partitions:
            classes.setdefault(partition, {})[node.name] = node_class(node.states)
    jobs: dict[str, list[Job]] = {}
    for job in sorted(facts.jobs, key=_job_key):
        jobs.setdefault(job.partition, []).append(job)
    return tuple(
        partition_figures(name, classes.get(name, {}), jobs.get(name, []), facts.topologies.get(name), facts.now)
        for name in sorted(set(classes) | set(jobs))
    )


def _job_key(job: Job) -> tuple[int, str]:
    return (int(job.job_id) if job.job_id.isdigit() else 1 << 62, job.job_id)


# --- Slurm's JSON (``squeue --json``, ``scontrol show nodes --json``) -> facts ------------------------------


def _number(value: object, where: str) -> int:
    """Slurm's JSON numbers: a plain integer or ``{"set": .., "infinite": .., "number": ..}`` (unset: 0)."""
    if isinstance(value, dict):
        if not value.get("set", True) or value.get("infinite"):
            return 0
        value = value.get("number", 0)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise PlacementError(f"{where}: not a number: {_bounded(repr(value))}")
    return int(value)


def _bounded(text: str) -> str:
    return text[:MAX_TEXT]


def _text(value: object, where: str) -> str:
    if not isinstance(value, str):
        raise PlacementError(f"{where}: not a string")
    return _bounded(value)


def _states(value: object, where: str) -> tuple[str, ...]:
    listed = [value] if isinstance(value, str) else value
    if not isinstance(listed, list) or not all(isinstance(item, str) for item in listed):
        raise PlacementError(f"{where}: not a list of states")
    return tuple(_bounded(item) for item in listed)


def _hostlist(value: object, where: str) -> tuple[str, ...]:
    if not isinstance(value, str):
        raise PlacementError(f"{where}: not a string")
    try:
        return tuple(expand(value)) if value else ()
    except HostlistError as error:
        raise PlacementError(f"{where}: not a Slurm hostlist: {error}") from None


def job_from_json(item: object, index: int, source: str) -> Job:
    """One job of ``squeue --json`` (24.11 and later); the fields named in the error are its JSON keys."""
    if not isinstance(item, dict):
        raise PlacementError(f"{source}: jobs[{index}] is not an object")
    where = f"{source}: jobs[{index}]"
    try:
        state = _states(item["job_state"], where + ".job_state")
        pending = state[:1] == ("PENDING",)
        since_key = "eligible_time" if pending else "start_time"
        return Job(
            job_id=str(_number(item["job_id"], where + ".job_id")),
            partition=_text(item["partition"], where + ".partition"),
            state=state[0] if state else "",
            nodes=() if pending else _hostlist(item.get("nodes", ""), where + ".nodes"),
            node_count=_number(item["node_count"], where + ".node_count"),
            switches=_number(item.get("required_switches", 0), where + ".required_switches"),
            segment=_number(item.get("segment_size", 0), where + ".segment_size"),  # 25.05 and later
            reason=_text(item.get("state_reason", ""), where + ".state_reason"),
            since=_number(item.get(since_key, 0), f"{where}.{since_key}"),
        )
    except KeyError as error:
        raise PlacementError(f"{where} has no {error}") from None


def node_from_json(item: object, index: int, source: str) -> Node:
    """One node of ``scontrol show nodes --json``."""
    if not isinstance(item, dict):
        raise PlacementError(f"{source}: nodes[{index}] is not an object")
    where = f"{source}: nodes[{index}]"
    try:
        partitions = item.get("partitions") or []
        if not isinstance(partitions, list):
            raise PlacementError(f"{where}.partitions: not a list")
        return Node(
            name=_text(item["name"], where + ".name"),
            states=_states(item["state"], where + ".state"),
            partitions=tuple(_text(name, where + ".partitions") for name in partitions),
        )
    except KeyError as error:
        raise PlacementError(f"{where} has no {error}") from None


def _listed(document: object, key: str, source: str) -> list[object]:
    listed = document.get(key) if isinstance(document, dict) else None
    if not isinstance(listed, list):
        command = "squeue --json" if key == "jobs" else "scontrol show nodes --json"
        raise PlacementError(f"{source}: no {key!r} list (not {command} output?)")
    return listed


def facts_from_json(
    squeue: object,
    nodes: object,
    topologies: Sequence[Topology],
    now: int,
    sources: tuple[str, str] = ("squeue", "nodes"),
) -> Facts:
    """Facts from the documents ``squeue --json`` and ``scontrol show nodes --json`` print."""
    job_items = _listed(squeue, "jobs", sources[0])
    node_items = _listed(nodes, "nodes", sources[1])
    node_facts = tuple(node_from_json(item, index, sources[1]) for index, item in enumerate(node_items))
    return Facts(
        jobs=tuple(job_from_json(item, index, sources[0]) for index, item in enumerate(job_items)),
        nodes=node_facts,
        topologies=assign_topologies(node_facts, topologies),
        now=now,
    )


# --- The head node's compact facts (``topokeeper-head-node.pyz placement-facts``) -> facts ---------------------

FACTS_SCHEMA = PLACEMENT_FACTS_SCHEMA


def facts_from_compact(document: object, source: str = "placement-facts") -> Facts:
    """Facts from the head-node program's compact document (see ``topokeeper.headnode.placement``)."""
    if not isinstance(document, dict) or document.get("schema") != FACTS_SCHEMA:
        raise PlacementError(f"{source}: not a {FACTS_SCHEMA} document")
    if document.get("error"):
        raise PlacementError(f"{source}: the head node could not read slurmctld: {_bounded(str(document['error']))}")
    # Each hostlist is bounded, the document as a whole too: a few hundred bytes of ranges (a forged object in the
    # bucket) must not build millions of names in the drift function's memory.
    budget = [MAX_HOSTLIST_NAMES]

    def names_of(hostlist: str) -> list[str]:
        names = expand(hostlist)
        budget[0] -= len(names)
        if budget[0] < 0:
            raise ValueError(f"the document names more than {MAX_HOSTLIST_NAMES} hosts")
        return names

    try:
        kinds = document["topology_kinds"]
        topologies = {
            name: Topology(name or "default", kinds[name], tuple((u, tuple(names_of(h))) for u, h in units))
            for name, units in document["topologies"].items()
        }
        nodes = tuple(
            Node(name, tuple(state.split("+")), tuple(filter(None, partitions.split(","))))
            for state, partitions, hostlist in document["nodes"]
            for name in names_of(hostlist)
        )
        jobs = tuple(
            Job(str(i), p, state, tuple(names_of(h)) if h else (), size, switches, segment, reason, since)
            for i, p, state, size, h, switches, segment, since, reason in document["jobs"]
        )
        named = {p: topologies[t or ""] for p, t in document["partition_topologies"].items() if (t or "") in topologies}
        fallback = assign_topologies(nodes, [topologies[name] for name in sorted(topologies)])
        return Facts(jobs=jobs, nodes=nodes, topologies={**fallback, **named}, now=int(document["now"]))
    except (KeyError, TypeError, ValueError) as error:  # a hostlist error is a ValueError
        raise PlacementError(f"{source}: malformed facts: {_bounded(str(error))}") from None


# --- Documents: what ``topokeeper placement --json`` prints, and what its tables are drawn from --------------

PLACEMENT_SCHEMA = "topokeeper.placement/1"


def _unit_document(unit: Unit) -> dict[str, object]:
    return {"name": unit.name, "free": unit.free, "nodes": unit.size, "by_state": dict(unit.counts)}


def partition_document(figure: PartitionFigures, units: bool = False) -> dict[str, object]:
    document: dict[str, object] = {
        "partition": figure.partition,
        "topology": figure.topology,
        "kind": figure.kind,
        "largest_placeable": figure.largest,
        "largest_placeable_without_resume": figure.largest_without_resume,
        "largest_in": list(figure.largest_units),
        "free": figure.free,
        "outside_topology": sum(figure.outside.values()),
        "typical_job_nodes": figure.typical_job_nodes,
        "stranded_free": figure.stranded_free,
        "fragmentation": figure.fragmentation,
        "jobs_spread_beyond_need": sum(1 for spread in figure.spread if spread.beyond_need),
        "pending_on_topology": sum(1 for pending in figure.pending if pending.on_topology),
        "topology_pending_seconds": max((p.seconds for p in figure.pending if p.on_topology), default=0),
    }
    if units:
        document["units"] = [_unit_document(unit) for unit in figure.units]
    return document


def placement_document(all_figures: Sequence[PartitionFigures], units: bool = False) -> dict[str, object]:
    return {
        "schema": PLACEMENT_SCHEMA,
        "partitions": [partition_document(figure, units) for figure in all_figures],
    }


def job_document(facts: Facts, job_id: str) -> dict[str, object]:
    """Where job ``job_id`` landed and how spread it is, or why it waits."""
    job = next((job for job in facts.jobs if job.job_id == job_id), None)
    if job is None:
        raise PlacementError(f"job {_bounded(job_id)} is not in the squeue output")
    classes = {node.name: node_class(node.states) for node in facts.nodes if job.partition in node.partitions}
    figure = partition_figures(job.partition, classes, [job], facts.topologies.get(job.partition), facts.now)
    document: dict[str, object] = {
        "schema": PLACEMENT_SCHEMA,
        "job": job.job_id,
        "partition": job.partition,
        "state": job.state,
        "nodes": job.node_count,
        "switches": job.switches,
        "segment": job.segment,
        "topology": figure.topology,
        "largest_placeable": figure.largest,
    }
    if job.state == "PENDING":
        pending = figure.pending[0]
        document.update(reason=job.reason, pending_seconds=pending.seconds, on_topology=pending.on_topology)
        return document
    _, unit_of = _units(facts.topologies.get(job.partition), classes)
    by_unit: dict[str, list[str]] = {}
    for name in job.nodes:
        by_unit.setdefault(unit_of.get(name, ""), []).append(name)
    spread = figure.spread[0] if figure.spread else None
    order = {name: index for index, (name, _) in enumerate(facts.topologies[job.partition].units)} if spread else {}
    document.update(
        spans=len(spread.units) if spread else len(set(by_unit) - {""}),
        fewest=spread.fewest if spread else 1,
        beyond_need=bool(spread and spread.beyond_need),
        placed=[
            {"unit": unit or None, "nodes": len(names), "hostlist": compress(names)}
            for unit, names in sorted(by_unit.items(), key=lambda item: (item[0] == "", order.get(item[0], 0)))
        ],
    )
    return document
