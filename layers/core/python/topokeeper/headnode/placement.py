"""``topokeeper-head-node.pyz placement-facts``: what ``topokeeper placement`` needs from slurmctld, read-only and
compact (standard library and ``topokeeper.wire``, Python 3.8+).

It asks only for the fields the figures use: ``squeue --noheader -O`` with fixed fields (job id, partition, state,
size, node list, ``--switches``, ``--segment``, eligible and start time as epoch seconds, Slurm's reason: never a
job's name, comment or user), ``scontrol -o show nodes`` reduced to each node's state and partitions (nodes of the
same state and partitions printed as one hostlist), every partition's ``Topology=`` and the leaves and blocks of
each topology. One JSON document on stdout (schema ``topokeeper.placement-facts/1``):

    {"schema", "now", "slurm_version", "partition_topologies": {partition: name or null},
     "topologies": {name or "": [[leaf or block, hostlist], ...]}, "topology_kinds": {name or "": tree|block},
     "jobs": [[id, partition, state, size, hostlist, switches, segment, since, reason], ...],
     "nodes": [[state, "partition,...", hostlist], ...], "error": null or one line}

Strings are bounded (a reason to 64 characters); nothing is run through a shell.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
import time
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from topokeeper.computenode.hostfile import unit_names
from topokeeper.headnode.failures import Failed
from topokeeper.headnode.output import put_object, read_upload_target
from topokeeper.headnode.scontrol import (
    LiveTopologies,
    Scontrol,
    configured_slurm_conf,
    find_scontrol,
    live_partitions,
)
from topokeeper.wire import (
    FIRST_YAML_VERSION,
    MAX_FULL_RESULT_BYTES,
    MAX_STDOUT_CHARS,
    PLACEMENT_FACTS_SCHEMA,
    UPLOAD_TIMEOUT_SECONDS,
    compress,
    one_line,
    parse_slurm_version,
)

SCHEMA = PLACEMENT_FACTS_SCHEMA
MAX_TEXT = 64
# The states of jobs that hold or wait for nodes; finished ones are left out.
JOB_STATES = "PENDING,RUNNING,CONFIGURING,COMPLETING,SUSPENDED"
_FIELDS = (
    "JobID",
    "Partition",
    "State",
    "NumNodes",
    "NodeList",
    "ReqSwitch",
    "SegmentSize",
    "EligibleTime",
    "StartTime",
)
_NODE_FIELD = re.compile(r"(?:^|\s)(NodeName|State|Partitions)=(\S*)")


def _int(text: str) -> int:
    return int(text) if text.isdigit() else 0


def squeue_argv(segment: bool) -> List[str]:
    """squeue's fields, the reason last (it may hold the separator); SegmentSize from 25.05."""
    fields = [name for name in _FIELDS if segment or name != "SegmentSize"] + ["Reason"]
    return ["--noheader", "--states=" + JOB_STATES, "-O", ",".join(name + ":0|" for name in fields)[:-1]]


def parse_jobs(text: str, segment: bool) -> List[List[object]]:
    """squeue's lines -> [id, partition, state, size, hostlist, switches, segment, since, reason]."""
    names = [name for name in _FIELDS if segment or name != "SegmentSize"]
    count = len(names)
    jobs: List[List[object]] = []
    for line in text.splitlines():
        parts = line.split("|", count)
        if len(parts) != count + 1:
            continue  # not one of ours (a warning line)
        values = {name: parts[index] for index, name in enumerate(names)}
        state = values["State"][:MAX_TEXT]
        since = values["EligibleTime"] if state == "PENDING" else values["StartTime"]
        jobs.append(
            [
                values["JobID"][:MAX_TEXT],
                values["Partition"][:MAX_TEXT],
                state,
                _int(values["NumNodes"]),
                values["NodeList"] if state != "PENDING" else "",
                _int(values["ReqSwitch"]),
                _int(values.get("SegmentSize", "")),
                _int(since),
                one_line(parts[-1])[:MAX_TEXT],
            ]
        )
    return jobs


def parse_nodes(text: str) -> List[List[str]]:
    """``scontrol -o show nodes`` -> [[state, partitions, hostlist], ...], nodes of one state and partitions
    together. The first NodeName=, State= and Partitions= of a line are the node's own (a Reason= comes later)."""
    groups: Dict[Tuple[str, str], List[str]] = {}
    for line in text.splitlines():
        fields: Dict[str, str] = {}
        for key, value in _NODE_FIELD.findall(line):
            fields.setdefault(key, value)
        if "NodeName" in fields:
            key = (fields.get("State", "UNKNOWN")[:MAX_TEXT], fields.get("Partitions", "")[:1024])
            groups.setdefault(key, []).append(fields["NodeName"])
    return [[state, partitions, compress(names)] for (state, partitions), names in sorted(groups.items())]


