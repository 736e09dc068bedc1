"""A job's nodes in topology order, for launchers that take a host file or a node-rank map (standard library and
``topokeeper.wire`` only, Python 3.8+: it ships in the head-node program and runs on compute nodes).

The job's hostlist (``SLURM_JOB_NODELIST``) is expanded by the wire contract's hostlist code, and a topology as
``scontrol show topology NAME`` prints it decides the order: leaves in switch-tree order (depth first from the top
switch, children in the order scontrol prints them) or blocks in the order printed, each leaf's or block's nodes
together and in Slurm's hostlist order. Ranks 0..n-1 then fill one leaf or block before the next. The head-node
program's ``hostfile`` (``topokeeper.headnode.hostfile``) reads the live topology; ``topokeeper hostfile`` a saved one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Dict, List, Mapping, Optional, Sequence, Tuple

from topokeeper.wire import HostlistError, compress, expand, one_line, parse_show_topology

if TYPE_CHECKING:
    import argparse

FORMATS = ("hosts", "rankmap")


class HostfileError(ValueError):
    """The node list, the topology or the options cannot give an order; the message says which and why."""


def _shown(names: Sequence[str]) -> str:
    """Names as they may be printed: repr (a newline or escape in a hostile name stays visible), at most five."""
    shown = [repr(name)[:80] for name in names[:5]]
    return ", ".join(shown) + (", ..." if len(names) > 5 else "")


def _tree_leaves(units: Mapping[str, Dict[str, object]]) -> List[str]:
    switches = [name for name, unit in units.items() if unit["kind"] == "switch"]
    printed = {name: index for index, name in enumerate(switches)}
    children: Dict[str, List[str]] = {}
    for name in switches:
        below: List[str] = list(units[name]["switches"])  # type: ignore[call-overload]
        children[name] = sorted((child for child in below if child in printed), key=printed.__getitem__)
    has_parent = {child for names in children.values() for child in names}
    # A leaf has no switch below it (an upper switch's Nodes= lists every node under it).
    leaves: List[str] = []
    seen = set()
    stack = [name for name in reversed(switches) if name not in has_parent]
    while stack:  # depth first, iterative: a deep tree never meets the recursion limit
        name = stack.pop()
        if name in seen:
            continue
        seen.add(name)
        if not children[name]:
            leaves.append(name)
        stack.extend(reversed(children[name]))
    # A cycle (which Slurm refuses) leaves switches unreached: keep them, in printed order, rather than drop nodes.
    return leaves + [name for name in switches if name not in seen and not children[name]]


def unit_names(units: Mapping[str, Dict[str, object]]) -> List[str]:
    """The leaves (tree) or blocks, in topology order."""
    blocks = [name for name, unit in units.items() if unit["kind"] == "block"]
    return blocks if blocks else _tree_leaves(units)


def unit_order(units: Mapping[str, Dict[str, object]]) -> List[Tuple[str, List[str]]]:
    """The leaves (tree) or blocks, in topology order, each with its nodes in Slurm's hostlist order."""
    return [(name, expand(compress(units[name]["nodes"]))) for name in unit_names(units)]  # type: ignore[arg-type]


def order_hosts(nodelist: str, units: Mapping[str, Dict[str, object]]) -> List[Tuple[str, str]]:
    """The job's nodes as (host, leaf or block), each leaf and block contiguous, in topology order."""
    try:
        wanted = expand(nodelist)
    except HostlistError as error:
        raise HostfileError("the node list is not a Slurm hostlist: %s" % error) from None
    if not wanted:
        raise HostfileError("the node list is empty")
    duplicates = sorted({name for name in wanted if wanted.count(name) > 1}) if len(set(wanted)) < len(wanted) else []
    if duplicates:
        raise HostfileError("the node list names %d node(s) twice: %s" % (len(duplicates), _shown(duplicates)))
    job = set(wanted)
    ordered: List[Tuple[str, str]] = []
    for unit, nodes in unit_order(units):
        ordered.extend((node, unit) for node in nodes if node in job)
        job.difference_update(nodes)  # a node printed under two units is ranked with the first
    if job:
        missing = [name for name in wanted if name in job]
        raise HostfileError(
            "%d node(s) of the node list are in no leaf or block of the topology: %s" % (len(missing), _shown(missing))
        )
    return ordered


def render(ordered: Sequence[Tuple[str, str]], output_format: str) -> str:
    """``hosts``: one host a line. ``rankmap``: ``RANK HOST UNIT`` a line (the leaf or block it is in)."""
    if output_format == "hosts":
        return "".join(host + "\n" for host, _ in ordered)
    return "".join("%d %s %s\n" % (rank, host, unit) for rank, (host, unit) in enumerate(ordered))


def read_topology_file(path: str) -> Dict[str, Dict[str, object]]:
    """Saved ``scontrol show topology [NAME]`` output."""
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except (OSError, UnicodeDecodeError) as error:
        raise HostfileError("--topology-file %s: cannot read it: %s" % (path, error)) from None
    return units_from_text(text, "--topology-file %s" % path)


def units_from_text(text: str, source: str) -> Dict[str, Dict[str, object]]:
    try:
        units = parse_show_topology(text)
    except ValueError as error:  # a bad Nodes= hostlist or Level=
        raise HostfileError("%s: unreadable scontrol output: %s" % (source, one_line(str(error))[:200])) from None
    return with_nodes(units, source)


def with_nodes(units: Dict[str, Dict[str, object]], source: str) -> Dict[str, Dict[str, object]]:
    if not any(unit["nodes"] for unit in units.values()):
        raise HostfileError("%s: no switch or block with nodes (a flat topology gives no order)" % source)
    return units


def add_arguments(parser: argparse.ArgumentParser, live: bool) -> None:
    """The options of ``hostfile``: the head-node program's (``live``: scontrol) and ``topokeeper hostfile``'s."""
    add = parser.add_argument
    add("nodelist", nargs="?", help="a Slurm hostlist (default: $SLURM_JOB_NODELIST)")
    if not live:
        add("--topology-file", metavar="FILE", required=True, help="saved `scontrol show topology NAME` output")
        add("--format", choices=FORMATS, default="hosts", help="hosts: one a line; rankmap: RANK HOST UNIT a line")
        return
    add("--partition", help="whose Topology= to read (default: $SLURM_JOB_PARTITION, else the cluster default)")
    add("--topology", help="the topology name to read (overrides --partition)")
    add("--topology-file", metavar="FILE", help="saved `scontrol show topology NAME` output instead of scontrol")
    add("--scontrol", metavar="PATH", help="the scontrol to run (default: found as the head-node program does)")
    add("--format", choices=FORMATS, default="hosts", help="hosts: one a line; rankmap: RANK HOST UNIT a line")


def job_nodelist(nodelist: Optional[str], environ: Mapping[str, str]) -> str:
    """The node list given, else the job's (SLURM_JOB_NODELIST)."""
    found = nodelist if nodelist is not None else environ.get("SLURM_JOB_NODELIST")
    if not found:
        raise HostfileError("no node list: give one, or run inside a job (SLURM_JOB_NODELIST is unset)")
    return found
