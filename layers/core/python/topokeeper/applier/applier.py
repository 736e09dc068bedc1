#!/usr/bin/env python3
"""topokeeper head-node applier (standard library only, Python 3.8+).

This file is copied to the Slurm head node as is and must not import anything from topokeeper. It
imports only modules that Debian's python3-minimal ships too (no difflib, shutil or tempfile), so it
also runs on minimal images.

    python3 applier.py {apply|dry-run|verify} BUNDLE.json|- [--lock-timeout SECONDS] [--scontrol PATH]
                       [--trusted-key KEY.json]

It honours ``SLURM_CONF`` (else ``/opt/slurm/etc/slurm.conf``, else what ``scontrol show config`` says),
finds ``scontrol`` without relying on PATH (``--scontrol``, else ``../bin`` of slurm.conf's directory,
else ``/opt/slurm/bin``, else PATH: HyperPod and ParallelCluster put ``/opt/slurm/bin`` on PATH only in
login shells, which neither SSM's script nor a systemd unit runs), prints exactly one JSON document on stdout
(always under 24,000 characters: SSM keeps no more) and exits 0 applied, unchanged, in_sync or
would_apply; 3 drift; 2 refused, bad_signature or replayed; 4 stale_bindings; 1 rolled_back or failed. The
document always has every key:
outcome, mode, plan_sha256, before_sha256 and after_sha256 (the live content hash, measured on disk
before and after), partitions_changed, reconfigured, reconfigure_exit_code, readback ({topology:
{units, matches, mismatches, mismatches_dropped}}), partition_topologies (live Topology= per
partition), drift ([{what: grouping|file|partition|topology|plugin, name, detail, kind: grouping|naming}]),
grouping_drift (true when some entry's kind is grouping), diff (dry-run), slurm_version, slurm_format,
config_dir, scontrol (the path of the scontrol it ran), backup_dir, duration_seconds, error, dropped
({field: how many list items or characters were cut to stay under the cap}), applier_version and recovery
(null, or what was done with a journal a killed run left: {action: rolled_forward|rolled_back, phase,
plan_sha256, errors}), signature ("verified" with --trusted-key, else "unchecked"), generation (the
signed bundle's, once verified) and slurm_nodes ([[NodeName, NodeAddr, NodeHostName, "partition,..."], ...]).

Choices the callers can rely on:

* A bundle's optional ``bindings`` {NodeName: NodeAddr} (hashed by ``bindings_sha256``) are what its plan
  assumed; apply and dry-run answer stale_bindings when one no longer holds.

* Config files: slurm.conf and the files it ``Include``s from its own directory or a directory below
  it (a relative path, or an absolute one that resolves there; a glob expands in sorted order, as
  Slurm's does; ParallelCluster's ``pcluster/*.conf``) are read and edited in place, in Slurm's
  reading order. Include lines that point elsewhere or use ``%c`` are not followed: a bundle partition defined only
  there is refused as "not in slurm.conf", and the error names those lines. Partition lines that
  continue with a trailing backslash, and ``Topology=`` on a ``PartitionName=DEFAULT`` line, are
  refused too rather than guessed at.
* Live content hash: a topology file missing from disk counts as the empty string. Slurm refuses an
  empty topology file and so does this applier (in a bundle), so a missing file never looks current.
* ``unchanged``: the disk already equals the plan AND slurmctld serves it (read back). Disk equal
  but live different (an earlier apply was cut off, or its read-back failed): reconfigure and read
  back again, rolling back to the newest backup of this plan if slurmctld refuses the files.
* An apply is a transaction (see the section "The transaction"): backup, journal, fsynced temp files,
  renames in an order whose every prefix loads, reconfigure, and a rollback of only what was
  replaced. A journal left by a killed run is rolled forward or back before anything else (apply, and
  verify when one is there). No link is followed and nothing outside the config directory written.
* One apply at a time: an ``flock`` on ``CONFIG_DIR/.topokeeper.lock``, waited for up to
  ``--lock-timeout`` seconds. dry-run and verify only read and take no lock.
* Drift is judged twice where the live state is read (verify, and apply's read-back): by name as
  before (file, partition, topology, plugin entries), and by grouping, whatever the names, because
  HyperPod writes the same grouping under its own topology, switch and block names:

  - The live topology of a bundle partition is its live ``Topology=``, else the cluster default
    (``scontrol show topology`` without a name). Before 25.05 it is the one cluster-wide topology,
    compared once with the plan's, or, when the plan has none, with each partition as flat.
  - Tree: the same set of leaf node-sets (a leaf is a switch at Level=0 or without child switches;
    the plan's no-topology leaf is a leaf like any other), all reachable from one common switch.
    Block: the same set of block node-sets (AggregatedBlock lines ignored) and the base BlockSize
    equal to the first block_sizes item in the bundle's own file (unchecked when it states none).
    Only the plan's nodes count: a live topology shared with other partitions is cut to them first.
  - A partition the plan leaves flat (its nodes: Nodes= of ``scontrol show partition``) differs when
    its live tree or block constrains it: some of its nodes in no leaf or block, its leaves without a
    common switch, or its nodes over several blocks (Slurm runs no multi-node job across those). A
    tree that only orders its nodes is fine, and so is any topology for a one-node partition.
  - A partition slurmctld does not know, or a topology scontrol cannot show, differs.

  Each partition whose grouping differs (before 25.05 with a planned topology: that topology, by
  its bundle name) gets a ``grouping`` entry, listed first. Name-based entries get kind
  ``grouping`` when a partition they concern differs (a partition entry: that partition; a topology
  entry: the partitions assigned it; the file, the plugin and, before 25.05, the topology: every
  partition), else ``naming``: only names or text differ. grouping_drift is true exactly when there
  is a grouping entry; dry-run and documents that end before the read-back say false. Any entry
  still makes the outcome drift. Grouping is judged on what slurmctld serves: a file edited but not
  reconfigured yet is naming drift until slurmctld loads it.
* A read-back that differs from the plan after slurmctld accepted the files is reported (outcome
  failed, with the mismatches) and NOT rolled back: what is on disk is exactly the plan and Slurm
  loaded it, the previous config would not match the plan either, and undoing it would hide the
  problem. The previous files stay in ``CONFIG_DIR/.topokeeper-backup/`` for a manual restore.
"""

from __future__ import annotations

import argparse
import base64
import bisect
import contextlib
import errno
import fcntl
import glob
import hashlib
import json
import math
import os
import re
import signal
import stat
import subprocess
import sys
import time
from typing import (
    Any,
    Dict,
    FrozenSet,
    Iterable,
    Iterator,
    List,
    Mapping,
    NamedTuple,
    NoReturn,
    Optional,
    Sequence,
    Set,
    Tuple,
)

APPLIER_VERSION = "1.0.0"
BUNDLE_SCHEMA = "topokeeper.bundle/2"
YAML_FORMAT = "topology.yaml"
CONF_FORMAT = "topology.conf"
FIRST_YAML_VERSION = (25, 5)  # topology.yaml and per-partition Topology= appeared in Slurm 25.05
DEFAULT_SLURM_CONF = "/opt/slurm/etc/slurm.conf"  # HyperPod: /opt/slurm links to the active version
OPT_SLURM_SCONTROL = "/opt/slurm/bin/scontrol"  # HyperPod, ParallelCluster: on PATH in login shells only
LOCK_FILE = ".topokeeper.lock"
BACKUP_DIR = ".topokeeper-backup"
BACKUPS_KEPT = 5
MAX_STDOUT_CHARS = 24000
# The time budget. A run never outlives APPLIER_BUDGET_SECONDS: every wait is cut to what is left, and
# the forward reconfigure leaves a whole RECONFIGURE_TIMEOUT for the rollback. The channels derive their
# timeouts from CHANNEL_TIMEOUT_SECONDS (adapters/ssm_channel.py imports it; agent/agent.py and
# agent/install.py mirror it, checked by tests): the budget, then SIGTERM and TERMINATE_GRACE_SECONDS
# before SIGKILL, then a margin for the interpreter, the bundle fetch and the document.
LOCK_WAIT_SECONDS = 60.0
SCONTROL_TIMEOUT = 60.0  # one query
READ_SECONDS = 180.0  # all queries of a run together (version, nodes, partitions, topologies, read-back)
RECONFIGURE_TIMEOUT = 120.0  # one reconfigure; an apply may need two (forward, rollback)
MIN_RECONFIGURE_SECONDS = 30.0  # less than this left for the forward reconfigure: nothing is written
APPLIER_BUDGET_SECONDS = LOCK_WAIT_SECONDS + READ_SECONDS + 2 * RECONFIGURE_TIMEOUT
TERMINATE_GRACE_SECONDS = 15.0
CHANNEL_MARGIN_SECONDS = 105.0
CHANNEL_TIMEOUT_SECONDS = int(APPLIER_BUDGET_SECONDS + TERMINATE_GRACE_SECONDS + CHANNEL_MARGIN_SECONDS)
DEFAULT_LOCK_TIMEOUT = LOCK_WAIT_SECONDS
MODES = ("apply", "dry-run", "verify")
EXIT_CODES = {
    "applied": 0,
    "unchanged": 0,
    "in_sync": 0,
    "would_apply": 0,
    "drift": 3,
    "refused": 2,
    "bad_signature": 2,
    "replayed": 2,
    "stale_bindings": 4,
    "rolled_back": 1,
    "failed": 1,
}


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


def partition_nodes(show_partition_output: str) -> Dict[str, List[str]]:
    """``scontrol -o show partition`` -> {partition: its nodes} (Slurm prints Nodes=ALL expanded)."""
    found: Dict[str, List[str]] = {}
    for line in show_partition_output.splitlines():
        name = re.search(r"PartitionName=(\S+)", line)
        if name:
            nodes = re.search(r"(?:^|\s)Nodes=(\S+)", line)
            found[name.group(1)] = expand_hostlist(nodes.group(1)) if nodes and nodes.group(1) != "(null)" else []
    return found


def partition_topologies(show_partition_output: str) -> Dict[str, Optional[str]]:
    """``scontrol -o show partition`` -> {partition: its Topology= or None}."""
    found: Dict[str, Optional[str]] = {}
    for line in show_partition_output.splitlines():
        name = re.search(r"PartitionName=(\S+)", line)
        if name:
            topology = re.search(r"(?:^|\s)Topology=(\S+)", line)
            found[name.group(1)] = topology.group(1) if topology else None
    return found


# --------------------------------------------------------------------------------------------------
# Errors and small helpers


class Refused(Exception):
    """The bundle, or this cluster, rules the plan out. Nothing is written."""

    outcome = "refused"


class StaleBindings(Refused):
    """A node the plan named has another NodeAddr now (re-bound): plan again."""

    outcome = "stale_bindings"


class Failed(Exception):
    """The applier could not finish (scontrol missing or failing, lock busy, I/O error)."""


def one_line(text: str) -> str:
    return " | ".join(line.strip() for line in text.splitlines() if line.strip())


def _sample(names: Sequence[str], limit: int = 5) -> str:
    return ", ".join(names[:limit]) + (", ..." if len(names) > limit else "")


def _shown(value: Optional[str]) -> str:
    return "(none)" if value is None else value


def read_text(path: str) -> str:
    """A file's text with every byte kept: undecodable bytes survive a read-edit-write round trip."""
    with open(path, encoding="utf-8", errors="surrogateescape", newline="") as handle:
        return handle.read()


def _hashable(text: str) -> str:
    """Disk text fit to hash or print: undecodable bytes become U+FFFD (such a file never equals a bundle's)."""
    return text.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


# --------------------------------------------------------------------------------------------------
# The bundle


_SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}\Z")
_SHA256_HEX = re.compile(r"[0-9a-f]{64}\Z")
_PLUGIN = re.compile(r"topology/[a-z0-9_]{1,32}\Z")
_BUNDLE_KEYS = frozenset(
    [
        "schema",
        "cluster_name",
        "plan_sha256",
        "slurm_format",
        "topology_plugin",
        "files",
        "partitions",
        "nodes",
        "topologies",
    ]
)
_SIGNING_KEYS = frozenset(["generation", "purpose", "signature"])  # a signed bundle has all three, else none


class ExpectedUnit(NamedTuple):
    """What ``scontrol show topology`` must list for one switch or block."""

    kind: str  # "switch" or "block"
    nodes: List[str]
    switches: List[str]


class Bundle(NamedTuple):
    plan_sha256: str
    slurm_format: str
    topology_plugin: Optional[str]
    files: Dict[str, str]
    partitions: Dict[str, Optional[str]]  # partition -> Topology= value; None removes the key
    nodes: List[str]
    topologies: Dict[str, Dict[str, ExpectedUnit]]
    bindings: Dict[str, str]
    cluster_name: str = ""
    generation: Optional[int] = None  # signed bundles only, as every field below
    purpose: Optional[str] = None  # "apply", or "verify": never applied
    signature: Optional[Dict[str, Any]] = None
    signed_bytes: bytes = b""  # what the signature covers: the document without "signature", canonical


def bindings_sha256(bindings: Mapping[str, str]) -> str:
    return sha256_text(json.dumps(dict(bindings), sort_keys=True, separators=(",", ":"), ensure_ascii=True))


def _no_duplicate_keys(pairs: List[Tuple[str, Any]]) -> Dict[str, Any]:
    document: Dict[str, Any] = {}
    for key, value in pairs:
        if key in document:
            raise ValueError("duplicate key %r" % key)
        document[key] = value
    return document


def _object(value: Any, where: str) -> Dict[str, Any]:
    if not isinstance(value, dict):
        raise Refused("%s: expected an object" % where)
    return value


def _safe_name(value: Any, where: str) -> str:
    if not isinstance(value, str) or not _SAFE_NAME.match(value):
        raise Refused("%s: not a safe Slurm name (letters, digits, '.', '_', '-'): %r" % (where, str(value)[:80]))
    return value


def _safe_names(value: Any, where: str) -> List[str]:
    if not isinstance(value, list):
        raise Refused("%s: expected a list of names" % where)
    return [_safe_name(item, where) for item in value]


def _text_sha256(text: str, where: str) -> str:
    try:
        return sha256_text(text)
    except UnicodeEncodeError:
        raise Refused("%s: not valid Unicode text" % where) from None


