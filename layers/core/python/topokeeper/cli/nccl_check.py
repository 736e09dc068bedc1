"""``topokeeper nccl-check``: an NCCL check kit per leaf and block, and the verdict on its results.

Without ``--results`` it plans from a snapshot (as ``plan`` does) and writes into ``--out`` one sbatch script per
leaf switch and per block of every partition (an ``all_reduce_perf`` run on exactly that leaf's or block's nodes),
one reference script per partition across two leaves or blocks, and ``manifest.json`` naming each script's nodes
and output file. The operator submits them; with ``--results DIR`` (the directory the outputs landed in, the
manifest beside them) it reads each output (nccl-tests' table and its ``# Avg bus bandwidth`` line), flags the
leaves and blocks whose bus bandwidth is below the partition's median by more than ``--threshold``, names the
suspect nodes and prints the drain command as text (never run). Node and partition names are checked against
Slurm's safe name characters before they reach a script, and every value in a shell line is quoted.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from topokeeper.contract.errors import InputError
from topokeeper.wire import compress, expand

# The planner, pydantic and the file readers are imported where used: ``nccl-check --help`` loads none of them.

MANIFEST = "manifest.json"
MANIFEST_SCHEMA = "topokeeper.nccl-check/1"
DEFAULT_THRESHOLD = 10.0  # percent below the partition's median
DEFAULT_COMMAND = "all_reduce_perf -b 8 -e 8G -f 2 -g 1"
EXIT_FLAGGED = 3  # as drift: something needs a look
_AVG = re.compile(r"^# Avg bus bandwidth\s*:\s*(\S+)", re.MULTILINE)
_OUT_OF_BOUNDS = re.compile(r"^# Out of bounds values\s*:\s*(\d+)\s+(OK|FAILED)", re.MULTILINE)
_RANK_HOST = re.compile(r"^#\s+Rank\s+\d+.*?\son\s+(\S+)\s+device\b", re.MULTILINE)
_HEADER = re.compile(r"^#\s+size\s+count\s+type\s+redop\s+root\s+time\s+algbw\s+busbw", re.MULTILINE)


@dataclass(frozen=True)
class Run:
    """One script: a leaf or block (``reference``: across two of them) of a partition, on these nodes."""

    partition: str
    unit: str
    kind: str  # "leaf", "block" or "reference"
    nodes: tuple[str, ...]
    # Block topology: a job no larger than a block must fit in one, so the reference across two blocks asks for
    # segments of this size (sbatch --segment, with --nodelist from Slurm 25.11).
    segment: int = 0

    @property
    def stem(self) -> str:
        return f"nccl-{self.partition}-{self.unit}"

    @property
    def output(self) -> str:
        return f"{self.stem}.out"


def _checked(name: str, what: str) -> str:
    from topokeeper.domain.names import check_slurm_name  # noqa: PLC0415

    try:
        return check_slurm_name(name)
    except ValueError as error:
        raise InputError(what, str(error)) from None


def plan_runs(snapshot: Path, config: Path | None, slurm_version: str | None) -> list[Run]:
    """Each partition's leaves or blocks of two nodes or more, and a reference across its first two."""
    from topokeeper.cli.planning import leaf_units, plan_from_files  # noqa: PLC0415
    from topokeeper.domain.models import NO_TOPOLOGY_SWITCH, BlockTopology, TreeTopology  # noqa: PLC0415

    rendered = plan_from_files(snapshot, config, slurm_version)
    runs: list[Run] = []
    for partition in sorted(rendered.plan.partitions, key=lambda p: p.partition):
        if not isinstance(partition.topology, TreeTopology | BlockTopology):
            continue
        kind = "leaf" if isinstance(partition.topology, TreeTopology) else "block"
        units = [
            (u, nodes) for u, nodes in leaf_units(partition.topology) if u != NO_TOPOLOGY_SWITCH and len(nodes) > 1
        ]
        name = _checked(partition.partition, "partition")
        for unit, nodes in units:
            runs.append(Run(name, _checked(unit, name), kind, tuple(_checked(n, unit) for n in nodes)))
        if len(units) >= 2:
            (_, first), (_, second) = units[0], units[1]
            half = min(len(first), len(second)) // 2 or 1
            segment = half if kind == "block" else 0
            runs.append(Run(name, "reference", "reference", (*first[:half], *second[:half]), segment))
    if not runs:
        raise InputError("--snapshot", "no partition has two leaves or blocks of two nodes or more to check")
    stems = [run.stem for run in runs]
    if len(set(stems)) < len(stems):  # a leaf named "reference": its script would overwrite the reference's
        clash = sorted({stem for stem in stems if stems.count(stem) > 1})
        raise InputError("--snapshot", f"two runs would write the same script: {', '.join(clash)}")
    return runs


