#!/usr/bin/env python3
"""topokeeper head-node applier (standard library only, Python 3.8+).

This file is copied to the Slurm head node as is and must not import anything from topokeeper.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Dict, List, Mapping, Optional


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def content_sha256(
    slurm_format: str,
    topology_plugin: Optional[str],
    files: Mapping[str, str],
    partitions: Mapping[str, Optional[str]],
) -> str:
    """The hash of what is live: topology files, ``Topology=`` per partition, and the plugin.

    The planner stamps a bundle with it (``plan_sha256``) and the applier computes it from the head
    node's disk, so "already current" is one comparison.
    """
    document = {
        "format": slurm_format,
        "topology_plugin": topology_plugin,
        "files": {name: sha256_text(content) for name, content in files.items()},
        "partitions": dict(partitions),
    }
    return sha256_text(json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=True))


_HOSTLIST_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


def expand_hostlist(expression: str) -> List[str]:
    """Expand a Slurm hostlist (numeric bracket ranges, zero padding kept)."""
    names: List[str] = []
    parts: List[str] = []
    depth = 0
    start = 0
    for index, char in enumerate(expression):
        if char == "[":
            depth += 1
        elif char == "]":
            depth -= 1
        elif char == "," and depth == 0:
            parts.append(expression[start:index])
            start = index + 1
    parts.append(expression[start:])
    for part in parts:
        if not part:
            continue
        products = [""]
        for piece in re.split(r"(\[[^\]]*\])", part):
            if piece.startswith("["):
                choices: List[str] = []
                for item in piece[1:-1].split(","):
                    match = _HOSTLIST_RANGE.match(item)
                    if not match:
                        raise ValueError("invalid hostlist range %r" % item)
                    low, high = match.group(1), match.group(2) or match.group(1)
                    choices.extend("%0*d" % (len(low), n) for n in range(int(low), int(high) + 1))
            else:
                choices = [piece]
            products = [prefix + choice for prefix in products for choice in choices]
        names.extend(products)
    return names


def parse_show_topology(text: str) -> Dict[str, Dict[str, object]]:
    """``scontrol show topology NAME`` -> {unit name: {"kind", "level", "nodes", "switches", "size"}}.

    Tree lines are ``SwitchName=... Level=.. Nodes=.. Switches=..``; block lines ``BlockName=..
    BlockIndex=.. Nodes=.. BlockSize=..``. Aggregated blocks are Slurm's own derivation and skipped.
    """
    units: Dict[str, Dict[str, object]] = {}
    for line in text.splitlines():
        fields: Dict[str, str] = {}
        for token in line.split():
            key, sep, value = token.partition("=")
            if sep:
                fields[key] = value
        if "SwitchName" in fields:
            units[fields["SwitchName"]] = {
                "kind": "switch",
                "level": int(fields.get("Level", "0")),
                "nodes": sorted(expand_hostlist(fields.get("Nodes", ""))),
                "switches": sorted(expand_hostlist(fields.get("Switches", ""))),
            }
        elif "BlockName" in fields:
            units[fields["BlockName"]] = {
                "kind": "block",
                "nodes": sorted(expand_hostlist(fields.get("Nodes", ""))),
                "size": int(fields.get("BlockSize", "0")),
            }
    return units


def partition_topologies(show_partition_output: str) -> Dict[str, Optional[str]]:
    """``scontrol -o show partition`` -> {partition: its Topology= or None}."""
    found: Dict[str, Optional[str]] = {}
    for line in show_partition_output.splitlines():
        name = re.search(r"PartitionName=(\S+)", line)
        if name:
            topology = re.search(r"(?:^|\s)Topology=(\S+)", line)
            found[name.group(1)] = topology.group(1) if topology else None
    return found