def parse_bundle(text: str) -> Bundle:
    """Check everything the applier would otherwise have to trust: schema, hashes, names."""
    try:
        document = json.loads(text, object_pairs_hook=_no_duplicate_keys)
    except ValueError as error:
        raise Refused("bundle is not valid JSON (truncated?): %s" % error) from None
    except RecursionError:  # json recurses per nesting level
        raise Refused("bundle is nested too deeply") from None
    document = _object(document, "bundle")
    if document.get("schema") != BUNDLE_SCHEMA:
        raise Refused("bundle.schema: expected %s, got %r" % (BUNDLE_SCHEMA, str(document.get("schema"))[:80]))
    missing = sorted(_BUNDLE_KEYS - set(document))
    unknown = sorted(set(document) - _BUNDLE_KEYS - _SIGNING_KEYS - {"bindings", "bindings_sha256"})
    if missing or unknown:
        raise Refused("bundle: missing keys %s, unknown keys %s" % (missing, [key[:40] for key in unknown[:5]]))

    slurm_format = document["slurm_format"]
    if slurm_format not in (YAML_FORMAT, CONF_FORMAT):
        raise Refused("bundle.slurm_format: expected %s or %s" % (YAML_FORMAT, CONF_FORMAT))
    plugin = document["topology_plugin"]
    if slurm_format == YAML_FORMAT and plugin is not None:
        raise Refused("bundle.topology_plugin: must be null for topology.yaml (Slurm ignores it there)")
    if slurm_format == CONF_FORMAT and not (isinstance(plugin, str) and _PLUGIN.match(plugin)):
        raise Refused("bundle.topology_plugin: expected topology/<name> for topology.conf, got %r" % str(plugin)[:80])

    files = _object(document["files"], "bundle.files")
    if sorted(files) != [slurm_format]:
        raise Refused("bundle.files: expected exactly one file, %s" % slurm_format)
    contents: Dict[str, str] = {}
    for name, raw_file in files.items():
        where = "bundle.files.%s" % name
        entry = _object(raw_file, where)
        content, digest = entry.get("content"), entry.get("sha256")
        if sorted(entry) != ["content", "sha256"] or not isinstance(content, str) or not isinstance(digest, str):
            raise Refused("%s: expected {content, sha256} strings" % where)
        if not content:
            raise Refused("%s: empty (Slurm refuses an empty topology file)" % where)
        if _text_sha256(content, where) != digest:
            raise Refused("%s: content does not match its sha256 (tampered or truncated)" % where)
        contents[name] = content

    partitions: Dict[str, Optional[str]] = {}
    for name, value in _object(document["partitions"], "bundle.partitions").items():
        where = "bundle.partitions.%s" % _safe_name(name, "bundle.partitions")
        if value is not None and slurm_format == CONF_FORMAT:
            raise Refused("%s: Topology= on a partition line is fatal before Slurm 25.05" % where)
        partitions[name] = None if value is None else _safe_name(value, where)

    topologies: Dict[str, Dict[str, ExpectedUnit]] = {}
    for name, units in _object(document["topologies"], "bundle.topologies").items():
        where = "bundle.topologies.%s" % _safe_name(name, "bundle.topologies")
        topologies[name] = {}
        for unit_name, raw_unit in _object(units, where).items():
            unit_where = "%s.%s" % (where, _safe_name(unit_name, where))
            unit = _object(raw_unit, unit_where)
            if unit.get("kind") not in ("switch", "block") or not set(unit) <= {"kind", "nodes", "switches"}:
                raise Refused("%s: expected {kind: switch|block, nodes, switches}" % unit_where)
            topologies[name][unit_name] = ExpectedUnit(
                unit["kind"],
                _safe_names(unit.get("nodes", []), unit_where + ".nodes"),
                _safe_names(unit.get("switches", []), unit_where + ".switches"),
            )

    plan_sha256 = document["plan_sha256"]
    if not isinstance(plan_sha256, str) or not _SHA256_HEX.match(plan_sha256):
        raise Refused("bundle.plan_sha256: expected 64 lowercase hex digits")
    if content_sha256(slurm_format, plugin, contents, partitions) != plan_sha256:
        raise Refused("bundle.plan_sha256: does not match the bundle's files, partitions and plugin (tampered?)")
    if not isinstance(document["cluster_name"], str):
        raise Refused("bundle.cluster_name: expected a string")
    signing = parse_signing(document)
    bindings = _object(document.get("bindings", {}), "bundle.bindings")
    for name, address in bindings.items():
        if not isinstance(address, str):
            raise Refused("bundle.bindings.%s: expected a string" % _safe_name(name, "bundle.bindings"))
    if set(document) & {"bindings", "bindings_sha256"} and bindings_sha256(bindings) != document.get("bindings_sha256"):
        raise Refused("bundle.bindings_sha256: does not match the bundle's bindings (tampered?)")
    return Bundle(
        plan_sha256=plan_sha256,
        slurm_format=slurm_format,
        topology_plugin=plugin,
        files=contents,
        partitions=partitions,
        nodes=_safe_names(document["nodes"], "bundle.nodes"),
        topologies=topologies,
        bindings=bindings,
        cluster_name=document["cluster_name"],
        **signing,
    )


# --------------------------------------------------------------------------------------------------
# Authentic and fresh: the KMS signature and the generation
#
# The reconcile signs sha256(signed_bytes(document)) with an asymmetric KMS key (RSASSA_PKCS1_V1_5_SHA_256,
# MessageType DIGEST). The head node holds the public key in a root-owned file (--trusted-key): the SSM
# command carries it, the agent's install script writes it. PKCS#1 v1.5 verification (RFC 8017 8.2.2) is
# one modular exponentiation and a comparison with the one encoding the digest allows, never a parse of the
# decrypted block (what the Bleichenbacher'06 forgeries exploit). Each signed bundle carries a generation
# that only grows per cluster; an apply records it beside the journal and a lower one is refused.

SIGNATURE_ALGORITHM = "RSASSA_PKCS1_V1_5_SHA_256"
TRUSTED_KEY_SCHEMA = "topokeeper.signing-key/1"
GENERATION_FILE = "generation.json"
MIN_RSA_BITS = 2048
_SHA256_DIGEST_INFO = bytes.fromhex("3031300d060960864801650304020105000420")  # RFC 8017 9.2 note 1
_RSA_ENCRYPTION = bytes.fromhex("2a864886f70d010101")  # OID 1.2.840.113549.1.1.1
_GENERATION_MAX = 2**63 - 1


class BadSignature(Refused):
    """The bundle's signature is missing, malformed or not made by the trusted key."""

    outcome = "bad_signature"


class Replayed(Refused):
    """A validly signed bundle older than the last one this head node applied."""

    outcome = "replayed"


class TrustedKey(NamedTuple):
    cluster: str
    key_id: str
    modulus: int
    exponent: int