def sbatch_script(run: Run, tasks_per_node: int, gpus_per_node: int | None, command: str) -> str:
    """#SBATCH lines carry only checked names and numbers; the command line is quoted word by word."""
    words = shlex.split(command)
    return "\n".join(
        [
            "#!/bin/bash",
            f"#SBATCH --job-name=topokeeper-nccl-{run.unit}",
            f"#SBATCH --partition={run.partition}",
            f"#SBATCH --nodelist={compress(run.nodes)}",
            f"#SBATCH --nodes={len(run.nodes)}",
            f"#SBATCH --ntasks-per-node={tasks_per_node}",
            *([f"#SBATCH --gpus-per-node={gpus_per_node}"] if gpus_per_node else []),
            *([f"#SBATCH --segment={run.segment}"] if run.segment else []),
            "#SBATCH --exclusive",
            f"#SBATCH --output={run.output}",
            "set -eu",
            f"# partition {run.partition}, {run.kind} {run.unit}: {len(run.nodes)} nodes"
            if run.kind != "reference"
            else f"# partition {run.partition}, the reference across two leaves or blocks: {len(run.nodes)} nodes",
            "srun " + " ".join(shlex.quote(word) for word in words),
            "",
        ]
    )


def write_kit(args: argparse.Namespace) -> int:
    from topokeeper.contract.operator_files import write_files  # noqa: PLC0415

    for option, value in (("--tasks-per-node", args.tasks_per_node), ("--gpus-per-node", args.gpus_per_node or 1)):
        if value < 1:
            raise InputError(option, "must be 1 or more")
    try:
        words = shlex.split(args.command)
    except ValueError as error:  # an unclosed quote
        raise InputError("--command", str(error)) from None
    if not words:
        raise InputError("--command", "is empty: give the nccl-tests command each task runs")
    runs = plan_runs(args.snapshot, args.config, args.slurm_version)
    per_node = args.tasks_per_node, args.gpus_per_node
    files = {f"{run.stem}.sbatch": sbatch_script(run, *per_node, args.command) for run in runs}
    manifest = {
        "schema": MANIFEST_SCHEMA,
        "runs": [
            {
                "partition": r.partition,
                "unit": r.unit,
                "kind": r.kind,
                "nodes": compress(r.nodes),
                "output": r.output,
            }
            for r in runs
        ],
    }
    files[MANIFEST] = json.dumps(manifest, indent=2) + "\n"
    written = write_files(args.out, files)
    print("\n".join(f"wrote {path}" for path in written))
    # sbatch writes --output relative to where it runs: submit from the kit's directory.
    print(f'submit them: cd {shlex.quote(str(args.out))} && for s in *.sbatch; do sbatch "$s"; done')
    return 0


def read_manifest(directory: Path) -> list[Run]:
    from topokeeper.contract.operator_files import read_mapping  # noqa: PLC0415

    path = directory / MANIFEST
    document = read_mapping(path, "--results")
    if document.get("schema") != MANIFEST_SCHEMA or not isinstance(document.get("runs"), list):
        raise InputError(str(path), f"not a {MANIFEST_SCHEMA} manifest (written by `topokeeper nccl-check --out`)")
    runs = []
    for index, entry in enumerate(document["runs"]):
        where = f"{path}: runs[{index}]"
        if not isinstance(entry, dict) or not all(
            isinstance(entry.get(k), str) for k in ("partition", "unit", "kind", "nodes")
        ):
            raise InputError(where, "expected partition, unit, kind and nodes as strings")
        try:
            names = expand(entry["nodes"])
        except ValueError as error:
            raise InputError(where, f"nodes: {error}") from None
        nodes = tuple(_checked(name, where) for name in names)
        if entry["kind"] not in ("leaf", "block", "reference"):
            raise InputError(where, f"kind {entry['kind']!r} is not leaf, block or reference")
        run = Run(_checked(entry["partition"], where), _checked(entry["unit"], where), entry["kind"], nodes)
        if entry.get("output") != run.output:
            raise InputError(where, f"output must be {run.output}")
        runs.append(run)
    return runs


