"""Nodes re-bound since the plan: deferred, while every other node of the signed plan is applied.

A bundle's ``bindings`` {NodeName: NodeAddr} are what its plan assumed (ParallelCluster binds a node to an
instance with ``scontrol update NodeAddr=``). A node bound to another address now was placed for an instance it
no longer is. The applier applies the subset of the signed plan whose bindings hold: the plan's topology file with
each such node where the file on disk has it (its leaf switch or block there, when the plan keeps that unit and
it holds nodes; else out of that topology, where it was or where no plan put it), so an apply never moves a
deferred node. The signature and plan_sha256 cover the whole plan as signed; what is written, journaled, loaded
and read back is the subset, whose content hash after_sha256 reports. A subset that cannot be written (a leaf or
block of the plan would be left without nodes) is refused whole as stale_bindings, as before.
"""

from __future__ import annotations

import re
from typing import (
    Dict,
    List,
    NamedTuple,
    Optional,
    Sequence,
    Set,
    Tuple,
)

from topokeeper.headnode.bundle import Bundle, ExpectedUnit
from topokeeper.headnode.failures import StaleBindings
from topokeeper.wire import CONF_FORMAT, HostlistError, compress, content_sha256, expand, sample

_TOPOLOGY = re.compile(r"- topology: (\S+)$")
_UNIT = re.compile(r"      - (?:switch|block): (\S+)$")
_NODES = re.compile(r"(        nodes: )(\S+)$")
_CONF_UNIT = re.compile(r"(?:SwitchName|BlockName)=(\S+)")
_CONF_NODES = re.compile(r"(\bNodes=)(\S+)")
_CONF_TOPOLOGY = ""  # topology.conf holds one topology, the bundle's only expected one


class _Slot(NamedTuple):
    """One ``nodes:`` list of a topology file: the line, where its hostlist is, and its nodes."""

    line: int
    span: Tuple[int, int]
    topology: str
    unit: str
    nodes: List[str]


def _slots(text: str, slurm_format: str) -> List[_Slot]:
    """Every node list of a topology file as topokeeper writes it; another layout yields only what it matches."""
    slots: List[_Slot] = []
    topology, unit = _CONF_TOPOLOGY, None  # type: str, Optional[str]
    for index, line in enumerate(text.split("\n")):
        if slurm_format == CONF_FORMAT:
            named, listed = _CONF_UNIT.match(line), _CONF_NODES.search(line)
            unit = named.group(1) if named else None
        else:
            started, named, listed = _TOPOLOGY.match(line), _UNIT.match(line), _NODES.match(line)
            if started:
                topology, unit = started.group(1), None
            elif named:
                unit = named.group(1)
        if listed and unit is not None:
            try:
                nodes = expand(listed.group(2))
            except HostlistError:
                continue
            slots.append(_Slot(index, listed.span(2), topology, unit, nodes))
    return slots


def rebound(bundle: Bundle, rows: Sequence[Sequence[str]]) -> Tuple[List[str], List[List[str]]]:
    """(planned nodes that powered down: NodeAddr = NodeName, no instance to misplace; [[NodeName, planned
    NodeAddr, live NodeAddr ("" when slurmctld does not list it)]] of the nodes bound elsewhere now)."""
    live = {row[0]: row[1] for row in rows}
    changed = sorted(n for n, a in bundle.bindings.items() if live.get(n) != a)
    powered_down = [n for n in changed if live.get(n) == n]
    deferred = [[n, bundle.bindings[n], live.get(n) or ""] for n in changed if live.get(n) != n]
    return powered_down, deferred


def _refuse(deferred: Sequence[Sequence[str]], why: str) -> StaleBindings:
    stale = ["%s: %s, now %s" % (name, planned, now or "(not listed)") for name, planned, now in deferred]
    return StaleBindings("%d node(s) not at the NodeAddr planned: %s; %s" % (len(stale), sample(stale), why))


def without_deferred(bundle: Bundle, deferred: Sequence[Sequence[str]], on_disk: Optional[str]) -> Bundle:
    """The subset of ``bundle`` whose bindings hold: each deferred node where ``on_disk`` (the topology file now)
    has it. The bundle itself when nothing is deferred or the subset is the whole plan."""
    if not deferred:
        return bundle
    names = {row[0] for row in deferred}
    text = bundle.files[bundle.slurm_format]
    slots = _slots(text, bundle.slurm_format)
    was: Dict[Tuple[str, str], str] = {}  # (topology, node) -> its unit in the file now
    for slot in _slots(on_disk, bundle.slurm_format) if on_disk else []:
        for node in slot.nodes:
            was[(slot.topology, node)] = slot.unit
    members: Dict[Tuple[str, str], Set[str]] = {(s.topology, s.unit): set(s.nodes) - names for s in slots}
    for topology in {s.topology for s in slots}:
        for node in sorted(names):
            unit = was.get((topology, node))
            if unit is not None and (topology, unit) in members:
                members[(topology, unit)].add(node)
    emptied = [s for s in slots if not members[(s.topology, s.unit)]]
    if emptied:
        units = sorted("%s %s" % (s.topology or CONF_FORMAT, s.unit) for s in emptied)
        raise _refuse(deferred, "without them %s would hold no node, so none is applied" % sample(units))
    lines = text.split("\n")
    for slot in reversed(slots):  # right to left: the spans of a line's earlier slots stay valid
        if members[(slot.topology, slot.unit)] != set(slot.nodes):
            line, (start, end) = lines[slot.line], slot.span
            lines[slot.line] = line[:start] + compress(members[(slot.topology, slot.unit)]) + line[end:]
    subset = "\n".join(lines)
    if subset == text:
        return bundle
    files = {bundle.slurm_format: subset}
    return bundle._replace(
        files=files,
        topologies=_expected(bundle, members),
        plan_sha256=content_sha256(bundle.slurm_format, bundle.topology_plugin, files, bundle.partitions),
    )


def _expected(bundle: Bundle, members: Dict[Tuple[str, str], Set[str]]) -> Dict[str, Dict[str, ExpectedUnit]]:
    """The read-back the subset expects: the plan's, with each leaf or block holding the subset's nodes."""
    expected: Dict[str, Dict[str, ExpectedUnit]] = {}
    for name, units in bundle.topologies.items():
        topology = _CONF_TOPOLOGY if bundle.slurm_format == CONF_FORMAT else name
        expected[name] = {
            unit_name: unit._replace(nodes=sorted(members[(topology, unit_name)]))
            if (topology, unit_name) in members
            else unit
            for unit_name, unit in units.items()
        }
    return expected