def signed_bytes(document: Mapping[str, Any]) -> bytes:
    """The bytes a signature covers: the bundle document without its signature, as canonical JSON."""
    unsigned = {key: value for key, value in document.items() if key != "signature"}
    return json.dumps(unsigned, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode("ascii")


def parse_signing(document: Mapping[str, Any]) -> Dict[str, Any]:
    present = _SIGNING_KEYS & set(document)
    if not present:
        return {}
    if present != _SIGNING_KEYS:
        raise BadSignature(
            "bundle: a signed bundle has %s; missing %s" % (sorted(_SIGNING_KEYS), sorted(_SIGNING_KEYS - present))
        )
    generation, purpose, signature = document["generation"], document["purpose"], document["signature"]
    if type(generation) is not int or not 1 <= generation <= _GENERATION_MAX:
        raise BadSignature("bundle.generation: expected a whole number from 1 to 2**63-1")
    if purpose not in ("apply", "verify"):
        raise BadSignature("bundle.purpose: expected apply or verify")
    if not (isinstance(signature, dict) and sorted(signature) == ["algorithm", "key_id", "value"]):
        raise BadSignature("bundle.signature: expected {algorithm, key_id, value}")
    if signature["algorithm"] != SIGNATURE_ALGORITHM:
        raise BadSignature("bundle.signature.algorithm: expected %s" % SIGNATURE_ALGORITHM)
    return {
        "generation": generation,
        "purpose": purpose,
        "signature": signature,
        "signed_bytes": signed_bytes(document),
    }


def _der(data: bytes, offset: int, tag: int) -> Tuple[int, int]:
    """The start and end of the value of the DER element of ``tag`` at ``offset``."""
    if offset + 2 > len(data) or data[offset] != tag:
        raise ValueError("expected DER tag 0x%02x at %d" % (tag, offset))
    length, offset = data[offset + 1], offset + 2
    if length & 0x80:
        count = length & 0x7F
        if not 1 <= count <= 4:
            raise ValueError("bad DER length at %d" % offset)
        length, offset = int.from_bytes(data[offset : offset + count], "big"), offset + count
    if offset + length > len(data):
        raise ValueError("DER element runs past the end")
    return offset, offset + length


def rsa_public_key(der: bytes) -> Tuple[int, int]:
    """(modulus, exponent) of a DER SubjectPublicKeyInfo of an RSA key, as KMS GetPublicKey returns it."""
    start, _ = _der(der, 0, 0x30)
    algorithm, algorithm_end = _der(der, start, 0x30)
    oid, oid_end = _der(der, algorithm, 0x06)
    if der[oid:oid_end] != _RSA_ENCRYPTION:
        raise ValueError("not an RSA public key")
    bits, _ = _der(der, algorithm_end, 0x03)
    if der[bits : bits + 1] != b"\x00":
        raise ValueError("the key's BIT STRING has unused bits")
    sequence, _ = _der(der, bits + 1, 0x30)
    modulus_start, modulus_end = _der(der, sequence, 0x02)
    exponent_start, exponent_end = _der(der, modulus_end, 0x02)
    modulus = int.from_bytes(der[modulus_start:modulus_end], "big")
    exponent = int.from_bytes(der[exponent_start:exponent_end], "big")
    if modulus.bit_length() < MIN_RSA_BITS or exponent < 3 or exponent % 2 == 0:
        raise ValueError("RSA key too small or with a bad exponent")
    return modulus, exponent


def read_trusted_key(path: str) -> TrustedKey:
    """The head node's public key file; it must be root's (this user's) and writable by no one else."""
    try:
        fd = os.open(path, os.O_RDONLY | _NOFOLLOW | getattr(os, "O_NONBLOCK", 0))  # a FIFO must not block
        with os.fdopen(fd, "rb") as reader:
            found = os.fstat(reader.fileno())
            if not stat.S_ISREG(found.st_mode):
                raise ValueError("not a regular file")
            if found.st_uid != os.geteuid() or found.st_mode & 0o022:
                raise ValueError(
                    "owner uid %d, mode %04o: must be this user's, writable by no one else"
                    % (found.st_uid, stat.S_IMODE(found.st_mode))
                )
            document = json.loads(reader.read().decode("utf-8"))
        if not isinstance(document, dict) or document.get("schema") != TRUSTED_KEY_SCHEMA:
            raise ValueError("expected schema %s" % TRUSTED_KEY_SCHEMA)
        cluster, key_id, public_key = document.get("cluster"), document.get("key_id"), document.get("public_key")
        if not (isinstance(cluster, str) and isinstance(key_id, str) and isinstance(public_key, str)):
            raise ValueError("expected cluster, key_id and public_key strings")
        modulus, exponent = rsa_public_key(base64.b64decode(public_key, validate=True))
    except (OSError, ValueError) as error:  # binascii.Error and JSON errors are ValueErrors
        raise BadSignature("cannot check the signature: trusted key %s: %s" % (path, error)) from None
    return TrustedKey(cluster, key_id, modulus, exponent)


def pkcs1_sha256_valid(key: TrustedKey, digest: bytes, signature: bytes) -> bool:
    """RSASSA-PKCS1-v1_5 verification with SHA-256 (RFC 8017 8.2.2): the signature's e-th power mod n must
    equal, byte for byte, 00 01 FF..FF 00 DigestInfo(digest); compared in time independent of where it differs."""
    size = (key.modulus.bit_length() + 7) // 8
    if len(signature) != size or len(digest) != 32:
        return False
    representative = int.from_bytes(signature, "big")
    if representative >= key.modulus:
        return False
    encoded = pow(representative, key.exponent, key.modulus).to_bytes(size, "big")
    suffix = _SHA256_DIGEST_INFO + digest
    expected = b"\x00\x01" + b"\xff" * (size - len(suffix) - 3) + b"\x00" + suffix
    difference = 0
    for index in range(size):
        difference |= encoded[index] ^ expected[index]
    return difference == 0


def check_signature(bundle: Bundle, mode: str, key: TrustedKey) -> None:
    """Before anything else: signed by the trusted key, for this cluster, for this use."""
    if bundle.signature is None or bundle.generation is None:
        raise BadSignature("the bundle is not signed, and this head node trusts only bundles signed by %s" % key.key_id)
    try:
        value = base64.b64decode(str(bundle.signature["value"]), validate=True)
    except ValueError:
        raise BadSignature("bundle.signature.value: not base64") from None
    if not pkcs1_sha256_valid(key, hashlib.sha256(bundle.signed_bytes).digest(), value):
        raise BadSignature(
            "the signature does not verify with the trusted key %s (the bundle says %s): forged or edited"
            % (key.key_id, str(bundle.signature["key_id"])[:200])
        )
    if bundle.cluster_name != key.cluster:
        raise Refused("the bundle is for cluster %r; this head node is %r" % (bundle.cluster_name[:80], key.cluster))
    if mode == "apply" and bundle.purpose != "apply":
        raise Refused("the bundle is signed for %s only, never to apply" % bundle.purpose)


def _backup_root_read_only(config_dir: str) -> Optional[int]:
    """The backup root's fd to read, without creating it (verify and dry-run write nothing); None if absent."""
    try:
        return os.open(os.path.join(config_dir, BACKUP_DIR), os.O_RDONLY | _DIRECTORY | _NOFOLLOW)
    except FileNotFoundError:
        return None


def last_generation(backup_fd: int) -> Tuple[int, Optional[str]]:
    """The generation (and its plan) of the last signed bundle an apply accepted here; (0, None) before any."""
    try:
        document = _read_json(backup_fd, GENERATION_FILE)
    except (ValueError, Failed) as error:
        raise Failed(
            "%s is not readable JSON (%s): remove it only if no older bundle can be replayed" % (GENERATION_FILE, error)
        ) from None
    if document is None:
        return 0, None
    generation, plan = document.get("generation"), document.get("plan_sha256")
    if type(generation) is not int or not isinstance(plan, str):
        raise Failed("%s: expected {generation, plan_sha256}" % GENERATION_FILE)
    return generation, plan


def check_generation(bundle: Bundle, mode: str, last: Tuple[int, Optional[str]]) -> None:
    """Only newer than the last apply; the same generation only as the very same bundle again (a retry)."""
    generation, plan = last
    offered = bundle.generation or 0  # a signed bundle's is at least 1
    older = offered < generation
    other = mode == "apply" and offered == generation and bundle.plan_sha256 != plan
    if older or other:
        raise Replayed(
            "bundle generation %d is not newer than generation %d, applied here last (plan %s): an older bundle"
            " put back?" % (offered, generation, (plan or "")[:12])
        )


def accept_generation(backup_fd: int, bundle: Bundle, faults: "Faults") -> None:
    """Under the lock, before anything is written: record the generation, so no older bundle applies after it."""
    check_generation(bundle, "apply", last_generation(backup_fd))
    document = {"generation": bundle.generation, "plan_sha256": bundle.plan_sha256}
    _write_json(backup_fd, GENERATION_FILE, document, faults, "generation")


# --------------------------------------------------------------------------------------------------
# slurm.conf: read and edit one key, keeping every other byte


_KEY_VALUE = re.compile(r'([A-Za-z][A-Za-z0-9_]*)=("[^"]*"|\S*)')
_INCLUDE = re.compile(r"\s*include\s+(\S+)", re.IGNORECASE)
_MAX_INCLUDE_DEPTH = 8


class Entry(NamedTuple):
    """One ``Key=value`` on a line; ``start``/``end`` span the whole token."""

    key: str
    value: str
    start: int
    end: int


def strip_comment(line: str) -> str:
    """What Slurm parses of a line: up to a ``#`` that is not escaped by an odd number of backslashes."""
    backslashes = 0
    for index, char in enumerate(line):
        if char == "#" and backslashes % 2 == 0:
            return line[:index]
        backslashes = backslashes + 1 if char == "\\" else 0
    return line


def line_entries(line: str) -> List[Entry]:
    content = strip_comment(line)
    entries: List[Entry] = []
    for match in _KEY_VALUE.finditer(content):
        if match.start() > 0 and not content[match.start() - 1].isspace():
            continue
        value = match.group(2)
        if len(value) >= 2 and value[0] == value[-1] == '"':
            value = value[1:-1]
        entries.append(Entry(match.group(1), value, match.start(), match.end()))
    return entries


def _continues(line: str) -> bool:
    content = strip_comment(line).rstrip("\r")
    return (len(content) - len(content.rstrip("\\"))) % 2 == 1


def _remove_entry(line: str, entry: Entry) -> str:
    start, end = entry.start, entry.end
    while start > 0 and line[start - 1] in " \t":
        start -= 1
    if start == 0:  # nothing before it: drop the separator after it instead
        while end < len(line) and line[end] in " \t":
            end += 1
    return line[:start] + line[end:]


def set_key(line: str, key: str, value: Optional[str]) -> str:
    """Set ``key=value`` on one slurm.conf line, or remove the key when ``value`` is None.

    Slurm keys are case-insensitive, so an existing key keeps its own spelling. A new key goes after
    the last ``key=value``, before trailing spaces or a comment. Every other byte is kept.
    """
    matching = [entry for entry in line_entries(line) if entry.key.lower() == key.lower()]
    keep = matching[:1] if value is not None else []
    for entry in reversed(matching[len(keep) :]):
        line = _remove_entry(line, entry)
    if keep:
        first = keep[0]
        return line[: first.start] + "%s=%s" % (first.key, value) + line[first.end :]
    if value is None:
        return line
    entries = line_entries(line)
    end = entries[-1].end if entries else len(strip_comment(line).rstrip())
    return line[:end] + " %s=%s" % (key, value) + line[end:]


def _include_matches(pattern: str) -> List[str]:
    """The files an Include names: the path itself, or a glob's matches in sorted order (as glob(3) gives)."""
    if not glob.has_magic(pattern):
        return [pattern]
    return sorted(glob.glob(pattern))


class ConfLine(NamedTuple):
    path: str
    number: int  # physical line number (0-based) in that file
    entries: List[Entry]
    continues: bool  # ends with a backslash: Slurm joins the next line to it


class SlurmConf:
    """slurm.conf and the files it Includes from its own directory, in Slurm's reading order."""

    def __init__(self, path: str) -> None:
        self.directory = os.path.dirname(os.path.abspath(path))
        self._real_directory = os.path.realpath(self.directory)
        self.main = os.path.realpath(path)
        self.texts: Dict[str, str] = {}
        self.lines: List[ConfLine] = []
        self.not_followed: List[str] = []
        self._read(self.main, 0)

    def _read(self, path: str, depth: int) -> None:
        try:
            text = read_text(path)
        except OSError as error:
            raise Failed("cannot read %s: %s" % (path, error.strerror)) from None
        self.texts[path] = text
        continued = False
        for index, line in enumerate(text.split("\n")):
            starts = not continued
            continued = _continues(line)
            if not starts:
                continue
            include = _INCLUDE.match(strip_comment(line))
            if include:
                self._include(include.group(1), depth)
            else:
                self.lines.append(ConfLine(path, index, line_entries(line), continued))

    def _include(self, target: str, depth: int) -> None:
        # Slurm resolves a relative Include against slurm.conf's directory; %c is the cluster name.
        pattern = os.path.join(self.directory, target)
        if "%" in target or depth >= _MAX_INCLUDE_DEPTH:
            self.not_followed.append(target)
            return
        for path in _include_matches(pattern):
            real = os.path.realpath(path)
            inside = os.path.commonpath([real, self._real_directory]) == self._real_directory
            if inside and os.path.isfile(real) and real not in self.texts:
                self._read(real, depth + 1)
            elif real not in self.texts:
                self.not_followed.append(target)

    def _lines_starting_with(self, key: str) -> List[ConfLine]:
        return [line for line in self.lines if line.entries and line.entries[0].key.lower() == key.lower()]

    def last_value(self, key: str) -> Optional[str]:
        """A global key's value: the last line that sets it wins, as in Slurm."""
        lines = self._lines_starting_with(key)
        return lines[-1].entries[0].value if lines else None

    def partition_lines(self, name: str) -> List[ConfLine]:
        return [line for line in self._lines_starting_with("PartitionName") if line.entries[0].value == name]

    def partition_names(self) -> Set[str]:
        names = {line.entries[0].value for line in self._lines_starting_with("PartitionName")}
        return {name for name in names if name.upper() != "DEFAULT"}

    def partition_topology(self, name: str) -> Optional[str]:
        lines = self.partition_lines(name)
        values = [entry.value for entry in lines[-1].entries if entry.key.lower() == "topology"] if lines else []
        return values[-1] if values else None

    def edited_texts(self, partitions: Mapping[str, Optional[str]], plugin: Optional[str]) -> Dict[str, str]:
        """The config files that change when each partition gets its Topology= (and the plugin is set)."""
        for line in self._lines_starting_with("PartitionName"):
            if line.entries[0].value.upper() == "DEFAULT" and any(e.key.lower() == "topology" for e in line.entries):
                raise Refused(
                    "%s line %d sets Topology= for every partition (PartitionName=DEFAULT); topokeeper sets it"
                    " per partition and cannot remove an inherited one" % (line.path, line.number + 1)
                )
        physical = {path: text.split("\n") for path, text in self.texts.items()}
        for name, value in sorted(partitions.items()):
            for line in self.partition_lines(name):
                if line.continues:
                    raise Refused(
                        "%s line %d: partition %s continues on the next line (trailing backslash);"
                        " topokeeper does not edit continued lines" % (line.path, line.number + 1, name)
                    )
                physical[line.path][line.number] = set_key(physical[line.path][line.number], "Topology", value)
        if plugin is not None:
            plugin_lines = self._lines_starting_with("TopologyPlugin")
            for line in plugin_lines:
                physical[line.path][line.number] = set_key(physical[line.path][line.number], "TopologyPlugin", plugin)
            if not plugin_lines:
                main = physical[self.main]
                if main[-1]:  # no newline at the end yet
                    main.append("")
                main[-1:] = ["TopologyPlugin=%s" % plugin, ""]
        edited = {path: "\n".join(lines) for path, lines in physical.items()}
        return {path: text for path, text in edited.items() if text != self.texts[path]}


# --------------------------------------------------------------------------------------------------
# What is on disk, and what would change


class DiskState(NamedTuple):
    files: Dict[str, Optional[str]]  # None: the file does not exist
    partitions: Dict[str, Optional[str]]  # Topology= on each bundle partition's line
    plugin: Optional[str]  # TopologyPlugin= in slurm.conf


def _topology_path(conf: SlurmConf, name: str) -> str:
    # Never resolved: a link there is refused before an apply writes (refuse_links).
    return os.path.join(os.path.realpath(conf.directory), name)


def read_disk_state(conf: SlurmConf, bundle: Bundle) -> DiskState:
    files: Dict[str, Optional[str]] = {}
    for name in bundle.files:
        path = _topology_path(conf, name)
        try:
            files[name] = read_text(path)
        except FileNotFoundError:
            files[name] = None
        except OSError as error:
            raise Failed("cannot read %s: %s" % (path, error.strerror)) from None
    return DiskState(
        files=files,
        partitions={name: conf.partition_topology(name) for name in bundle.partitions},
        plugin=conf.last_value("TopologyPlugin"),
    )


def disk_sha256(bundle: Bundle, state: DiskState) -> str:
    # Slurm >= 25.05 ignores TopologyPlugin once topology.yaml exists, so only topology.conf counts it.
    plugin = state.plugin if bundle.slurm_format == CONF_FORMAT else bundle.topology_plugin
    files = {name: _hashable(content or "") for name, content in state.files.items()}
    return content_sha256(bundle.slurm_format, plugin, files, state.partitions)


class Change(NamedTuple):
    path: str
    old: Optional[str]  # None: the file did not exist
    new: str
    written_like: os.stat_result  # owner and mode for the new file
    original: Optional[os.stat_result]  # owner and mode to restore


def planned_changes(conf: SlurmConf, bundle: Bundle, state: DiskState) -> Tuple[List[Change], List[str]]:
    """The files to write (topology file first), and the partitions whose Topology= changes."""
    slurm_conf_stat = os.stat(conf.main)
    changes: List[Change] = []
    for name, content in sorted(bundle.files.items()):
        if state.files[name] != content:
            path = _topology_path(conf, name)
            original = os.stat(path, follow_symlinks=False) if state.files[name] is not None else None
            # HyperPod writes topology files slurm:slurm 0600; slurm.conf's owner and mode carry that.
            changes.append(Change(path, state.files[name], content, slurm_conf_stat, original))
    plugin = bundle.topology_plugin if bundle.slurm_format == CONF_FORMAT else None
    for path, text in sorted(conf.edited_texts(bundle.partitions, plugin).items()):
        own = os.stat(path)
        changes.append(Change(path, conf.texts[path], text, own, own))
    changed = sorted(name for name, value in bundle.partitions.items() if state.partitions.get(name) != value)
    return changes, changed


def _lines(text: Optional[str]) -> List[str]:
    """A file's lines without newlines (a final newline adds no empty line)."""
    lines = text.split("\n") if text else []
    if lines and lines[-1] == "":
        lines.pop()
    return lines


def _longest_increasing(pairs: Sequence[Tuple[int, int]]) -> List[Tuple[int, int]]:
    """The longest subsequence of ``pairs`` (ordered by their second index) whose first index increases."""
    tails: List[int] = []  # tails[k]: the smallest first index that ends an increasing run of length k + 1
    tail_at: List[int] = []  # where in pairs that run ends
    previous: List[int] = []  # per pair: the pair before it in its run, or -1
    for position, (first, _) in enumerate(pairs):
        k = bisect.bisect_left(tails, first)
        if k == len(tails):
            tails.append(first)
            tail_at.append(position)
        else:
            tails[k], tail_at[k] = first, position
        previous.append(tail_at[k - 1] if k else -1)
    run: List[Tuple[int, int]] = []
    position = tail_at[-1] if tail_at else -1
    while position >= 0:
        run.append(pairs[position])
        position = previous[position]
    return run[::-1]


def line_diff(old: Sequence[str], new: Sequence[str]) -> List[Tuple[str, str]]:
    """Edits from ``old`` to ``new`` as (" " | "-" | "+", line).

    Lines that occur exactly once in each file anchor the match, as in patience diff (topology files
    are mostly unique lines: switch names, node lists); between anchors, common leading and trailing
    lines are kept and the rest is replaced. Written here because python3-minimal has no difflib.
    """
    edits: List[Tuple[str, str]] = []

    def gap(old_lo: int, old_hi: int, new_lo: int, new_hi: int) -> None:
        while old_lo < old_hi and new_lo < new_hi and old[old_lo] == new[new_lo]:
            edits.append((" ", old[old_lo]))
            old_lo, new_lo = old_lo + 1, new_lo + 1
        tail = 0
        while old_hi - tail > old_lo and new_hi - tail > new_lo and old[old_hi - tail - 1] == new[new_hi - tail - 1]:
            tail += 1
        edits.extend(("-", line) for line in old[old_lo : old_hi - tail])
        edits.extend(("+", line) for line in new[new_lo : new_hi - tail])
        edits.extend((" ", line) for line in old[old_hi - tail : old_hi])

    old_count: Dict[str, int] = {}
    old_at: Dict[str, int] = {}
    for index, line in enumerate(old):
        old_count[line], old_at[line] = old_count.get(line, 0) + 1, index
    new_count: Dict[str, int] = {}
    for line in new:
        new_count[line] = new_count.get(line, 0) + 1
    anchors = [(old_at[line], j) for j, line in enumerate(new) if new_count[line] == 1 and old_count.get(line) == 1]
    old_pos = new_pos = 0
    for i, j in _longest_increasing(anchors):
        gap(old_pos, i, new_pos, j)
        edits.append((" ", old[i]))
        old_pos, new_pos = i + 1, j + 1
    gap(old_pos, len(old), new_pos, len(new))
    return edits


def _hunk_range(start: int, length: int) -> str:
    return "%d,%d" % (start + 1 if length else start, length)


def unified_diff(old: Optional[str], new: str, path: str, context: int = 3) -> str:
    """A unified diff of one file (``old`` None: the file does not exist yet)."""
    edits = line_diff(_lines(old), _lines(new))
    old_before: List[int] = []  # lines of old and new before each edit, for the hunk headers
    new_before: List[int] = []
    old_seen = new_seen = 0
    groups: List[List[int]] = []  # [first, last] changed edit of each hunk
    for index, (op, _) in enumerate(edits):
        old_before.append(old_seen)
        new_before.append(new_seen)
        old_seen += op != "+"
        new_seen += op != "-"
        if op != " ":
            if groups and index - groups[-1][1] <= 2 * context:
                groups[-1][1] = index
            else:
                groups.append([index, index])
    if not groups:
        return ""
    out = ["--- %s\n" % ("/dev/null" if old is None else path), "+++ %s\n" % path]
    for first, last in groups:
        low, high = max(first - context, 0), min(last + context + 1, len(edits))
        hunk = edits[low:high]
        old_length = sum(op != "+" for op, _ in hunk)
        new_length = sum(op != "-" for op, _ in hunk)
        out.append(
            "@@ -%s +%s @@\n" % (_hunk_range(old_before[low], old_length), _hunk_range(new_before[low], new_length))
        )
        out.extend(op + _hashable(line) + "\n" for op, line in hunk)
    return "".join(out)


def disk_drift(conf: SlurmConf, bundle: Bundle, state: DiskState) -> List[Dict[str, str]]:
    drift: List[Dict[str, str]] = []
    for name, content in sorted(bundle.files.items()):
        on_disk = state.files[name]
        if on_disk is None:
            drift.append({"what": "file", "name": name, "detail": "missing from %s" % conf.directory})
        elif on_disk != content:
            edits = [op for op, _ in line_diff(_lines(content), _lines(on_disk)) if op != " "]
            detail = "differs from the plan: -%d +%d lines" % (edits.count("-"), edits.count("+"))
            drift.append({"what": "file", "name": name, "detail": detail})
    known = conf.partition_names()
    for name, value in sorted(bundle.partitions.items()):
        if name not in known:
            drift.append({"what": "partition", "name": name, "detail": "not in slurm.conf"})
        elif state.partitions[name] != value:
            detail = "slurm.conf has Topology=%s, the plan %s" % (_shown(state.partitions[name]), _shown(value))
            drift.append({"what": "partition", "name": name, "detail": detail})
    if bundle.slurm_format == CONF_FORMAT and state.plugin != bundle.topology_plugin:
        detail = "slurm.conf has %s, the plan %s" % (_shown(state.plugin), _shown(bundle.topology_plugin))
        drift.append({"what": "plugin", "name": "TopologyPlugin", "detail": detail})
    return drift


# --------------------------------------------------------------------------------------------------
# The transaction: backup, journal, new files, renames, reconfigure, and the recovery of a cut-off one
#
# Nothing outside the config directory is written, and no link is followed: every file is reached from
# the directory's fd, component by component, with O_NOFOLLOW. The backup root holds the backups and
# the journal and must be a real directory owned by this user (root on a head node) with mode 0700.

JOURNAL = "journal.json"
MANIFEST = "manifest.json"
CRASH_ENV = "TOPOKEEPER_APPLIER_CRASH_AT"  # a step name: the applier SIGKILLs itself there (tests)
FAULT_ENV = "TOPOKEEPER_APPLIER_FAULT_AT"  # "point=ERRNO": that write fails with that errno (tests)
_BACKUP_NAME = re.compile(r"\d{8}T\d{6}Z-[0-9a-f]{8}\Z")
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
_LINK_UNSUPPORTED = (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP, errno.EOPNOTSUPP)


class Faults:
    """Deterministic crash points and injected write errors, named by the environment (tests only)."""

    def __init__(self, environ: Mapping[str, str]) -> None:
        self.crash_at = environ.get(CRASH_ENV, "")
        point, _, name = environ.get(FAULT_ENV, "").partition("=")
        self.fault_at, self.fault_errno = point, getattr(errno, name, 0) if name.isupper() else 0

    def crash(self, step: str) -> None:
        if step == self.crash_at:
            os.kill(os.getpid(), signal.SIGKILL)

    def crash_during(self, step: str, action: Any) -> Any:
        """Run ``action``; at this crash point, in a forked child while this process dies: a SIGKILL mid-way."""
        if step != self.crash_at:
            return action()
        if os.fork() == 0:
            try:
                action()
            finally:
                os._exit(0)
        os.kill(os.getpid(), signal.SIGKILL)

    def check(self, point: str, path: str) -> None:
        if point == self.fault_at and self.fault_errno:
            raise OSError(self.fault_errno, os.strerror(self.fault_errno), path)


def _is_link(st: Optional[os.stat_result]) -> bool:
    return st is not None and stat.S_ISLNK(st.st_mode)


class ConfigDir:
    """The config directory, opened once; files are named relative to it and reached without following links."""

    def __init__(self, path: str) -> None:
        self.path = os.path.realpath(path)
        self.fd = os.open(self.path, os.O_RDONLY | _DIRECTORY)

    def close(self) -> None:
        os.close(self.fd)

    def relative(self, path: str) -> str:
        relative = os.path.relpath(os.path.abspath(path), self.path)
        if relative == os.curdir or relative.split(os.sep)[0] == os.pardir or os.path.isabs(relative):
            raise Refused("%s is outside the config directory %s: topokeeper writes only there" % (path, self.path))
        return relative

    def parent(self, relative: str) -> Tuple[int, str]:
        """An fd of ``relative``'s directory (the caller closes it) and its base name; no link is followed."""
        parts = relative.split(os.sep)
        if any(part in ("", os.curdir, os.pardir) for part in parts):
            raise Refused("%s: not a plain path inside the config directory" % relative)
        fd = os.dup(self.fd)
        try:
            for part in parts[:-1]:
                child = os.open(part, os.O_RDONLY | _DIRECTORY | _NOFOLLOW, dir_fd=fd)
                os.close(fd)
                fd = child
        except BaseException:
            os.close(fd)
            raise
        return fd, parts[-1]

    def lstat(self, relative: str) -> Optional[os.stat_result]:
        fd, name = self.parent(relative)
        try:
            return os.stat(name, dir_fd=fd, follow_symlinks=False)
        except FileNotFoundError:
            return None
        finally:
            os.close(fd)

    def sha256(self, relative: str) -> Optional[str]:
        """The content hash of a regular file, None when it is missing; a link is refused, never read."""
        fd, name = self.parent(relative)
        try:
            try:
                handle = os.open(name, os.O_RDONLY | _NOFOLLOW, dir_fd=fd)
            except FileNotFoundError:
                return None
            with os.fdopen(handle, "rb") as reader:
                return hashlib.sha256(reader.read()).hexdigest()
        finally:
            os.close(fd)


def refuse_links(config: ConfigDir, paths: Iterable[str]) -> None:
    """A symlinked topology file or slurm.conf is refused, not followed (a root applier would re-own its target)."""
    for path in paths:
        found = config.lstat(config.relative(path))
        if _is_link(found):
            raise Refused(
                "%s is a symbolic link: topokeeper does not write through links; replace it with a regular file" % path
            )
        if found is not None and not stat.S_ISREG(found.st_mode):
            raise Refused("%s is not a regular file" % path)


def _write_file(dir_fd: int, name: str, data: bytes, like: Optional[os.stat_result]) -> None:
    """A new file (never an existing one, never through a link), fsynced, with ``like``'s owner and mode."""
    fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW, 0o600, dir_fd=dir_fd)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        if like is not None:
            if (like.st_uid, like.st_gid) != (os.geteuid(), os.getegid()):
                os.fchown(fd, like.st_uid, like.st_gid)
            os.fchmod(fd, stat.S_IMODE(like.st_mode))
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(name, dir_fd=dir_fd)
        raise
    os.close(fd)