@dataclass(frozen=True)
class Measured:
    run: Run
    busbw: float  # GB/s, nccl-tests' average
    wrong: int  # out-of-bounds values


def parse_output(path: Path, run: Run, known: set[str]) -> Measured:
    """One nccl-tests output: the table's header and rows, the hosts it ran on, the summary lines. ``known``: every
    node of the kit."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise InputError(str(path), f"cannot read it: {error}") from None
    if not _HEADER.search(text):
        raise InputError(str(path), "no nccl-tests table header (size count type redop root time algbw busbw)")
    rows = _table_rows(text, path)
    average, bounds = _AVG.search(text), _OUT_OF_BOUNDS.search(text)
    if average is None or bounds is None:
        raise InputError(str(path), "truncated: no '# Out of bounds values' and '# Avg bus bandwidth' lines at the end")
    busbw = _number(average.group(1), path, "the average bus bandwidth")
    if not rows:
        raise InputError(str(path), "the table has no rows")
    _check_hosts(path, run, {host.split(".")[0] for host in _RANK_HOST.findall(text)}, known)
    return Measured(run, busbw, int(bounds.group(1)))


def _check_hosts(path: Path, run: Run, hosts: set[str], known: set[str]) -> None:
    """The ranks' hosts (``# Rank N ... on HOST device``) are the run's nodes: another run's nodes there mean a
    mixed-up file, some of its nodes missing a run on part of it. Host names that are no node of the kit at all
    (a cluster whose host names are not its Slurm node names) cannot be checked."""
    if not hosts:
        raise InputError(str(path), "no '#  Rank N ... on HOST device' lines under '# Using devices'")
    mine = {node.split(".")[0] for node in run.nodes}
    strangers = sorted((hosts & known) - mine)
    if strangers:
        shown = ", ".join(map(repr, strangers[:3])) + (", ..." if len(strangers) > 3 else "")
        raise InputError(str(path), f"ran on nodes not of {run.kind} {run.unit} ({shown}): a mixed-up output")
    missing = sorted(mine - hosts)
    if hosts & mine and missing:
        raise InputError(str(path), f"ran on {len(mine) - len(missing)} of {run.kind} {run.unit}'s {len(mine)} nodes")


def _number(text: str, path: Path, what: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise InputError(str(path), f"{what} is not a number: {text[:40]!r}") from None
    if not 0 <= value < float("inf"):
        raise InputError(str(path), f"{what} is not a finite number >= 0: {text[:40]!r}")
    return value


def _table_rows(text: str, path: Path) -> list[list[str]]:
    """The data rows (every line not starting with '#'): size, count, type, redop, root, then per place
    time, algbw, busbw, #wrong; a row that does not read so is garbled."""
    rows = []
    for number, line in enumerate(text.splitlines(), 1):
        fields = line.split()
        if not fields or line.lstrip().startswith("#"):
            continue
        if len(fields) != 13 or not fields[0].isdigit():
            raise InputError(f"{path}:{number}", f"not an nccl-tests table row: {line.strip()[:80]!r}")
        for column in (5, 6, 7, 9, 10, 11):
            _number(fields[column], path, f"line {number} column {column + 1}")
        rows.append(fields)
    return rows


