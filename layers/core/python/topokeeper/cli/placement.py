"""``topokeeper placement``: is the topology helping? Where jobs land, what a partition can start in one leaf or
block now, and why a job waits, from what slurmctld reports.

Offline it reads the files ``squeue --json``, ``scontrol show nodes --json`` and ``scontrol show topology NAME``
print (see docs/placement.md). The figures are the pure ``topokeeper.domain.placement``; this module reads the
files and draws the tables. Job names, comments and user names never enter the facts; every other string from
Slurm is printed with anything outside a plain name's characters escaped.
"""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from topokeeper.contract.errors import InputError

# What a Slurm name, state or reason is made of; anything else is printed as an escape (``\x1b``).
_PLAIN = re.compile(r"[A-Za-z0-9 ._:@,+=/\[\]-]*")
_MAX_CELL = 64
_MAX_HOSTLIST = 4096


def safe(value: object, limit: int = _MAX_CELL) -> str:
    """``value`` as one cell: name characters kept, anything else (a newline, an escape sequence, ``$(..)``,
    ``<``) printed as its escape (``\\x1b``), at most ``limit`` characters and a ``...``."""
    text = "-" if value is None else str(value)
    if not _PLAIN.fullmatch(text):
        text = "".join(ch if _PLAIN.fullmatch(ch) else _escape(ch) for ch in text)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _escape(ch: str) -> str:
    code = ord(ch)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from topokeeper.cli.options import add_endpoint_option  # noqa: PLC0415

    add = parser.add_argument
    add(
        "--cluster",
        help="live: this deployment's cluster's placement facts: placement-facts run on its head node over SSM "
        "(read-only), or the newest its agent put (agent channel, with their age)",
    )
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--stack-name", help="with --cluster: the deployed topokeeper stack")
    where.add_argument("--deployment", type=Path, help="with --cluster: deployment JSON (the simulator writes one)")
    add_endpoint_option(parser, argparse.SUPPRESS)  # also after the subcommand
    add("--facts", type=Path, metavar="FILE", help="`topokeeper-head-node.pyz placement-facts` output")
    add("--squeue", type=Path, metavar="FILE", help="`squeue --json` output")
    add("--nodes", type=Path, metavar="FILE", help="`scontrol show nodes --json` output")
    add(
        "--topology",
        action="append",
        default=[],
        metavar="[NAME=]FILE",
        help="`scontrol show topology NAME` output, once per topology (a partition gets the one holding its nodes)",
    )
    add("--job", metavar="ID", help="where this job landed and how spread it is, or why it is pending")
    add("--partition", action="append", default=[], metavar="NAME", help="only these partitions")
    add("--units", action="store_true", help="also each leaf or block: its nodes by state")
    add("--now", type=int, metavar="EPOCH", help="the time the files were taken (default: squeue's last_update)")
    add("--json", action="store_true", help="print the document instead of the table")


def _topology_arguments(values: Sequence[str]) -> list[tuple[str, Path]]:
    found = []
    for value in values:
        name, sep, path = value.partition("=")
        found.append((name, Path(path)) if sep and name else (Path(value).stem, Path(value)))
    return found


def _read_text(path: Path, flag: str) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise InputError(flag, f"cannot read {path}: {getattr(error, 'strerror', None) or error}") from None


def _now(squeue: Mapping[str, Any], given: int | None) -> int:
    if given is not None:
        return given
    stamp = squeue.get("last_update")
    number = stamp.get("number") if isinstance(stamp, dict) else stamp
    if isinstance(number, int) and not isinstance(number, bool) and number > 0:
        return number
    raise InputError("--squeue", "no last_update in the squeue output: give --now EPOCH")


def offline_facts(args: argparse.Namespace) -> tuple[Any, dict[str, Any] | None]:
    """The facts from the files given (``--squeue``, ``--nodes``, ``--topology``) or the head node (``--cluster``),
    and where live ones came from when that is not now (the agent's: their age, and whether they are stale)."""
    from topokeeper.contract.operator_files import read_mapping  # noqa: PLC0415 (pydantic-core: only when used)
    from topokeeper.domain import placement  # noqa: PLC0415

    if args.cluster is not None:
        if args.facts or args.squeue or args.nodes or args.topology:
            raise InputError("--cluster", "reads the head node: not with --facts, --squeue, --nodes or --topology")
        document, origin = live_facts(args)
        return placement.facts_from_compact(document, f"--cluster {args.cluster}"), origin
    if args.facts is not None:
        return placement.facts_from_compact(read_mapping(args.facts, "--facts"), f"--facts {args.facts}"), None
    if args.squeue is None or args.nodes is None:
        raise InputError("placement", "give --squeue FILE and --nodes FILE, or --facts FILE")
    squeue = read_mapping(args.squeue, "--squeue")
    nodes = read_mapping(args.nodes, "--nodes")
    topologies = []
    for name, path in _topology_arguments(args.topology):
        topologies.append(placement.topology_from_text(name, _read_text(path, "--topology")))
    files = (f"--squeue {args.squeue}", f"--nodes {args.nodes}")
    return placement.facts_from_json(squeue, nodes, topologies, _now(squeue, args.now), files), None