def _write_json(dir_fd: int, name: str, document: Mapping[str, Any], faults: Faults, point: str) -> None:
    """Replace ``name`` atomically: a fsynced temp file renamed over it, then the directory fsynced."""
    temporary = ".%s.%s.tmp" % (name, os.urandom(4).hex())
    faults.check(point, name)
    _write_file(dir_fd, temporary, (json.dumps(document, indent=1, sort_keys=True) + "\n").encode(), None)
    os.rename(temporary, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    os.fsync(dir_fd)


def _read_json(dir_fd: int, name: str) -> Optional[Dict[str, Any]]:
    try:
        fd = os.open(name, os.O_RDONLY | _NOFOLLOW, dir_fd=dir_fd)
    except FileNotFoundError:
        return None
    with os.fdopen(fd, "rb") as reader:
        document = json.loads(reader.read().decode("utf-8"))
    if not isinstance(document, dict):
        raise Failed("%s: not a JSON object" % name)
    return document


def open_backup_root(config: ConfigDir) -> int:
    """The backup root's fd; it must be a real directory owned by this user (root) with mode 0700."""
    where = os.path.join(config.path, BACKUP_DIR)
    with contextlib.suppress(FileExistsError):
        os.mkdir(BACKUP_DIR, 0o700, dir_fd=config.fd)
    found = os.stat(BACKUP_DIR, dir_fd=config.fd, follow_symlinks=False)
    if not stat.S_ISDIR(found.st_mode) or found.st_uid != os.geteuid() or stat.S_IMODE(found.st_mode) != 0o700:
        kind = "a symbolic link" if _is_link(found) else "not a directory" if not stat.S_ISDIR(found.st_mode) else None
        detail = kind or "owner uid %d, mode %04o" % (found.st_uid, stat.S_IMODE(found.st_mode))
        raise Refused(
            "backup root %s must be a directory owned by uid %d with mode 0700 (found %s); nothing written:"
            " fix or remove it" % (where, os.geteuid(), detail)
        )
    fd = os.open(BACKUP_DIR, os.O_RDONLY | _DIRECTORY | _NOFOLLOW, dir_fd=config.fd)
    opened = os.fstat(fd)
    if (opened.st_dev, opened.st_ino) != (found.st_dev, found.st_ino):  # swapped between the check and the open
        os.close(fd)
        raise Refused("backup root %s changed while it was opened; nothing written" % where)
    return fd


def prune_backups(backup_fd: int, keep: Iterable[str]) -> None:
    """Keep the newest few backups (and any in use). Only real directories named like a backup are
    removed, and only the files directly in them: a planted link is skipped, never followed."""
    names = sorted(name for name in os.listdir(backup_fd) if _BACKUP_NAME.match(name))
    for old in names[:-BACKUPS_KEPT]:
        if old in keep:
            continue
        try:
            fd = os.open(old, os.O_RDONLY | _DIRECTORY | _NOFOLLOW, dir_fd=backup_fd)
        except OSError:
            continue  # a link or a file under a backup's name: not ours, left alone
        try:
            for name in os.listdir(fd):
                with contextlib.suppress(OSError):
                    os.unlink(name, dir_fd=fd)  # unlink removes a link itself, never its target
        finally:
            os.close(fd)
        with contextlib.suppress(OSError):
            os.rmdir(old, dir_fd=backup_fd)


class Step(NamedTuple):
    """One file of the transaction: written to ``temp`` first, then renamed over ``path`` in order."""

    label: str  # names its crash points: after-temp:<label>, after-rename:<label>
    path: str  # relative to the config directory
    temp: str
    text: str
    like: os.stat_result


def _union_yaml(old: str, new: str) -> Optional[str]:
    """``new`` plus the topologies of ``old`` that ``new`` lacks (after it, so ``new``'s cluster default stays
    first), or None when a file is not a block-style list of ``- topology: NAME`` entries."""
    old_entries, new_entries = _yaml_entries(old), _yaml_entries(new)
    if old_entries is None or new_entries is None:
        return None
    kept = [text for name, text in old_entries if name not in {name for name, _ in new_entries}]
    return new + ("" if new.endswith("\n") else "\n") + "".join(kept) if kept else None


_YAML_ITEM_NAME = re.compile(r"(?:- |  )topology:\s*(\S+)\s*$")


def _yaml_entries(text: str) -> Optional[List[Tuple[str, str]]]:
    entries: List[Tuple[Optional[str], List[str]]] = []
    for line in text.splitlines(True):
        if line.startswith("- "):
            entries.append((None, []))
        elif not entries:
            if line.strip() and line.strip() != "---" and not line.lstrip().startswith("#"):
                return None
            continue
        elif line.strip() and not line[0].isspace() and not line.startswith("#"):
            return None
        name, lines = entries[-1]
        found = _YAML_ITEM_NAME.match(line) if name is None else None
        entries[-1] = (found.group(1) if found else name, [*lines, line])
    if any(name is None for name, _ in entries):
        return None
    return [(str(name), "".join(lines)) for name, lines in entries]


def yaml_topology_names(text: Optional[str]) -> Optional[Set[str]]:
    entries = _yaml_entries(text or "")
    return None if entries is None else {name for name, _ in entries}


def ordered_steps(conf: SlurmConf, bundle: Bundle, changes: Sequence[Change], config: ConfigDir) -> List[Step]:
    """The renames in an order whose every prefix slurmctld can load.

    topology.yaml first when it defines every name slurm.conf uses now; else a union of the old and new
    topologies first, slurm.conf second, the new file last. topology.conf: the file first (the old plugin
    ignores or reads it), slurm.conf second; switching the plugin between tree and block has no loadable
    order (each file is fatal with the other's plugin), and the journal recovery closes that window.
    """
    topology = [change for change in changes if os.path.basename(change.path) == bundle.slurm_format]
    confs = [change for change in changes if change not in topology]

    def step(change: Change, text: str, label: str) -> Step:
        relative = config.relative(change.path)
        directory, name = os.path.split(relative)
        temp = os.path.join(directory, ".%s.%s.topokeeper-new" % (name, os.urandom(4).hex()))
        return Step(label, relative, temp, text, change.written_like)

    conf_steps = [step(change, change.new, os.path.basename(change.path)) for change in confs]
    if not topology:
        return conf_steps
    change = topology[0]
    final = step(change, change.new, bundle.slurm_format)
    if bundle.slurm_format == YAML_FORMAT and confs:
        names = conf.partition_names()
        used_now = {conf.partition_topology(name) for name in names} - {None}
        used_next = {bundle.partitions.get(name, conf.partition_topology(name)) for name in names} - {None}
        if not used_now <= (yaml_topology_names(change.new) or set()):
            union = _union_yaml(change.old or "", change.new)
            if union is not None:
                return [step(change, union, bundle.slurm_format + "+union"), *conf_steps, final]
            if used_next <= (yaml_topology_names(change.old) or set()):
                return [
                    *conf_steps,
                    final,
                ]  # a file we cannot merge: the old one defines every name slurm.conf will use
    return [final, *conf_steps]


class Context(NamedTuple):
    """What an apply or a recovery needs besides the bundle."""

    scontrol: "Scontrol"
    budget: "Budget"
    faults: Faults
    lock_timeout: float
    signed: bool = False  # the signature was checked: the apply records the bundle's generation


class Transaction:
    """Backup, journal, new files, renames, reconfigure; roll back what was replaced when slurmctld refuses."""

    def __init__(self, config: ConfigDir, backup_fd: int, context: Context, log_path: Optional[str]) -> None:
        self.config, self.backup_fd, self.log_path = config, backup_fd, log_path
        self.scontrol, self.budget, self.faults = context.scontrol, context.budget, context.faults

    # -- the journal ------------------------------------------------------------------------------

    def journal(self) -> Optional[Dict[str, Any]]:
        """The journal a cut-off run left; one this applier did not write is refused, never acted on (root
        would otherwise restore from, or delete, whatever its names point at)."""
        where = os.path.join(self.config.path, BACKUP_DIR, JOURNAL)
        try:
            journal = _read_json(self.backup_fd, JOURNAL)
            problem = None if journal is None else _journal_problem(journal)
        except (ValueError, Failed) as error:
            problem = "not readable JSON: %s" % error
        if problem:
            raise Failed(
                "%s is not a journal this applier wrote (%s); nothing done: check the config files against the"
                " backups beside it, then remove it" % (where, problem)
            )
        return journal

    def _set_phase(self, journal: Dict[str, Any], phase: str) -> None:
        journal["phase"] = phase
        _write_json(self.backup_fd, JOURNAL, journal, self.faults, "journal")

    def _mark_rolling_back(self, journal: Dict[str, Any]) -> None:
        # Best effort (a full disk refuses it): recovery also sees from the files that a roll-forward is impossible.
        with contextlib.suppress(OSError):
            self._set_phase(journal, "rolling_back")

    def _end(self, journal: Dict[str, Any]) -> None:
        # A journal that cannot be removed only makes the next run roll forward what is already in place.
        with contextlib.suppress(OSError):
            os.unlink(JOURNAL, dir_fd=self.backup_fd)
            os.fsync(self.backup_fd)
            prune_backups(self.backup_fd, keep=[journal["backup"]])

    # -- backup -----------------------------------------------------------------------------------

    def _backup(self, steps: Sequence[Step], plan_sha256: str) -> Tuple[str, List[Dict[str, Any]]]:
        """Keep each file about to be replaced in a new backup directory: a hard link (no space needed, and
        restoring it needs none), or a copy where links are impossible."""
        name = time.strftime("%Y%m%dT%H%M%SZ-", time.gmtime()) + os.urandom(4).hex()
        os.mkdir(name, 0o700, dir_fd=self.backup_fd)
        target = os.open(name, os.O_RDONLY | _DIRECTORY | _NOFOLLOW, dir_fd=self.backup_fd)
        files: List[Dict[str, Any]] = []
        try:
            for path in dict.fromkeys(step.path for step in steps):
                new_sha256 = [
                    hashlib.sha256(s.text.encode("utf-8", "surrogateescape")).hexdigest()
                    for s in steps
                    if s.path == path
                ]
                entry: Dict[str, Any] = {
                    "path": path,
                    "existed": False,
                    "copy": None,
                    "sha256": None,
                    "new_sha256": new_sha256,
                }
                parent, base = self.config.parent(path)
                try:
                    found = os.stat(base, dir_fd=parent, follow_symlinks=False) if _exists_at(parent, base) else None
                    if found is not None:
                        taken = {entry["copy"] for entry in files}
                        copy = base if base not in taken else "%03d-%s" % (len(files), base)
                        self.faults.check("backup", path)
                        _link_or_copy(parent, base, target, copy)
                        entry.update(existed=True, copy=copy, sha256=self.config.sha256(path))
                finally:
                    os.close(parent)
                files.append(entry)
            os.fsync(target)
            manifest = {
                "applier_version": APPLIER_VERSION,
                "plan_sha256": plan_sha256,
                "config_dir": self.config.path,
                "files": files,
            }
            _write_json(target, MANIFEST, manifest, self.faults, "backup")
        finally:
            os.close(target)
        os.fsync(self.backup_fd)
        return name, files

    # -- forward ----------------------------------------------------------------------------------

    def run(self, steps: Sequence[Step], plan_sha256: str, result: Dict[str, Any]) -> bool:
        """Write ``steps`` and have slurmctld load them (True); on refusal, put back what was replaced (False)."""
        if self.budget.left() - RECONFIGURE_TIMEOUT < MIN_RECONFIGURE_SECONDS:
            raise Failed(
                "only %.0f s of the applier's %.0f s budget left, too little to reconfigure and roll back;"
                " nothing written" % (self.budget.left(), APPLIER_BUDGET_SECONDS)
            )
        try:
            backup, files = self._backup(steps, plan_sha256)
        except OSError as error:
            raise Failed("could not back up the current files (%s); nothing was changed" % _os_error(error)) from None
        result["backup_dir"] = os.path.join(self.config.path, BACKUP_DIR, backup)
        journal: Dict[str, Any] = {
            "applier_version": APPLIER_VERSION,
            "plan_sha256": plan_sha256,
            "backup": backup,
            "files": files,
            "steps": [
                {
                    "label": s.label,
                    "path": s.path,
                    "temp": s.temp,
                    "sha256": hashlib.sha256(s.text.encode("utf-8", "surrogateescape")).hexdigest(),
                }
                for s in steps
            ],
        }
        try:
            self._set_phase(journal, "prepared")
        except OSError as error:
            raise Failed("could not write the journal (%s); nothing was changed" % _os_error(error)) from None
        self.faults.crash("after-journal")
        try:
            for step in steps:
                parent, name = self.config.parent(step.temp)
                try:
                    self.faults.check("temp:" + step.label, step.temp)
                    _write_file(parent, name, step.text.encode("utf-8", "surrogateescape"), step.like)
                    os.fsync(parent)
                finally:
                    os.close(parent)
                self.faults.crash("after-temp:" + step.label)
            self._set_phase(journal, "renaming")
        except (OSError, Failed) as error:
            errors = self._discard(journal)
            raise Failed(
                "could not write the new files (%s); nothing was replaced%s" % (_os_error(error), _listed(errors))
            ) from None
        renamed = self._rename(journal)
        if renamed:
            self._mark_rolling_back(journal)
            errors = self._restore(journal)
            raise Failed("could not replace %s; %s" % (renamed, _restored(errors)))
        code, message = self.faults.crash_during(
            "during-reconfigure",
            lambda: reconfigure(self.scontrol, self.log_path, self.budget.left() - RECONFIGURE_TIMEOUT),
        )
        self.faults.crash("after-reconfigure")
        result["reconfigured"], result["reconfigure_exit_code"] = True, code
        if code == 0:
            self._end(journal)
            return True
        # A daemonized slurmctld keeps the old config, but the bad files would break
        # `scontrol show topology` and the next restart: put the old ones back and reload them.
        errors, again, again_message = self.roll_back(journal)
        result["outcome"] = "failed" if again or errors else "rolled_back"
        if errors:
            result["error"] = "slurmctld rejected the new config (%s); %s" % (message, _restored(errors))
        elif again:
            result["error"] = "slurmctld rejected the new config (%s); the previous files are restored but %s" % (
                message,
                again_message,
            )
        else:
            result["error"] = "slurmctld rejected the new config; the previous one is restored and live: %s" % message
        return False

    def _rename(self, journal: Dict[str, Any]) -> str:
        """Rename the remaining temp files over their targets in order: "" when all are in place, else what failed."""
        for entry in journal["steps"]:
            parent, temp = self.config.parent(entry["temp"])
            try:
                if not _exists_at(parent, temp):
                    continue  # renamed before a crash
                self.faults.check("rename:" + entry["label"], entry["path"])
                os.rename(temp, os.path.basename(entry["path"]), src_dir_fd=parent, dst_dir_fd=parent)
                os.fsync(parent)
            except OSError as error:
                return "%s (%s)" % (entry["path"], _os_error(error))
            finally:
                os.close(parent)
            self.faults.crash("after-rename:" + entry["label"])
        return ""

    # -- backward ---------------------------------------------------------------------------------

    def roll_back(self, journal: Dict[str, Any]) -> Tuple[List[str], int, str]:
        """Restore what was replaced, then reload it: (restore errors, reconfigure exit code, its message)."""
        self._mark_rolling_back(journal)
        errors = self._restore(journal)
        again, again_message = self.faults.crash_during(
            "during-rollback-reconfigure",
            lambda: reconfigure(self.scontrol, self.log_path, self.budget.left()),
        )
        return errors, again, again_message

    def _restore(self, journal: Dict[str, Any]) -> List[str]:
        """Put back each file this transaction replaced, continuing past errors; the journal stays while one is left."""
        errors = self._discard_temps(journal)
        ours: Dict[str, Set[str]] = {entry["path"]: set(entry["new_sha256"]) for entry in journal["files"]}
        backup: Optional[int] = None
        try:
            backup = os.open(journal["backup"], os.O_RDONLY | _DIRECTORY | _NOFOLLOW, dir_fd=self.backup_fd)
        except OSError as error:
            errors.append("backup %s: %s" % (journal["backup"], _os_error(error)))
        restored = 0
        for entry in journal["files"]:
            path = entry["path"]
            try:
                current = self.config.sha256(path)
                if current == entry["sha256"] or (current is None and not entry["existed"]):
                    continue  # never replaced
                if current not in ours[path] and current is not None:
                    errors.append("%s: changed by someone else since; left as it is" % path)
                    continue
                self.faults.check("restore:" + os.path.basename(path), path)
                parent, name = self.config.parent(path)
                try:
                    if entry["existed"]:
                        if backup is None:
                            raise OSError(errno.ENOENT, "no backup to restore from", path)
                        temp = ".%s.%s.topokeeper-old" % (name, os.urandom(4).hex())
                        _link_or_copy(backup, entry["copy"], parent, temp)
                        try:
                            os.rename(temp, name, src_dir_fd=parent, dst_dir_fd=parent)
                        except OSError:
                            with contextlib.suppress(OSError):
                                os.unlink(temp, dir_fd=parent)
                            raise
                    else:
                        os.unlink(name, dir_fd=parent)
                    os.fsync(parent)
                finally:
                    os.close(parent)
                restored += 1
                if restored == 1:
                    self.faults.crash("during-rollback")
            except (OSError, Failed) as error:
                errors.append("%s: %s" % (path, _os_error(error)))
        if backup is not None:
            os.close(backup)
        if not errors:
            self._end(journal)
        return errors

    def _discard_temps(self, journal: Dict[str, Any]) -> List[str]:
        errors = []
        for entry in journal["steps"]:
            try:
                parent, temp = self.config.parent(entry["temp"])
                try:
                    os.unlink(temp, dir_fd=parent)
                except FileNotFoundError:
                    pass
                finally:
                    os.close(parent)
            except OSError as error:
                errors.append("%s: %s" % (entry["temp"], _os_error(error)))
        return errors

    def _discard(self, journal: Dict[str, Any]) -> List[str]:
        """Nothing was renamed yet: drop the temp files and the journal."""
        errors = self._discard_temps(journal)
        if not errors:
            self._end(journal)
        return errors

    # -- recovery ---------------------------------------------------------------------------------

    def recover(self, result: Dict[str, Any]) -> None:
        """Finish or undo a transaction that a kill cut off, before anything else runs.

        Before every new file was written and fsynced (phase prepared): undo, nothing was replaced. After
        (renaming, reconfiguring): roll forward, rename the rest and reconfigure, rolling back if slurmctld
        refuses. A cut-off rollback is finished.
        """
        journal = self.journal()
        if journal is None:
            return
        phase = journal.get("phase")
        record: Dict[str, Any] = {"phase": phase, "plan_sha256": journal.get("plan_sha256"), "errors": []}
        result["recovery"] = record
        if phase == "prepared":
            record["action"] = "rolled_back"
            record["errors"] = _short(self._discard(journal))
            return
        if phase == "renaming" and self._can_finish(journal):
            failed = self._rename(journal)
            if not failed:
                self._set_phase(journal, "reconfiguring")
                code, message = reconfigure(self.scontrol, self.log_path, self.budget.left() - RECONFIGURE_TIMEOUT)
                result["reconfigured"], result["reconfigure_exit_code"] = True, code
                if code == 0:
                    record["action"] = "rolled_forward"
                    self._end(journal)
                    return
                record["refused"] = one_line(message)[:300]
        errors, again, again_message = self.roll_back(journal)
        record["action"] = "rolled_back"
        record["errors"] = _short(errors + ([again_message] if again else []))
        result["reconfigured"], result["reconfigure_exit_code"] = True, again
        if errors:
            raise Failed("a previous apply was cut off and could not be rolled back: %s" % "; ".join(errors))

    def _can_finish(self, journal: Dict[str, Any]) -> bool:
        """Whether renaming the temp files still there yields exactly the planned files: every temp file
        left is complete, and each file whose last temp is gone holds its planned content already."""
        last: Dict[str, Dict[str, Any]] = {}
        for entry in journal["steps"]:
            found = self.config.sha256(entry["temp"])
            if found is not None and found != entry["sha256"]:
                return False
            last[entry["path"]] = entry
        for path, entry in last.items():
            if self.config.sha256(entry["temp"]) is None and self.config.sha256(path) != entry["sha256"]:
                return False
        return True


def _plain_path(value: Any) -> bool:
    parts = value.split(os.sep) if isinstance(value, str) else [""]
    return not any(part in ("", os.curdir, os.pardir) for part in parts)


def _files_problem(files: Any) -> Optional[str]:
    """What makes a journal's or manifest's file list other than one ``_backup`` wrote, or None."""
    if not isinstance(files, list) or not all(isinstance(entry, dict) for entry in files):
        return "files: expected a list of objects"
    for entry in files:
        copy = entry.get("copy")
        if not _plain_path(entry.get("path")):
            return "files: path %r" % str(entry.get("path"))[:80]
        if not (copy is None or (_plain_path(copy) and os.sep not in copy)):
            return "files: copy %r" % str(copy)[:80]
        if not isinstance(entry.get("new_sha256"), list) or not isinstance(entry.get("existed"), bool):
            return "files: %s lacks new_sha256 or existed" % entry["path"]
    return None


def _journal_problem(journal: Dict[str, Any]) -> Optional[str]:
    if not isinstance(journal.get("backup"), str) or not _BACKUP_NAME.match(journal["backup"]):
        return "backup %r" % str(journal.get("backup"))[:80]
    steps = journal.get("steps")
    if not isinstance(steps, list) or not all(isinstance(step, dict) for step in steps):
        return "steps: expected a list of objects"
    for step in steps:
        path, temp = step.get("path"), step.get("temp")
        if not (_plain_path(path) and _plain_path(temp) and isinstance(step.get("label"), str)):
            return "steps: path %r, temp %r" % (str(path)[:80], str(temp)[:80])
        directory, name = os.path.split(path)
        expected = re.compile(r"\.%s\.[0-9a-f]{8}\.topokeeper-new\Z" % re.escape(name))
        if os.path.dirname(temp) != directory or not expected.match(os.path.basename(temp)):
            return "steps: %r is not a temp file of %r" % (str(temp)[:80], path)
    return _files_problem(journal.get("files"))


def _exists_at(dir_fd: int, name: str) -> bool:
    try:
        os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return True


def _link_or_copy(src_fd: int, name: str, dst_fd: int, new_name: str) -> None:
    """``name`` as ``new_name``: a hard link (the same owner, mode and bytes, and no free space needed), or a
    copy with the same owner and mode where the filesystem has no links."""
    try:
        os.link(name, new_name, src_dir_fd=src_fd, dst_dir_fd=dst_fd, follow_symlinks=False)
        return
    except OSError as error:
        if error.errno not in _LINK_UNSUPPORTED:
            raise
    fd = os.open(name, os.O_RDONLY | _NOFOLLOW, dir_fd=src_fd)
    with os.fdopen(fd, "rb") as reader:
        _write_file(dst_fd, new_name, reader.read(), os.fstat(reader.fileno()))


def _os_error(error: BaseException) -> str:
    if isinstance(error, OSError) and error.strerror:
        return "%s: %s" % (error.filename, error.strerror) if error.filename else error.strerror
    return str(error)


def _short(errors: Sequence[str], limit: int = 10) -> List[str]:
    return [one_line(error)[:300] for error in errors[:limit]]


def _listed(errors: Sequence[str]) -> str:
    return "" if not errors else " (cleanup errors: %s)" % "; ".join(errors)


def _restored(errors: Sequence[str]) -> str:
    if not errors:
        return "the previous files are restored"
    return "the previous files could NOT all be restored (%s); the journal stays and the next run retries" % "; ".join(
        errors
    )


@contextlib.contextmanager
def exclusive_lock(directory: str, timeout: float) -> Iterator[None]:
    path = os.path.join(directory, LOCK_FILE)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | _NOFOLLOW, 0o600)
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as error:
                if error.errno not in (errno.EAGAIN, errno.EACCES):
                    raise
                if time.monotonic() >= deadline:
                    raise Failed(
                        "lock busy: another apply holds %s (waited %.1f s, see --lock-timeout)" % (path, timeout)
                    ) from None
                time.sleep(0.1)
        yield
    finally:
        os.close(fd)  # releases the lock