def verdict(measured: list[Measured], threshold: float) -> list[dict[str, Any]]:
    """Per run: its partition's median over the leaves or blocks, and whether it is below that by more than
    ``threshold`` percent (or returned wrong values). A slow run's suspects are its nodes that other slow runs share
    (a node in two partitions' slow leaves), else all its nodes: leaves and blocks of one partition are disjoint."""
    medians: dict[str, float] = {}
    for partition in {item.run.partition for item in measured}:
        units = [i.busbw for i in measured if i.run.partition == partition and i.run.kind != "reference"]
        medians[partition] = statistics.median(units) if units else 0.0

    def is_slow(item: Measured) -> bool:
        limit = medians[item.run.partition] * (1 - threshold / 100)
        return item.run.kind != "reference" and (item.wrong > 0 or item.busbw < limit)

    slow = [item for item in measured if is_slow(item)]
    rows = []
    for item in sorted(measured, key=lambda i: (i.run.partition, i.run.kind == "reference", i.run.unit)):
        suspects: set[str] = set()
        if item in slow:
            shared = set().union(*(set(other.run.nodes) for other in slow if other is not item))
            suspects = (set(item.run.nodes) & shared) or set(item.run.nodes)
        rows.append(
            {
                "partition": item.run.partition,
                "unit": item.run.unit,
                "kind": item.run.kind,
                "nodes": compress(item.run.nodes),
                "busbw_gbps": item.busbw,
                "median_gbps": medians[item.run.partition],
                "out_of_bounds": item.wrong,
                "flagged": item in slow,
                "suspect_nodes": compress(sorted(suspects)) if suspects else "",
            }
        )
    return rows


def drain_command(rows: list[dict[str, Any]], threshold: float) -> str:
    suspects = sorted({n for row in rows if row["flagged"] for n in expand(row["suspect_nodes"])})
    if not suspects:
        return ""
    reason = f"topokeeper nccl-check: bus bandwidth more than {threshold:g}% below the partition median"
    return f"scontrol update NodeName={compress(suspects)} State=DRAIN Reason={shlex.quote(reason)}"


def check_results(args: argparse.Namespace) -> int:
    from topokeeper.render.narrate import columns  # noqa: PLC0415

    if not 0 < args.threshold < 100:
        raise InputError("--threshold", "must be a percentage between 0 and 100")
    runs = read_manifest(args.results)
    known = {node.split(".")[0] for run in runs for node in run.nodes}
    measured = [parse_output(args.results / run.output, run, known) for run in runs]
    rows = verdict(measured, args.threshold)
    command = drain_command(rows, args.threshold)
    if args.json:
        print(json.dumps({"threshold_percent": args.threshold, "runs": rows, "drain_command": command}, indent=2))
    else:
        table = [("PARTITION", "KIND", "UNIT", "NODES", "BUSBW GB/s", "MEDIAN", "VERDICT")]
        for row in rows:
            state = "reference" if row["kind"] == "reference" else ("SLOW" if row["flagged"] else "ok")
            if row["out_of_bounds"]:
                state += f", {row['out_of_bounds']} wrong values"
            table.append(
                (
                    row["partition"],
                    row["kind"],
                    row["unit"],
                    row["nodes"],
                    f"{row['busbw_gbps']:g}",
                    f"{row['median_gbps']:g}",
                    state,
                )
            )
        print("\n".join(columns(table)))
        print(f"threshold: {args.threshold:g}% below the partition's median of its leaves or blocks")
        if command:
            print("suspect nodes: drain them with (not run by topokeeper):\n  " + command)
    return EXIT_FLAGGED if command else 0


def run(args: argparse.Namespace) -> int:
    if args.results is not None:
        return check_results(args)
    if args.snapshot is None or args.out is None:
        raise InputError("nccl-check", "give --snapshot and --out to write the kit, or --results DIR to read it")
    return write_kit(args)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--snapshot", type=Path, help="snapshot JSON (as for plan): write the kit")
    parser.add_argument("--config", type=Path, help="per-partition overrides (YAML or JSON)")
    parser.add_argument("--slurm-version", help="e.g. 24.11 or 26.05 (default: the snapshot's)")
    parser.add_argument("--out", type=Path, help="directory for the sbatch scripts and manifest.json")
    parser.add_argument("--tasks-per-node", type=int, default=8, help="one task a GPU (default 8)")
    parser.add_argument(
        "--gpus-per-node", type=int, help="request GPUs (only where slurm.conf has GresTypes=gpu; default: none asked)"
    )
    parser.add_argument("--command", default=DEFAULT_COMMAND, help=f"what srun runs (default: {DEFAULT_COMMAND})")
    parser.add_argument("--results", type=Path, help="the kit's directory with the outputs: print the verdict")
    parser.add_argument(
        "--threshold", type=float, default=DEFAULT_THRESHOLD, help="percent below the median that flags (default 10)"
    )
    parser.add_argument("--json", action="store_true", help="the verdict as JSON")