def live_facts(args: argparse.Namespace) -> tuple[Any, dict[str, Any] | None]:
    """The head node's ``placement-facts`` document, over SSM Run Command (the program only reads; nothing from
    the cluster is in the command, and a document too large for SSM's stdout comes back through the plan bucket);
    for an agent cluster the newest its agent put, with their age (``agent_origin``)."""
    from topokeeper.adapters.aws import aws_setup_errors  # noqa: PLC0415 (boto3: only when used)
    from topokeeper.cli.operator_commands import _runtime_and_cluster  # noqa: PLC0415
    from topokeeper.contract.errors import Permanent  # noqa: PLC0415
    from topokeeper.contract.ports import Channel  # noqa: PLC0415

    with aws_setup_errors():
        runtime, cluster = _runtime_and_cluster(args)
        try:
            if cluster.effective_channel is Channel.AGENT:
                channel = runtime.agent_channel(cluster)
                document, age = channel.placement_facts(cluster.name)
                return document, agent_origin(age.total_seconds(), channel.max_report_age.total_seconds())
            return runtime.ssm_channel(cluster).placement_facts(), None
        except Permanent as error:
            raise InputError("--cluster", str(error)) from None


def agent_origin(age_seconds: float, max_age_seconds: float) -> dict[str, Any]:
    """What ``--json`` says of the agent's facts (``facts``), and the table's first line: facts older than the bound
    on the agent's reports (``agent_verify_max_age_seconds``) are stale, shown as such and never as current."""
    return {
        "source": "agent",
        "age_seconds": int(age_seconds),
        "max_age_seconds": int(max_age_seconds),
        "stale": age_seconds > max_age_seconds,
    }


def origin_line(origin: Mapping[str, Any]) -> str:
    age, bound = origin["age_seconds"], origin["max_age_seconds"]
    if origin["stale"]:
        return f"STALE: the agent's placement facts are {age} s old, over the {bound} s bound: not current\n"
    return f"placement facts put by the agent {age} s ago\n"


def run(args: argparse.Namespace) -> int:
    from topokeeper.domain import placement  # noqa: PLC0415

    try:
        facts, origin = offline_facts(args)
        if args.job is not None:
            document = placement.job_document(facts, args.job)
        else:
            chosen = [f for f in placement.figures(facts) if not args.partition or f.partition in args.partition]
            document = placement.placement_document(chosen, units=args.units)
    except placement.PlacementError as error:
        raise InputError("placement", str(error)) from None
    if origin is not None:
        document["facts"] = origin
    heading = "" if origin is None else origin_line(origin)
    print(json.dumps(document, indent=2, sort_keys=True) if args.json else heading + render(document), end="\n")
    return 0


def render(document: Mapping[str, Any]) -> str:
    """The document as its one table (and, with units, the table of leaves and blocks)."""
    return job_table(document) if "job" in document else partition_table(document)


def _columns(rows: Sequence[Sequence[object]], wide: int = -1) -> str:
    """Rows as text columns, each cell ``safe``; column ``wide`` (a hostlist) may be long."""
    from topokeeper.render.narrate import columns  # noqa: PLC0415

    cells = [
        [safe(cell, _MAX_HOSTLIST if index == wide else _MAX_CELL) for index, cell in enumerate(row)] for row in rows
    ]
    return "\n".join(columns(cells))


_PARTITION_HEADER = (
    "PARTITION",
    "TOPOLOGY",
    "LARGEST",
    "NO-RESUME",
    "IN",
    "FREE",
    "STRANDED",
    "FRAG",
    "SPREAD-BEYOND",
    "PENDING-TOPO",
    "WAIT-S",
)


def partition_table(document: Mapping[str, Any]) -> str:
    rows: list[Sequence[object]] = [_PARTITION_HEADER]
    for item in document["partitions"]:
        where = item["largest_in"]
        rows.append(
            (
                item["partition"],
                item["topology"],
                item["largest_placeable"],
                item["largest_placeable_without_resume"],
                ",".join(where[:3]) + (f",+{len(where) - 3}" if len(where) > 3 else "") or None,
                item["free"],
                item["stranded_free"],
                "{:.2f}".format(item["fragmentation"]),
                item["jobs_spread_beyond_need"],
                item["pending_on_topology"],
                item["topology_pending_seconds"],
            )
        )
    text = _columns(rows)
    unit_rows: list[Sequence[object]] = []
    for item in document["partitions"]:
        for unit in item.get("units", ()):
            counts = unit["by_state"]
            unit_rows.append((item["partition"], unit["name"], unit["nodes"], unit["free"], *counts.values()))
    if unit_rows:
        from topokeeper.domain.placement import NODE_CLASSES  # noqa: PLC0415

        header = ("PARTITION", "LEAF/BLOCK", "NODES", "FREE", *(name.upper() for name in NODE_CLASSES))
        text += "\n\n" + _columns([header, *unit_rows])
    return text


def job_table(document: Mapping[str, Any]) -> str:
    head = "job {}  partition {}  {}  {} nodes".format(
        safe(document["job"]), safe(document["partition"]), safe(document["state"]), safe(document["nodes"])
    )
    asked = "  asked --switches={} --segment={}".format(safe(document["switches"]), safe(document["segment"]))
    if "placed" not in document:
        rows = [
            ("REASON", "PENDING-S", "ON-TOPOLOGY", "LARGEST-NOW"),
            (document["reason"], document["pending_seconds"], document["on_topology"], document["largest_placeable"]),
        ]
        return head + asked + "\n" + _columns(rows)
    spans = "  spans {} of the fewest {}{}".format(
        safe(document["spans"]),
        safe(document["fewest"]),
        " (beyond need)" if document["beyond_need"] else "",
    )
    rows2: list[Sequence[object]] = [("LEAF/BLOCK", "NODES", "HOSTLIST")]
    rows2 += [(place["unit"], place["nodes"], place["hostlist"]) for place in document["placed"]]
    return head + spans + "\n" + _columns(rows2, wide=2)