class Budget:
    """The applier's whole time budget, as a deadline every wait is cut to."""

    def __init__(self, seconds: float) -> None:
        self.deadline = time.monotonic() + seconds

    def left(self) -> float:
        return max(self.deadline - time.monotonic(), 0.0)


# --------------------------------------------------------------------------------------------------
# scontrol


class Scontrol:
    deadline: Optional[float] = None  # the run's Budget: no call outlives it

    def __init__(self, environ: Mapping[str, str], path: str) -> None:
        self.env = dict(environ)
        self.path = path

    def run(self, *args: str, timeout: float = SCONTROL_TIMEOUT) -> subprocess.CompletedProcess[str]:
        timeout = _within_deadline(timeout, self.deadline, args)
        try:
            return subprocess.run(
                [self.path, *args],
                capture_output=True,
                encoding="utf-8",
                errors="replace",
                timeout=timeout,
                env=self.env,
                check=False,
            )
        except OSError as error:
            raise Failed("cannot run %s: %s" % (self.path, error.strerror)) from None
        except subprocess.TimeoutExpired:
            raise Failed("scontrol %s did not finish within %.0f s" % (" ".join(args), timeout)) from None

    def output(self, *args: str) -> str:
        result = self.run(*args)
        if result.returncode != 0:
            message = one_line(result.stderr or result.stdout) or "no output"
            raise Failed("scontrol %s exited %d: %s" % (" ".join(args), result.returncode, message))
        return result.stdout