def _topologies(
    live: LiveTopologies, names: Sequence[Optional[str]]
) -> Tuple[Dict[str, List[List[str]]], Dict[str, str]]:
    units_by_name: Dict[str, List[List[str]]] = {}
    kinds: Dict[str, str] = {}
    for name in sorted(set(names), key=lambda value: value or ""):
        shown = live.get(name)
        if shown.error or not shown.units:
            continue
        blocks = [unit for unit, fields in shown.units.items() if fields["kind"] == "block"]
        kinds[name or ""] = "block" if blocks else "tree"
        # The leaves (an upper switch lists every node below it) or the base blocks, in topology order.
        units_by_name[name or ""] = [
            [unit, compress(shown.units[unit]["nodes"])]  # type: ignore[arg-type]
            for unit in unit_names(shown.units)
            if shown.units[unit]["nodes"]
        ]
    return units_by_name, kinds


def collect(environ: Mapping[str, str], scontrol_path: Optional[str]) -> Dict[str, object]:
    """The facts document, from the live slurmctld."""
    path = find_scontrol(scontrol_path, configured_slurm_conf(environ), environ)
    scontrol = Scontrol(environ, path)
    version = one_line(scontrol.output("--version"))[:MAX_TEXT]
    try:
        # --segment came with the release that brought topology.yaml (25.05).
        segment = parse_slurm_version(version)[:2] >= FIRST_YAML_VERSION
    except ValueError:
        raise Failed("scontrol --version: no Slurm version in %r" % version) from None
    # squeue beside scontrol (the same install); epoch seconds for the times.
    squeue = Scontrol(dict(environ, SLURM_TIME_FORMAT="%s"), os.path.join(os.path.dirname(path), "squeue"))
    jobs_text = squeue.output(*squeue_argv(segment))
    partitions = live_partitions(scontrol)
    units, kinds = _topologies(LiveTopologies(scontrol), [None, *partitions.values()])
    return {
        "schema": SCHEMA,
        "now": int(time.time()),
        "slurm_version": version,
        "partition_topologies": partitions,
        "topologies": units,
        "topology_kinds": kinds,
        "jobs": parse_jobs(jobs_text, segment),
        "nodes": parse_nodes(scontrol.output("-o", "show", "nodes")),
        "error": None,
    }


def main(argv: Optional[Sequence[str]] = None, environ: Optional[Mapping[str, str]] = None) -> int:
    import argparse  # noqa: PLC0415 - only when the program runs

    parser = argparse.ArgumentParser(
        prog="topokeeper-head-node.pyz placement-facts",
        description="Print the jobs, node states and topologies topokeeper placement needs (read-only, compact).",
    )
    parser.add_argument("--scontrol", metavar="PATH", help="the scontrol to run (default: found as the applier does)")
    parser.add_argument("--upload-result", metavar="PATH", help="where a document too large for stdout goes (SSM)")
    args = parser.parse_args(argv)
    try:
        document = collect(os.environ if environ is None else environ, args.scontrol)
    except Failed as error:
        print(json.dumps({"schema": SCHEMA, "error": one_line(str(error))[:300]}))
        return 1
    text = json.dumps(document, separators=(",", ":"))
    if args.upload_result is not None and len(text) > MAX_STDOUT_CHARS:
        # SSM keeps 24,000 characters of stdout: the whole document goes where the command said, as the applier's.
        text = json.dumps(uploaded(text.encode(), args.upload_result))
    print(text)
    return 0


def uploaded(body: bytes, target_path: str) -> Dict[str, object]:
    """PUT the whole document to the command's presigned URL; what stdout says instead (``full_result``)."""
    pointer: Dict[str, object] = {"key": None, "bytes": len(body), "sha256": None, "error": None}
    try:
        target = read_upload_target(target_path)
        pointer["key"] = target.key
        if len(body) > MAX_FULL_RESULT_BYTES:
            raise ValueError("%d bytes, over the %d this program uploads" % (len(body), MAX_FULL_RESULT_BYTES))
        put_object(target.url, body, UPLOAD_TIMEOUT_SECONDS)
        pointer["sha256"] = hashlib.sha256(body).hexdigest()
    except Exception as error:  # http.client's errors are no OSError; stdout must still say what happened
        pointer["error"] = one_line("upload: %s" % error)[:300]
    error_text = None if pointer["sha256"] else "the facts do not fit stdout and %s" % pointer["error"]
    return {"schema": SCHEMA, "error": error_text, "full_result": pointer}


if __name__ == "__main__":
    sys.exit(main())