def _within_deadline(timeout: float, deadline: Optional[float], args: Sequence[str]) -> float:
    if deadline is None:
        return timeout
    left = deadline - time.monotonic()
    if left <= 0:
        raise Failed(
            "the applier's %.0f s time budget is spent (before scontrol %s)" % (APPLIER_BUDGET_SECONDS, " ".join(args))
        )
    return min(timeout, left)


_VERSION = re.compile(r"(\d+)\.(\d+)(?:\.(\d+))?")


def parse_slurm_version(text: str) -> Tuple[int, int, int]:
    """``slurm 26.05.5`` or ``slurm-wlm 24.11.5`` -> (26, 5, 5)."""
    match = _VERSION.search(text)
    if not match:
        raise Failed("cannot read a Slurm version from %r" % one_line(text)[:80])
    return int(match.group(1)), int(match.group(2)), int(match.group(3) or 0)


def format_for_version(version: Tuple[int, int, int]) -> str:
    return YAML_FORMAT if version[:2] >= FIRST_YAML_VERSION else CONF_FORMAT


def _executable(path: str) -> bool:
    return os.path.isfile(path) and os.access(path, os.X_OK)


def find_scontrol(explicit: Optional[str], slurm_conf: Optional[str], environ: Mapping[str, str]) -> str:
    """``--scontrol``, else ``../bin/scontrol`` from slurm.conf's directory, else /opt/slurm/bin, else PATH."""
    if explicit is not None:
        if not _executable(explicit):
            raise Failed("--scontrol %s: not an executable file" % explicit)
        return explicit
    candidates = []
    if slurm_conf:
        config_dir = os.path.dirname(os.path.abspath(slurm_conf))
        candidates.append(os.path.normpath(os.path.join(config_dir, os.pardir, "bin", "scontrol")))
    if OPT_SLURM_SCONTROL not in candidates:
        candidates.append(OPT_SLURM_SCONTROL)
    path = environ.get("PATH", os.defpath)
    on_path = [os.path.join(directory, "scontrol") for directory in path.split(os.pathsep) if directory]
    for candidate in candidates + on_path:
        if _executable(candidate):
            return candidate
    raise Failed(
        "scontrol not found: not %s, nor on PATH (%s); give it with --scontrol" % (" or ".join(candidates), path)
    )


def configured_slurm_conf(environ: Mapping[str, str]) -> Optional[str]:
    """SLURM_CONF, else /opt/slurm/etc/slurm.conf if it exists: what is found without asking scontrol."""
    configured = environ.get("SLURM_CONF")
    if configured:
        return configured
    return DEFAULT_SLURM_CONF if os.path.isfile(DEFAULT_SLURM_CONF) else None


def find_slurm_conf(environ: Mapping[str, str], scontrol: Scontrol) -> str:
    configured = configured_slurm_conf(environ)
    if configured:
        return configured
    match = re.search(r"^SLURM_CONF\s*=\s*(\S+)", scontrol.output("show", "config"), re.MULTILINE)
    if not match:
        raise Failed(
            "cannot find slurm.conf: SLURM_CONF is unset, %s is missing, and scontrol does not say"
            % (DEFAULT_SLURM_CONF)
        )
    return match.group(1)


def node_rows(show_nodes_output: str) -> List[List[str]]:
    rows = []
    for line in show_nodes_output.splitlines():
        found = dict(re.findall(r"(?:^|\s)(NodeName|NodeAddr|NodeHostName|Partitions)=(\S*)", line))
        name = found.get("NodeName")
        if name:
            rows.append(
                [name, found.get("NodeAddr", name), found.get("NodeHostName", name), found.get("Partitions", "")]
            )
    return sorted(rows)


def check_bindings(bundle: Bundle, rows: List[List[str]]) -> None:
    live = {row[0]: row[1] for row in rows}
    stale = ["%s: %s, now %s" % (n, a, live.get(n)) for n, a in sorted(bundle.bindings.items()) if live.get(n) != a]
    if stale:
        raise StaleBindings("%d node(s) not at the NodeAddr planned: %s" % (len(stale), _sample(stale)))


def show_partitions(scontrol: Scontrol) -> str:
    return scontrol.output("-a", "-o", "show", "partition")  # -a: hidden ones too


def live_partitions(scontrol: Scontrol) -> Dict[str, Optional[str]]:
    return partition_topologies(show_partitions(scontrol))


def check_cluster_knows(conf: SlurmConf, bundle: Bundle, live_nodes: Set[str]) -> None:
    unknown_partitions = sorted(set(bundle.partitions) - conf.partition_names())
    if unknown_partitions:
        note = (" (Include lines not followed: %s)" % _sample(conf.not_followed)) if conf.not_followed else ""
        raise Refused("partitions not in slurm.conf: %s%s" % (_sample(unknown_partitions), note))
    wanted = set(bundle.nodes)
    for units in bundle.topologies.values():
        for unit in units.values():
            wanted.update(unit.nodes)
    unknown_nodes = sorted(wanted - live_nodes)
    if unknown_nodes:
        raise Refused("%d node(s) unknown to slurmctld: %s" % (len(unknown_nodes), _sample(unknown_nodes)))


def _difference(expected: Sequence[str], live: Sequence[str]) -> str:
    missing, extra = sorted(set(expected) - set(live)), sorted(set(live) - set(expected))
    parts = []
    if missing:
        parts.append("%d missing (%s)" % (len(missing), _sample(missing)))
    if extra:
        parts.append("%d not in the plan (%s)" % (len(extra), _sample(extra)))
    return ", ".join(parts)


def compare_units(expected: Mapping[str, ExpectedUnit], live: Mapping[str, Mapping[str, object]]) -> List[str]:
    """Differences between the plan and ``scontrol show topology``: leaf switches and blocks by their
    nodes, upper switches by their child switches (Slurm also lists every node below them)."""
    problems = ["%s %s: missing" % (expected[name].kind, name) for name in sorted(set(expected) - set(live))]
    problems += ["%s %s: not in the plan" % (live[name]["kind"], name) for name in sorted(set(live) - set(expected))]
    for name in sorted(set(expected) & set(live)):
        want, have = expected[name], live[name]
        if want.kind != have["kind"]:
            problems.append("%s: a %s in the plan, a %s live" % (name, want.kind, have["kind"]))
            continue
        field = "switches" if want.kind == "switch" and want.switches else "nodes"
        wanted = want.switches if field == "switches" else want.nodes
        found = have.get(field)
        difference = _difference(wanted, [str(item) for item in found] if isinstance(found, list) else [])
        if difference:
            problems.append("%s %s: %s %s" % (want.kind, name, field, difference))
    return problems


def moved_nodes(
    expected: Mapping[str, ExpectedUnit], live: Mapping[str, Mapping[str, object]]
) -> List[Dict[str, Optional[str]]]:
    """The planned nodes whose live leaf switch or block is not the planned one: {node, planned, live}
    (live None: in no live leaf). Upper switches list every node below them, so only leaves count."""
    planned = {node: name for name, unit in expected.items() if not unit.switches for node in unit.nodes}
    found: Dict[str, str] = {}
    for name in sorted(live):
        unit = live[name]
        nodes, switches = unit.get("nodes"), unit.get("switches")
        if isinstance(nodes, list) and not switches:
            for node in nodes:
                found.setdefault(str(node), name)
    return [
        {"node": node, "planned": planned[node], "live": found.get(node)}
        for node in sorted(planned)
        if found.get(node) != planned[node]
    ]


class LiveTopology(NamedTuple):
    units: Dict[str, Dict[str, object]]  # as parse_show_topology returns them
    error: str  # why scontrol could not show it; "" when it could


class LiveTopologies:
    """``scontrol show topology [NAME]``, asked once per name: the name and the grouping checks share it."""

    def __init__(self, scontrol: Scontrol) -> None:
        self.scontrol = scontrol
        self._shown: Dict[Optional[str], LiveTopology] = {}

    def get(self, name: Optional[str]) -> LiveTopology:
        """The named topology, or without a name the cluster default (the one topology before 25.05)."""
        if name not in self._shown:
            self._shown[name] = self._read(name)
        return self._shown[name]

    def _read(self, name: Optional[str]) -> LiveTopology:
        args = ("show", "topology") + ((name,) if name else ())
        result = self.scontrol.run(*args)
        error = one_line(result.stderr)
        try:
            units = parse_show_topology(result.stdout)
        except ValueError as parse_error:
            units, error = {}, "unreadable output: %s" % parse_error
        if not units and (error or result.returncode != 0):
            # `scontrol show topology NAME` exits 0 even when NAME is not available.
            return LiveTopology({}, "scontrol %s: %s" % (" ".join(args), error or "exit %d" % result.returncode))
        return LiveTopology(units, "")


def read_back(
    bundle: Bundle, topologies: LiveTopologies, partitions: Mapping[str, Optional[str]]
) -> Tuple[Dict[str, Dict[str, Any]], List[Dict[str, str]]]:
    """Live topologies and partitions compared with the bundle by name: (readback, drift). A readback
    entry lists the nodes whose live leaf or block is not the planned one (``moved``)."""
    readback: Dict[str, Dict[str, Any]] = {}
    drift: List[Dict[str, str]] = []
    for name, expected in sorted(bundle.topologies.items()):
        # Slurm < 25.05 has one unnamed topology; a name there would be read as a switch name.
        live = topologies.get(None if bundle.slurm_format == CONF_FORMAT else name)
        problems = [live.error] if live.error else compare_units(expected, live.units)
        readback[name] = {"units": len(live.units), "matches": not problems, "mismatches": problems}
        if problems and not live.error:
            readback[name]["moved"] = moved_nodes(expected, live.units)
        if problems:
            detail = "%d mismatch(es): %s" % (len(problems), problems[0])
            drift.append({"what": "topology", "name": name, "detail": detail})
    for name, value in sorted(bundle.partitions.items()):
        if name not in partitions:
            drift.append({"what": "partition", "name": name, "detail": "not known to slurmctld"})
        elif partitions[name] != value:
            detail = "slurmctld has Topology=%s, the plan %s" % (_shown(partitions[name]), _shown(value))
            drift.append({"what": "partition", "name": name, "detail": detail})
    return readback, drift


# --------------------------------------------------------------------------------------------------
# Grouping: how the live topology groups the nodes, whatever its names


def _unit_names(unit: Mapping[str, object], field: str) -> List[str]:
    value = unit.get(field)
    return [str(item) for item in value] if isinstance(value, list) else []


def _topology_kind(kinds: Iterable[str]) -> str:
    """A topology's kind from its units' kinds: tree, block, or flat (neither switches nor blocks)."""
    found = set(kinds)
    return "tree" if "switch" in found else "block" if "block" in found else "flat"


def _live_units(live: Mapping[str, Mapping[str, object]], kind: str) -> Dict[str, FrozenSet[str]]:
    """Node sets of the live leaves (Level=0, or no child switches) or of the live plain blocks."""
    if kind == "tree":
        return {
            name: frozenset(_unit_names(unit, "nodes"))
            for name, unit in live.items()
            if unit["kind"] == "switch" and (unit.get("level") == 0 or not _unit_names(unit, "switches"))
        }
    return {name: frozenset(_unit_names(unit, "nodes")) for name, unit in live.items() if unit["kind"] == "block"}


def _within(units: Mapping[str, FrozenSet[str]], nodes: FrozenSet[str]) -> Dict[str, FrozenSet[str]]:
    """The units restricted to ``nodes``, empty ones dropped: a shared topology also holds other
    partitions' nodes, and a partition's jobs only see its own."""
    return {name: members & nodes for name, members in units.items() if members & nodes}


def _have_common_top(live: Mapping[str, Mapping[str, object]], leaves: Iterable[str]) -> bool:
    """Whether one switch reaches all ``leaves`` (itself included): Slurm runs no job across leaves without one."""
    parents: Dict[str, List[str]] = {}
    for name, unit in live.items():
        for child in _unit_names(unit, "switches"):
            parents.setdefault(child, []).append(name)
    common: Optional[Set[str]] = None
    for leaf in leaves:
        reached, pending = {leaf}, [leaf]
        while pending:
            for parent in parents.get(pending.pop(), []):
                if parent not in reached:
                    reached.add(parent)
                    pending.append(parent)
        common = reached if common is None else common & reached
    return common is None or bool(common)


def _node_sets(sets: Iterable[FrozenSet[str]], limit: int = 3) -> str:
    shown = sorted(sorted(members) for members in sets)
    return "; ".join("[%s]" % _sample(members) for members in shown[:limit]) + ("; ..." if len(shown) > limit else "")


def compare_grouping(
    expected: Mapping[str, ExpectedUnit], base_block_size: Optional[int], live: Mapping[str, Mapping[str, object]]
) -> List[str]:
    """How the live topology groups the plan's nodes differently from the plan ([] when it groups them alike).

    Tree: the same leaf node-sets, all under one common top switch; block: the same block node-sets
    and the same base block size. Switch, block and topology names and the levels in between do not
    count, and live nodes outside the plan's are left out (another partition's, in a shared topology).
    """
    planned_kind = _topology_kind(unit.kind for unit in expected.values())
    live_kind = _topology_kind(str(unit["kind"]) for unit in live.values())
    if live_kind != planned_kind:
        return ["a %s topology live, a %s in the plan" % (live_kind, planned_kind)]
    noun, nouns = ("leaf", "leaves") if planned_kind == "tree" else ("block", "blocks")
    planned = {frozenset(unit.nodes) for unit in expected.values() if unit.nodes and not unit.switches}
    nodes = frozenset(node for members in planned for node in members)
    found = _within(_live_units(live, live_kind), nodes)
    problems = []
    outside = sorted(nodes.difference(*found.values()))
    if outside:
        problems.append("%d planned node(s) in no live %s (%s)" % (len(outside), noun, _sample(outside)))
    missing, extra = planned - set(found.values()), set(found.values()) - planned
    if missing:
        problems.append("%d planned %s not live: %s" % (len(missing), nouns, _node_sets(missing)))
    if extra:
        problems.append("%d live %s not planned: %s" % (len(extra), nouns, _node_sets(extra)))
    if planned_kind == "tree" and not _have_common_top(live, found):
        problems.append("no live switch reaches all %d leaves: jobs cannot span them" % len(found))
    if planned_kind == "block" and base_block_size is not None:
        live_size = next((unit.get("size") for unit in live.values() if unit["kind"] == "block"), None)
        if live_size != base_block_size:
            problems.append("base block size %s live, %d in the plan" % (live_size, base_block_size))
    return problems


def flat_constraints(nodes: Sequence[str], live: Mapping[str, Mapping[str, object]]) -> List[str]:
    """Why the live topology keeps jobs of a partition the plan leaves flat from using any of its nodes
    together ([] when it does not).

    Slurm 26.05 (checked in the chroot) never runs a multi-node job on nodes in no leaf, nor across
    leaves without a common top switch; a block topology places a job inside one block (or blocks it
    aggregates). A tree that only orders the nodes by proximity is a preference, not a constraint, and
    a one-node partition runs one-node jobs only, which any topology allows.
    """
    kind = _topology_kind(str(unit["kind"]) for unit in live.values())
    members = frozenset(nodes)
    if kind == "flat" or len(members) < 2:
        return []
    noun = "leaf" if kind == "tree" else "block"
    found = _within(_live_units(live, kind), members)
    problems = []
    outside = sorted(members.difference(*found.values()))
    if outside:
        problems.append(
            "%d of the flat partition's node(s) in no live %s (%s)" % (len(outside), noun, _sample(outside))
        )
    if kind == "tree" and not _have_common_top(live, found):
        problems.append("no live switch reaches all %d leaves holding the flat partition's nodes" % len(found))
    if kind == "block" and len(found) > 1:
        problems.append("the flat partition's nodes are split over %d live blocks" % len(found))
    return problems


_YAML_TOPOLOGY = re.compile(r"- topology: (\S+)\s*$")
_YAML_SIZE = re.compile(r"\s*- (\d+)\s*$")


def planned_base_block_sizes(bundle: Bundle) -> Dict[str, int]:
    """{topology: base block size} from the bundle's own topology file, the only place a bundle states it:
    the first ``block_sizes`` item of each topology.yaml entry, or ``BlockSizes=`` in topology.conf."""
    sizes: Dict[str, int] = {}
    text = bundle.files[bundle.slurm_format]
    if bundle.slurm_format == CONF_FORMAT:
        match = re.search(r"^BlockSizes=(\d+)", text, re.MULTILINE)
        if match:
            sizes.update((name, int(match.group(1))) for name in bundle.topologies)
        return sizes
    topology, listing = None, False
    for line in text.splitlines():
        entry = _YAML_TOPOLOGY.match(line)
        if entry:
            topology, listing = entry.group(1), False
        elif line.strip() == "block_sizes:":
            listing = True
        elif listing:
            size = _YAML_SIZE.match(line)
            if size and topology is not None:
                sizes.setdefault(topology, int(size.group(1)))
            listing = False
    return sizes


def _live_source(bundle: Bundle, used: Optional[str]) -> str:
    if used:
        return "Topology=%s" % used
    return "the cluster default" if bundle.slurm_format == YAML_FORMAT else "the cluster-wide topology"


def grouping_drift(
    bundle: Bundle,
    topologies: LiveTopologies,
    partitions: Mapping[str, Optional[str]],
    partition_members: Mapping[str, List[str]],
) -> Tuple[List[Dict[str, str]], Set[str]]:
    """The live grouping compared with the plan's: (grouping drift entries, partitions whose grouping differs).

    topology.yaml: per bundle partition, the topology it uses live (its Topology=, else the cluster
    default). topology.conf: the one cluster-wide topology, or, when the plan has none, every
    partition as flat.
    """
    entries: List[Dict[str, str]] = []
    differing: Set[str] = set()

    def differs(name: str, detail: str, affected: Iterable[str]) -> None:
        entries.append({"what": "grouping", "name": name, "detail": detail, "kind": "grouping"})
        differing.update(affected)

    sizes = planned_base_block_sizes(bundle)
    for name in sorted(set(bundle.partitions) - set(partitions)):
        differs(name, "not known to slurmctld", [name])
    if bundle.slurm_format == CONF_FORMAT and bundle.topologies:
        live = topologies.get(None)
        for name, expected in sorted(bundle.topologies.items()):
            problems = [live.error] if live.error else compare_grouping(expected, sizes.get(name), live.units)
            if problems:
                differs(name, "the cluster-wide topology: %s" % "; ".join(problems), bundle.partitions)
        return entries, differing
    for name, assignment in sorted(bundle.partitions.items()):
        if name not in partitions:
            continue
        used = partitions[name] if bundle.slurm_format == YAML_FORMAT else None
        live = topologies.get(used)
        expected = bundle.topologies.get(assignment, {}) if assignment else {}
        if live.error:
            problems = [live.error]
        elif assignment and expected:
            problems = compare_grouping(expected, sizes.get(assignment), live.units)
        else:
            problems = flat_constraints(partition_members.get(name, []), live.units)
        if problems:
            differs(name, "%s: %s" % (_live_source(bundle, used), "; ".join(problems)), [name])
    return entries, differing


def with_kinds(entries: Sequence[Dict[str, str]], bundle: Bundle, differing: Set[str]) -> List[Dict[str, str]]:
    """Name-based entries with their kind: "grouping" when a partition they concern groups its nodes
    differently live, else "naming" (names or text differ, the grouping is the same)."""
    assigned: Dict[str, Set[str]] = {}
    for partition, topology in bundle.partitions.items():
        if topology is not None:
            assigned.setdefault(topology, set()).add(partition)
    kinds = []
    for entry in entries:
        if entry["what"] == "partition":
            concerned = {entry["name"]}
        elif entry["what"] == "topology" and bundle.slurm_format == YAML_FORMAT:
            concerned = assigned.get(entry["name"], set())
        else:  # the file, the plugin, and before 25.05 the one topology: every partition
            concerned = set(bundle.partitions)
        kinds.append(dict(entry, kind="grouping" if concerned & differing else "naming"))
    return kinds


def _log_errors_since(log_path: Optional[str], offset: int) -> str:
    """The error and fatal lines slurmctld logged since ``offset``: why it refused a config."""
    if not log_path:
        return ""
    try:
        with open(log_path, "rb") as handle:
            handle.seek(max(offset, os.path.getsize(log_path) - 256 * 1024))
            text = handle.read().decode("utf-8", "replace")
    except OSError:
        return ""
    lines = [re.sub(r"^\[[^\]]*\]\s*", "", line) for line in text.splitlines() if re.search(r"\b(fatal|error)\b", line)]
    return " | ".join(lines[-4:])


def reconfigure(scontrol: Scontrol, log_path: Optional[str], timeout: float = RECONFIGURE_TIMEOUT) -> Tuple[int, str]:
    """Run ``scontrol reconfigure`` for at most ``timeout`` s: (exit code, -1 when it did not finish; why it failed)."""
    try:
        offset = os.path.getsize(log_path) if log_path else 0
    except OSError:
        offset = 0
    try:
        result = scontrol.run("reconfigure", timeout=min(max(timeout, 1.0), RECONFIGURE_TIMEOUT))
    except Failed as error:
        return -1, str(error)
    if result.returncode == 0:
        return 0, ""
    message = "scontrol reconfigure exited %d: %s" % (result.returncode, one_line(result.stderr + result.stdout))
    logged = _log_errors_since(log_path, offset)
    return result.returncode, message + ("; slurmctld log: %s" % logged if logged else "")


# --------------------------------------------------------------------------------------------------
# The three modes


def new_result(mode: Optional[str]) -> Dict[str, Any]:
    return {
        "outcome": "failed",
        "mode": mode,
        "plan_sha256": None,
        "before_sha256": None,
        "after_sha256": None,
        "partitions_changed": [],
        "reconfigured": False,
        "reconfigure_exit_code": None,
        "readback": {},
        "partition_topologies": {},
        "drift": [],
        "grouping_drift": False,
        "diff": None,
        "slurm_version": None,
        "slurm_format": None,
        "config_dir": None,
        "scontrol": None,
        "backup_dir": None,
        "duration_seconds": 0.0,
        "error": None,
        "dropped": {},
        "applier_version": APPLIER_VERSION,
        "recovery": None,
        "signature": "unchecked",
        "generation": None,
        "slurm_nodes": None,
    }


def _record_drift(
    result: Dict[str, Any], scontrol: Scontrol, bundle: Bundle, disk_entries: Sequence[Dict[str, str]] = ()
) -> None:
    """Compare what is live with the bundle, by name and by grouping, into readback, drift and grouping_drift.

    Grouping entries come first: they are what matters on a cluster whose topology HyperPod writes, and
    what a cut list keeps.
    """
    topologies = LiveTopologies(scontrol)
    listing = show_partitions(scontrol)
    partitions = partition_topologies(listing)
    result["readback"], named = read_back(bundle, topologies, partitions)
    grouping, differing = grouping_drift(bundle, topologies, partitions, partition_nodes(listing))
    result["partition_topologies"] = partitions
    result["drift"] = grouping + with_kinds([*disk_entries, *named], bundle, differing)
    result["grouping_drift"] = bool(grouping)


def dry_run(result: Dict[str, Any], conf: SlurmConf, bundle: Bundle) -> None:
    state = read_disk_state(conf, bundle)
    if disk_sha256(bundle, state) == bundle.plan_sha256:
        result["outcome"], result["diff"] = "unchanged", ""
        return
    changes, result["partitions_changed"] = planned_changes(conf, bundle, state)
    result["outcome"] = "would_apply"
    result["diff"] = "".join(unified_diff(change.old, change.new, change.path) for change in changes)


def verify(result: Dict[str, Any], conf: SlurmConf, bundle: Bundle, scontrol: Scontrol) -> None:
    _record_drift(result, scontrol, bundle, disk_drift(conf, bundle, read_disk_state(conf, bundle)))
    result["outcome"] = "drift" if result["drift"] else "in_sync"


@contextlib.contextmanager
def transaction_for(conf: SlurmConf, context: Context) -> Iterator[Transaction]:
    config = ConfigDir(conf.directory)
    try:
        backup_fd = open_backup_root(config)
        try:
            log_path = conf.last_value("SlurmctldLogFile")
            yield Transaction(config, backup_fd, context, log_path)
        finally:
            os.close(backup_fd)
    finally:
        config.close()


def recover_leftover(result: Dict[str, Any], conf_path: str, context: Context) -> None:
    """Before a verify: finish or undo an apply a kill cut off (only when its journal is there)."""
    conf = SlurmConf(conf_path)
    if not os.path.lexists(os.path.join(os.path.realpath(conf.directory), BACKUP_DIR, JOURNAL)):
        return
    lock = exclusive_lock(conf.directory, min(context.lock_timeout, context.budget.left()))
    with lock, transaction_for(conf, context) as transaction:
        transaction.recover(result)


def _judge_read_back(result: Dict[str, Any]) -> None:
    result["outcome"] = "failed" if result["drift"] else "applied"
    if result["drift"]:
        result["error"] = (
            "slurmctld loaded the new config but the read-back differs from the plan (%d differences, see"
            " drift and readback); not rolled back, the previous files are in %s"
            % (len(result["drift"]), result["backup_dir"])
        )


def _newest_backup_of(transaction: Transaction, plan_sha256: str) -> Optional[Dict[str, Any]]:
    """A journal that undoes the apply that wrote this plan's files: its backup, newest first."""
    names = sorted((n for n in os.listdir(transaction.backup_fd) if _BACKUP_NAME.match(n)), reverse=True)
    for name in names:
        try:
            fd = os.open(name, os.O_RDONLY | _DIRECTORY | _NOFOLLOW, dir_fd=transaction.backup_fd)
        except OSError:
            continue
        try:
            manifest = _read_json(fd, MANIFEST)
        except (OSError, ValueError, Failed):
            manifest = None
        finally:
            os.close(fd)
        if manifest and manifest.get("plan_sha256") == plan_sha256 and _files_problem(manifest.get("files")) is None:
            return {"plan_sha256": plan_sha256, "backup": name, "files": manifest["files"], "steps": []}
    return None


def _reload_disk(transaction: Transaction, result: Dict[str, Any], bundle: Bundle) -> None:
    """The files equal the plan but slurmctld serves something else (a cut-off apply, an earlier failed
    read-back): load them, and put back the files before them if slurmctld refuses."""
    code, message = reconfigure(
        transaction.scontrol, transaction.log_path, transaction.budget.left() - RECONFIGURE_TIMEOUT
    )
    result["reconfigured"], result["reconfigure_exit_code"] = True, code
    if code == 0:
        _record_drift(result, transaction.scontrol, bundle)
        _judge_read_back(result)
        return
    journal = _newest_backup_of(transaction, bundle.plan_sha256)
    if journal is None:
        result["outcome"] = "failed"
        result["error"] = (
            "the files on disk equal the plan but slurmctld refuses them (%s) and no backup of the files before"
            " them is left; slurmctld keeps its running config" % message
        )
        return
    result["backup_dir"] = os.path.join(transaction.config.path, BACKUP_DIR, journal["backup"])
    errors, again, again_message = transaction.roll_back(journal)
    result["outcome"] = "failed" if errors or again else "rolled_back"
    result["error"] = "the files on disk equal the plan but slurmctld refuses them (%s); %s%s" % (
        message,
        _restored(errors),
        " but %s" % again_message if again else " and live",
    )


def _write_targets(config: ConfigDir, conf_path: str, conf: SlurmConf, bundle: Bundle) -> List[str]:
    """slurm.conf as named (not resolved) and the topology file: an apply refuses either as a link."""
    return [os.path.join(config.path, os.path.basename(conf_path)), _topology_path(conf, bundle.slurm_format)]


def apply(result: Dict[str, Any], conf_path: str, bundle: Bundle, context: Context) -> None:
    conf = SlurmConf(conf_path)  # read again under the lock: another apply may just have changed it
    try:
        with transaction_for(conf, context) as transaction:
            if context.signed:
                accept_generation(transaction.backup_fd, bundle, context.faults)
            transaction.recover(result)  # before anything else the bundle asks for
            conf = SlurmConf(conf_path)
            refuse_links(transaction.config, _write_targets(transaction.config, conf_path, conf, bundle))
            state = read_disk_state(conf, bundle)
            result["before_sha256"] = result["after_sha256"] = disk_sha256(bundle, state)
            if result["before_sha256"] == bundle.plan_sha256:
                # Unchanged only when slurmctld serves the plan too; else load the files (with rollback).
                _record_drift(result, context.scontrol, bundle)
                if not result["drift"]:
                    result["outcome"] = "applied" if result["reconfigured"] else "unchanged"
                elif result["reconfigured"]:
                    _judge_read_back(result)  # the recovery just loaded them
                else:
                    _reload_disk(transaction, result, bundle)
                return
            changes, result["partitions_changed"] = planned_changes(conf, bundle, state)
            steps = ordered_steps(conf, bundle, changes, transaction.config)
            if transaction.run(steps, bundle.plan_sha256, result):
                _record_drift(result, context.scontrol, bundle)
                _judge_read_back(result)
    finally:  # measured, never assumed: also when the read-back itself fails
        with contextlib.suppress(Failed, OSError):
            result["after_sha256"] = disk_sha256(bundle, read_disk_state(SlurmConf(conf_path), bundle))


def execute(
    mode: str,
    bundle_text: str,
    lock_timeout: float,
    environ: Mapping[str, str],
    scontrol_path: Optional[str] = None,
    *,
    trusted_key: Optional[str] = None,
) -> Dict[str, Any]:
    result = new_result(mode)
    started = time.monotonic()
    budget = Budget(APPLIER_BUDGET_SECONDS)
    try:
        bundle = parse_bundle(bundle_text)
        result["plan_sha256"] = bundle.plan_sha256
        if trusted_key is not None:
            check_signature(bundle, mode, read_trusted_key(trusted_key))
            result["signature"], result["generation"] = "verified", bundle.generation
        scontrol = Scontrol(environ, find_scontrol(scontrol_path, configured_slurm_conf(environ), environ))
        result["scontrol"] = scontrol.path
        scontrol.deadline = budget.deadline
        context = Context(scontrol, budget, Faults(environ), lock_timeout, trusted_key is not None)
        conf_path = find_slurm_conf(environ, scontrol)
        scontrol.env["SLURM_CONF"] = conf_path  # scontrol reads the very file this edits
        result["config_dir"] = os.path.dirname(os.path.abspath(conf_path))
        if context.signed and mode != "apply":  # apply checks it again under the lock, and records it
            backup_fd = _backup_root_read_only(result["config_dir"])
            if backup_fd is not None:
                try:
                    check_generation(bundle, mode, last_generation(backup_fd))
                finally:
                    os.close(backup_fd)
        version = parse_slurm_version(scontrol.output("version"))
        result["slurm_version"] = "%d.%02d.%d" % version
        result["slurm_format"] = format_for_version(version)
        if bundle.slurm_format != result["slurm_format"]:
            raise Refused(
                "the bundle is rendered as %s, but Slurm %s reads %s"
                % (bundle.slurm_format, result["slurm_version"], result["slurm_format"])
            )
        if mode == "verify":
            recover_leftover(result, conf_path, context)  # an apply cut off by a kill: finished or undone first
        conf = SlurmConf(conf_path)
        result["before_sha256"] = result["after_sha256"] = disk_sha256(bundle, read_disk_state(conf, bundle))
        result["partition_topologies"] = live_partitions(scontrol)
        # --future also lists FUTURE nodes, which slurmctld knows too.
        rows = result["slurm_nodes"] = node_rows(scontrol.output("-o", "--future", "show", "nodes"))
        if mode == "verify":
            verify(result, conf, bundle, scontrol)
        else:
            check_bindings(bundle, rows)
            check_cluster_knows(conf, bundle, {row[0] for row in rows})
            if mode == "dry-run":
                config = ConfigDir(conf.directory)
                try:  # what apply would refuse, dry-run refuses too
                    refuse_links(config, _write_targets(config, conf_path, conf, bundle))
                finally:
                    config.close()
                dry_run(result, conf, bundle)
            else:
                with exclusive_lock(conf.directory, min(lock_timeout, budget.left())):
                    apply(result, conf_path, bundle, context)
    except Refused as error:
        result["outcome"], result["error"] = error.outcome, one_line(str(error))
    except Failed as error:
        result["outcome"], result["error"] = "failed", one_line(str(error))
    except Exception as error:  # stdout must stay one JSON document, never a traceback
        result["outcome"] = "failed"
        result["error"] = one_line("internal error: %s: %s" % (type(error).__name__, error))
    result["duration_seconds"] = round(time.monotonic() - started, 3)
    return result


# --------------------------------------------------------------------------------------------------
# The one JSON document on stdout, under SSM's cap


class Caps(NamedTuple):
    items: int  # per list (drift, partitions_changed)
    mismatches: int  # per read-back topology
    entries: int  # per map (readback, partition_topologies)
    diff: int  # characters of the diff
    chars: int  # per text


# Tried in order until the document fits. The last one always fits: every field is then bounded.
_CAPS = (
    Caps(200, 10, 500, 16000, 1000),
    Caps(50, 3, 100, 6000, 300),
    Caps(10, 1, 20, 1500, 160),
    Caps(0, 0, 0, 0, 120),
)


def _capped(result: Mapping[str, Any], caps: Caps) -> Any:
    items, mismatches, entries, diff, chars = caps

    def clip(text: Any) -> Any:
        return text[:chars] + "..." if isinstance(text, str) and len(text) > chars else text

    document = {key: value if key == "diff" else clip(value) for key, value in result.items()}
    dropped = dict(result["dropped"])

    def keep(key: str, values: List[Any]) -> List[Any]:
        if len(values) > items:
            dropped[key] = len(values) - items
        return values[:items]

    document["drift"] = [{k: clip(v) for k, v in entry.items()} for entry in keep("drift", result["drift"])]
    document["partitions_changed"] = keep("partitions_changed", result["partitions_changed"])
    if result["slurm_nodes"]:
        document["slurm_nodes"] = keep("slurm_nodes", result["slurm_nodes"])
    live = result["partition_topologies"]
    if len(live) > entries:
        dropped["partition_topologies"] = len(live) - entries
    document["partition_topologies"] = {name: live[name] for name in sorted(live)[:entries]}
    readback = result["readback"]
    names = sorted(readback, key=lambda name: (readback[name]["matches"], name))  # mismatches first
    if len(names) > entries:
        dropped["readback"] = len(names) - entries
    document["readback"] = {}
    for name in names[:entries]:
        entry = readback[name]
        document["readback"][name] = {
            "units": entry["units"],
            "matches": entry["matches"],
            "mismatches": [clip(problem) for problem in entry["mismatches"][:mismatches]],
            "mismatches_dropped": max(len(entry["mismatches"]) - mismatches, 0),
        }
        if "moved" in entry:
            document["readback"][name]["moved"] = entry["moved"][:items]
    text = result["diff"]
    if isinstance(text, str) and len(text) > diff:
        cut = text.rfind("\n", 0, diff) + 1
        dropped["diff_chars"] = len(text) - cut
        document["diff"] = text[:cut]
    document["dropped"] = dropped
    return document


def render_result(result: Mapping[str, Any]) -> str:
    text = ""
    for caps in _CAPS:
        text = json.dumps(_capped(result, caps), ensure_ascii=True)
        if len(text) <= MAX_STDOUT_CHARS:
            break
    return text


class _UsageError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise _UsageError(message)


def main(argv: Optional[Sequence[str]] = None, environ: Optional[Mapping[str, str]] = None) -> int:
    parser = _Parser(prog="applier.py", description="Apply, dry-run or verify a topokeeper bundle on a head node.")
    parser.add_argument("mode", choices=MODES)
    parser.add_argument("bundle", help="bundle.json, or - to read it from stdin")
    parser.add_argument("--lock-timeout", type=float, default=DEFAULT_LOCK_TIMEOUT, metavar="SECONDS")
    parser.add_argument("--scontrol", metavar="PATH", help="the scontrol to run (default: found, see above)")
    parser.add_argument("--trusted-key", metavar="PATH", help="refuse a bundle not signed by this key (see above)")
    try:
        args = parser.parse_args(argv)
        if not (math.isfinite(args.lock_timeout) and args.lock_timeout >= 0):
            parser.error("--lock-timeout: expected a number of seconds >= 0")
    except _UsageError as error:
        result = new_result(None)
        result["outcome"], result["error"] = "refused", "usage: %s" % error
        print(render_result(result))
        return EXIT_CODES["refused"]
    try:
        if args.bundle == "-":
            data = sys.stdin.buffer.read()
        else:
            with open(args.bundle, "rb") as handle:
                data = handle.read()
        text = data.decode("utf-8")
    except (OSError, UnicodeDecodeError) as error:
        result = new_result(args.mode)
        result["outcome"], result["error"] = "refused", one_line("cannot read the bundle: %s" % error)
    else:
        environment = os.environ if environ is None else environ
        result = execute(args.mode, text, args.lock_timeout, environment, args.scontrol, trusted_key=args.trusted_key)
    print(render_result(result))
    return EXIT_CODES[result["outcome"]]


if __name__ == "__main__":
    sys.exit(main())
