"""The wire contract between the package and the head node (standard library only, Python 3.8+).

Both sides import this one module: the package (Lambda functions, CLI, simulator) to write and read what
crosses to the head node, the head-node program (``topokeeper.headnode``, ``topokeeper.agent``) to read and
answer it. Everything here is defined once: the bundle and result schemas, the canonical bytes and hashes,
the parsers of scontrol output both sides read, Slurm hostlists, the Slurm version cut-over, and the
channel's limits and timeouts. It imports only modules Debian's python3-minimal ships (the head-node
program runs on minimal images too).
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import re
from dataclasses import dataclass, fields
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Set, Tuple

# --- documents ---------------------------------------------------------------------------------------

BUNDLE_SCHEMA = "topokeeper.bundle/2"  # the bundle document the head node accepts (render/bundle.py writes it)
REGISTERING_BUNDLE_SCHEMA = "topokeeper.bundle/3"  # one with REGISTERING_KEY: older agents answer agent_outdated
BUNDLE_SCHEMAS = (BUNDLE_SCHEMA, REGISTERING_BUNDLE_SCHEMA)  # what the head-node program accepts, the newest last
YAML_FORMAT = "topology.yaml"
CONF_FORMAT = "topology.conf"
MODES = ("apply", "dry-run", "verify")
# A result document's outcome -> the head-node program's exit code.
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
    "recovered": 1,
    "failed": 1,
}

# How bundles are signed (KMS SigningAlgorithm): the head node checks exactly this, with a key in this schema.
SIGNATURE_ALGORITHM = "RSASSA_PKCS1_V1_5_SHA_256"
TRUSTED_KEY_SCHEMA = "topokeeper.signing-key/1"

# --- Slurm versions -------------------------------------------------------------------------------------

FIRST_YAML_VERSION = (25, 5)  # topology.yaml and per-partition Topology= appeared in Slurm 25.05
_VERSION = re.compile(r"(\d+)\.(\d+)(?:\.(\d+))?")


def parse_slurm_version(text: str) -> Tuple[int, int, int]:
    """``slurm 26.05.5`` or ``slurm-wlm 24.11.5`` -> (26, 5, 5); ValueError when there is none."""
    match = _VERSION.search(text)
    if not match:
        raise ValueError("cannot read a Slurm version from %r" % one_line(text)[:80])
    return int(match.group(1)), int(match.group(2)), int(match.group(3) or 0)


def format_for_version(version: Tuple[int, ...]) -> str:
    """The topology file a Slurm version reads: topology.yaml from 25.05, else topology.conf."""
    return YAML_FORMAT if tuple(version[:2]) >= FIRST_YAML_VERSION else CONF_FORMAT


def one_line(text: str) -> str:
    return " | ".join(line.strip() for line in text.splitlines() if line.strip())


def sample(names: Sequence[str], limit: int = 5) -> str:
    """The first few names of a list, for a one-line message."""
    return ", ".join(names[:limit]) + (", ..." if len(names) > limit else "")


# --- the channel's limits and timeouts --------------------------------------------------------------------
#
# The head-node program's time budget: a run never outlives APPLIER_BUDGET_SECONDS; every wait is cut to what
# is left, and the forward reconfigure leaves a whole RECONFIGURE_TIMEOUT for the rollback. The channels (the
# SSM command, the agent) time out after CHANNEL_TIMEOUT_SECONDS: the budget, then SIGTERM and
# TERMINATE_GRACE_SECONDS before SIGKILL, then a margin for the interpreter, the bundle fetch and the document.

LOCK_WAIT_SECONDS = 60.0
SCONTROL_TIMEOUT = 60.0  # one query
READ_SECONDS = 180.0  # all queries of a run together (version, nodes, partitions, topologies, read-back)
RECONFIGURE_TIMEOUT = 120.0  # one reconfigure; an apply may need two (forward, rollback)
MIN_RECONFIGURE_SECONDS = 30.0  # less than this left for the forward reconfigure: nothing is written
APPLIER_BUDGET_SECONDS = LOCK_WAIT_SECONDS + READ_SECONDS + 2 * RECONFIGURE_TIMEOUT
TERMINATE_GRACE_SECONDS = 15.0
CHANNEL_MARGIN_SECONDS = 105.0
CHANNEL_TIMEOUT_SECONDS = int(APPLIER_BUDGET_SECONDS + TERMINATE_GRACE_SECONDS + CHANNEL_MARGIN_SECONDS)
MAX_STDOUT_CHARS = 24000  # SSM keeps no more of a command's output
MAX_FULL_RESULT_BYTES = 32 * 1024 * 1024  # the whole result document, uploaded when stdout cannot carry it
UPLOAD_TIMEOUT_SECONDS = 30.0  # within the channel's margin (CHANNEL_MARGIN_SECONDS)
PLACEMENT_FACTS_SCHEMA = "topokeeper.placement-facts/1"  # the program's placement-facts document (SSM, agent)

# --- canonical bytes and hashes --------------------------------------------------------------------------


def canonical_json(document: object) -> str:
    return json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


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
    return sha256_text(canonical_json(document))


def bindings_sha256(bindings: Mapping[str, str]) -> str:
    return sha256_text(canonical_json(dict(bindings)))


def signed_bytes(document: Mapping[str, object]) -> bytes:
    """The bytes a signature covers: the bundle document without its signature, as canonical JSON."""
    unsigned = {key: value for key, value in document.items() if key != "signature"}
    return canonical_json(unsigned).encode("ascii")


# --- what scontrol prints, as both sides read it ------------------------------------------------------------


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
                "nodes": sorted(expand(fields.get("Nodes", ""))),
                "switches": sorted(expand(fields.get("Switches", ""))),
            }
        elif "BlockName" in fields:
            units[fields["BlockName"]] = {
                "kind": "block",
                "nodes": sorted(expand(fields.get("Nodes", ""))),
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
            found[name.group(1)] = expand(nodes.group(1)) if nodes and nodes.group(1) != "(null)" else []
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


# --- Slurm hostlists: ``ip-10-1-12-[34-35],ip-10-1-99-7`` -----------------------------------------------------
#
# As Slurm's hostlist.c: only numeric ranges inside brackets, the range is on the trailing digits of a name,
# zero padding is kept (``n[09-10]`` is n09,n10), and a list is printed sorted and de-duplicated. Several
# bracket groups in one name expand as a cartesian product, as Slurm does.

# Slurm keeps the numeric suffix in an unsigned long; longer digit runs stay opaque names.
_MAX_SUFFIX_DIGITS = 18
_TRAILING_DIGITS = re.compile(r"^(.*?)(\d+)$")
_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")
MAX_HOSTLIST_NAMES = 1 << 20  # more than any cluster: a typo'd range, refused before a name is built


class HostlistError(ValueError):
    """A hostlist expression Slurm would reject (a ``ValueError``, as pydantic validators need)."""


def _split_top_level(expression: str) -> List[str]:
    parts: List[str] = []
    depth = 0
    start = 0
    for index, char in enumerate(expression):
        if char == "[":
            depth += 1
            if depth > 1:
                raise HostlistError(f"nested brackets in {expression!r}")
        elif char == "]":
            depth -= 1
            if depth < 0:
                raise HostlistError(f"unbalanced ']' in {expression!r}")
        elif char == "," and depth == 0:
            parts.append(expression[start:index])
            start = index + 1
    if depth != 0:
        raise HostlistError(f"unbalanced '[' in {expression!r}")
    parts.append(expression[start:])
    return [part for part in parts if part]


def _expand_ranges(body: str, expression: str) -> List[str]:
    values: List[str] = []
    for item in body.split(","):
        match = _RANGE.fullmatch(item)
        if not match:
            raise HostlistError(f"invalid range {item!r} in {expression!r} (Slurm ranges are numeric)")
        low_text, high_text = match.group(1), match.group(2)
        if high_text is None:
            values.append(low_text)
            continue
        low, high = int(low_text), int(high_text)
        if high < low:
            raise HostlistError(f"descending range {item!r} in {expression!r}")
        _check_count(len(values) + high - low + 1, expression)
        width = len(low_text)
        values.extend(f"{number:0{width}d}" for number in range(low, high + 1))
    return values


def expand(expression: str) -> List[str]:
    """Expand a hostlist expression into names, in the order written (duplicates kept, as Slurm does)."""
    names: List[str] = []
    for part in _split_top_level(expression.strip()):
        pieces = re.split(r"(\[[^\]]*\])", part)
        products = [""]
        for piece in pieces:
            choices = _expand_ranges(piece[1:-1], expression) if piece.startswith("[") else [piece]
            _check_count(len(names) + len(products) * len(choices), expression)
            products = [prefix + choice for prefix in products for choice in choices]
        names.extend(products)
    return names


def _check_count(count: int, expression: str) -> None:
    if count > MAX_HOSTLIST_NAMES:
        raise HostlistError(f"{expression[:80]!r} names more than {MAX_HOSTLIST_NAMES} hosts")


def _suffix(name: str) -> Optional[Tuple[str, str]]:
    if name.isascii() and "\n" not in name:  # the regex's answer, 3x faster (\\d is ASCII here; "." takes no "\\n")
        stem = name.rstrip("0123456789")
        digits = name[len(stem) :]
        return (stem, digits) if digits and len(digits) <= _MAX_SUFFIX_DIGITS else None
    match = _TRAILING_DIGITS.fullmatch(name)
    if not match or len(match.group(2)) > _MAX_SUFFIX_DIGITS:
        return None
    return match.group(1), match.group(2)


def _width(digits: str) -> int:
    """The zero-padded width a number needs: 0 when it is written naturally."""
    return len(digits) if digits.startswith("0") and len(digits) > 1 else 0


def _fits(digits: str, width: int) -> bool:
    return f"{int(digits):0{width}d}" == digits


def _fit_together(first: str, digits: str) -> bool:
    """Whether ``digits`` may follow ``first`` in one bracket range (the widest zero padding fits both)."""
    width = max(_width(first), _width(digits))
    natural = width == 0 and first[0] != "0" and digits[0] != "0"
    return natural or (_fits(first, width) and _fits(digits, width))


def compress(names: Iterable[str]) -> str:
    """Compress names into Slurm's sorted, de-duplicated hostlist form; ``expand`` round-trips it."""
    if isinstance(names, tuple):
        # A plan's switches and blocks hold tuples: rendering names each one 3-4 times (the file, each
        # partition's hash, the diagram), 60% of render time at 100,000 nodes before this cache.
        return _compress_tuple(names)
    return _compress(names)


@functools.lru_cache(maxsize=32_768)
def _compress_tuple(names: Tuple[str, ...]) -> str:
    return _compress(names)


def _compress(names: Iterable[str]) -> str:
    opaque: Set[str] = set()
    by_prefix: Dict[str, Set[str]] = {}
    for name in set(names):
        split = _suffix(name)
        if split is None:
            opaque.add(name)
        elif split[0] in by_prefix:
            by_prefix[split[0]].add(split[1])
        else:
            by_prefix[split[0]] = {split[1]}

    groups: List[Tuple[str, int, str]] = [(name, 0, name) for name in opaque]
    for prefix, digit_strings in by_prefix.items():
        # By value, then width (n1 before n01); a number is read once.
        ordered = sorted((int(digits), len(digits), digits) for digits in digit_strings)
        runs: List[List[str]] = []
        last = -2
        for number, _, digits in ordered:
            if number == last + 1:
                run = runs[-1]
                first = run[0]
                # Unpadded numbers (the usual host names) always fit; only padded ones need the check.
                if (first[0] != "0" and digits[0] != "0") or _fit_together(first, digits):
                    run.append(digits)
                    last = number
                    continue
            runs.append([digits])
            last = number
        items = [run[0] if len(run) == 1 else f"{run[0]}-{run[-1]}" for run in runs]
        sort_key = ordered[0][0]
        if len(items) == 1 and "-" not in items[0]:
            groups.append((prefix, sort_key, prefix + items[0]))
        else:
            groups.append((prefix, sort_key, f"{prefix}[{','.join(items)}]"))
    groups.sort(key=lambda group: (group[0], group[1], group[2]))
    return ",".join(group[2] for group in groups)


# --- the pull agent ---------------------------------------------------------------------------------------

# Each cluster's agent reports with its own source, AGENT_SOURCE.<cluster>, which its IAM policy enforces
# (events:source): the source, not the detail, says which cluster a report is about. The bare AGENT_SOURCE is
# what agents before per-cluster sources sent; it only ever counts as an outdated agent.
AGENT_SOURCE = "topokeeper.agent"
AGENT_APPLY_DETAIL_TYPE = "Topology Apply Result"
AGENT_VERIFY_DETAIL_TYPE = "Topology Verify Result"
AGENT_DETAIL_TYPES = (AGENT_APPLY_DETAIL_TYPE, AGENT_VERIFY_DETAIL_TYPE)


def agent_source(cluster: str) -> str:
    """The event source only ``cluster``'s agent may send (its IAM policy's events:source condition)."""
    return AGENT_SOURCE + "." + cluster


def agent_source_cluster(source: str) -> Optional[str]:
    """The cluster an agent source belongs to; None for the legacy shared source and for other sources."""
    prefix = AGENT_SOURCE + "."
    if not source.startswith(prefix):
        return None
    return source[len(prefix) :] or None


# Where the agent channel puts a cluster's desired bundle in the plans bucket and the agent polls it:
# ``bundle.json`` to apply, ``verify.json`` to verify against only, ``verify-request.json`` to ask for a verify.
AGENT_KEY_PREFIX = "clusters"
# enforce: the agent applies bundle.json; verify: it only ever verifies against verify.json (HyperPod or
# ParallelCluster manages the topology).
AGENT_MODES = ("enforce", "verify")


def _agent_key(cluster: str, name: str, prefix: str) -> str:
    return "/".join(part for part in (prefix.strip("/"), cluster, name) if part)


def agent_bundle_key(cluster: str, prefix: str = AGENT_KEY_PREFIX) -> str:
    return _agent_key(cluster, "bundle.json", prefix)


def agent_verify_key(cluster: str, prefix: str = AGENT_KEY_PREFIX) -> str:
    return _agent_key(cluster, "verify.json", prefix)


def agent_verify_request_key(cluster: str, prefix: str = AGENT_KEY_PREFIX) -> str:
    """Where the backend asks the agent for a verify at once (HyperPod changed the topology itself)."""
    return _agent_key(cluster, "verify-request.json", prefix)


def agent_desired_key(cluster: str, mode: str, prefix: str = AGENT_KEY_PREFIX) -> str:
    """The object the agent polls in ``mode``."""
    return agent_bundle_key(cluster, prefix) if mode == "enforce" else agent_verify_key(cluster, prefix)


def agent_placement_facts_key(cluster: str, prefix: str = AGENT_KEY_PREFIX) -> str:
    """Where the agent puts the head node's placement facts (placement_metrics), which the backend reads."""
    return _agent_key(cluster, "placement-facts.json", prefix)


@dataclass(frozen=True)
class AgentConfig:
    """The agent's config file (``/etc/topokeeper/agent.json``): written by ``topokeeper agent install-script``,
    read by the agent. Every key is a field; a key that is not one is an error."""

    cluster: str
    bucket: str
    region: str
    prefix: str = AGENT_KEY_PREFIX
    mode: str = "enforce"
    event_bus: str = "default"
    endpoint_url: Optional[str] = None  # one endpoint for S3 (path style) and EventBridge: tests, emulators
    poll_interval_seconds: float = 60.0
    verify_interval_seconds: float = 900.0
    applier: Optional[str] = None  # the applier program; None: the head-node program the agent runs from
    state_dir: str = "/var/lib/topokeeper"
    applier_timeout_seconds: float = CHANNEL_TIMEOUT_SECONDS
    request_timeout_seconds: float = 15.0
    # The applier's --trusted-key file: bundles must be signed by the stack's key (the install script writes it).
    trusted_key: Optional[str] = None
    placement_facts_interval_seconds: float = 0.0  # upload placement facts at most this often; 0: never

    @property
    def key(self) -> str:
        return agent_desired_key(self.cluster, self.mode, self.prefix)


_REQUIRED_AGENT_KEYS = ("cluster", "bucket", "region")


class AgentConfigError(ValueError):
    """The config document breaks the schema; the message names the key."""


def agent_config_from_document(document: Any) -> AgentConfig:
    """The config a JSON document describes; unknown keys and wrong types are errors that name the key."""
    if not isinstance(document, dict):
        raise AgentConfigError("expected a JSON object")
    known = {f.name: f for f in fields(AgentConfig)}
    for name in document:
        if name not in known:
            raise AgentConfigError(f"unknown key {name!r}")
    for name in _REQUIRED_AGENT_KEYS:
        if name not in document:
            raise AgentConfigError(f"missing key {name!r}")
    for name, value in document.items():
        _check_agent_value(name, known[name].type, value)
    if document.get("mode", "enforce") not in AGENT_MODES:
        raise AgentConfigError(f"mode must be one of {', '.join(AGENT_MODES)}")
    return AgentConfig(**document)


def agent_config_document(config: AgentConfig) -> Dict[str, Any]:
    """The JSON document of ``config`` (every field that is set), which agent_config_from_document reads back."""
    values: Mapping[str, Any] = {f.name: getattr(config, f.name) for f in fields(AgentConfig)}
    return {name: value for name, value in values.items() if value is not None}


def _check_agent_value(name: str, kind: Any, value: Any) -> None:
    # ``kind`` is the annotation as text (postponed annotations): "float", "str" or "Optional[str]".
    if kind == "float":
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < math.inf:
            raise AgentConfigError(f"{name} must be a number >= 0, finite")
    elif value is None and kind == "Optional[str]":
        return
    elif not isinstance(value, str) or (not value and name != "prefix"):
        raise AgentConfigError(f"{name} must be a non-empty string")
    elif not _encodes(value):  # a \ud800 escape: every URL and path built from it would fail
        raise AgentConfigError(f"{name} must be UTF-8 text")


def _encodes(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


# --- registration: a booting compute node's topology, handed to its slurmd -------------------------------------
# Slurm 25.11 places a CLOUD node where its slurmd says at registration (``slurmd --conf "topology=<t>:<path>"``),
# before a job can land on it. The backend publishes one entry per running instance of a ParallelCluster cluster
# under ``<prefix>/<cluster>/registration/<instance-id>.json``; the node's start action (topokeeper.agent.
# registration) reads its own and hands it to slurmd. 26.05.x ignores it for resumed nodes (slurmd-supplied fields
# apply only when boot_time > last_response), so there the head node's ``scontrol update`` places them.
REGISTRATION_SCHEMA = "topokeeper.registration/1"
# The Slurm series whose slurmctld places a resumed CLOUD node where its slurmd says (slurmd --conf "topology=...",
# 25.11): 26.05 ignores a resumed node's slurmd-supplied fields (boot_time <= last_response), so no entry there.
REGISTRATION_SERIES = ((25, 11),)
MAX_REGISTRATION_BYTES = 16 * 1024
# A delivered bundle's "registering" lists the nodes whose instance has an entry. The head node leaves such a node
# to its slurmd while slurmctld has it powering up or powered down (not registered yet): it writes the files, runs
# no `scontrol update` for it, and records when; from that first apply, for at most REGISTRATION_WAIT_SECONDS
# (node-start's 60 s wait for its entry, slurmd's start and registration, and the instance's boot up to its
# OnNodeStart action, ~3 min), after which the next apply places it and verify reads it as drift.
REGISTERING_KEY = "registering"
REGISTRATION_WAIT_SECONDS = 300.0
UNREGISTERED_FLAGS = ("POWERING_UP", "POWERED_DOWN")
MAX_TOPOLOGY_VALUE_CHARS = 4096
# Only what Slurm allows in topology, switch and block names (domain/names.py's charset, 64 characters): the
# value ends up in a systemd unit and on slurmd's command line, so nothing else passes, at the source or the node.
_NAME = r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}"
_PLACEMENT = r"%s(?::%s){1,16}" % (_NAME, _NAME)
_TOPOLOGY_VALUE = re.compile(r"%s(?:,%s)*" % (_PLACEMENT, _PLACEMENT))
_INSTANCE_ID = re.compile(r"i-(?:[0-9a-f]{8}|[0-9a-f]{17})")
_REGISTRATION_KEYS = ("schema", "cluster", "instance_id", "topology", "generation", "plan_sha256")


class RegistrationError(ValueError):
    """An entry that is not this node's or not safe to hand to slurmd; the message names the field."""


@dataclass(frozen=True)
class Registration:
    """One instance's entry: bound to its cluster and instance, so a node refuses one that is not its own."""

    cluster: str
    instance_id: str
    topology: str  # the node's whole Topology= value: "<topology>:<switch>:...:<leaf>[,<topology>:<block>]"
    generation: int  # the cluster's change generation the backend planned it at
    plan_sha256: str  # the plan it comes from


def registration_prefix(cluster: str, prefix: str = AGENT_KEY_PREFIX) -> str:
    """Where a cluster's entries live (the node role's policy grants s3:GetObject on this prefix only)."""
    return _agent_key(cluster, "registration", prefix) + "/"


def registration_key(cluster: str, instance_id: str, prefix: str = AGENT_KEY_PREFIX) -> str:
    if not _INSTANCE_ID.fullmatch(instance_id):
        raise RegistrationError("instance_id: not an EC2 instance id: %s" % repr(instance_id)[:40])
    return registration_prefix(cluster, prefix) + instance_id + ".json"


def check_topology_value(value: object) -> str:
    """``value`` if it is a Topology= value of Slurm-safe names, else RegistrationError naming the field."""
    if not isinstance(value, str) or not value:
        raise RegistrationError("topology: expected a non-empty string")
    if len(value) > MAX_TOPOLOGY_VALUE_CHARS or not _TOPOLOGY_VALUE.fullmatch(value):
        raise RegistrationError("topology: not <topology>:<path> of Slurm names: %s" % repr(value)[:80])
    return value


def registration_text(entry: Registration) -> str:
    """The entry's JSON text (checked first: the backend refuses to publish what a node would refuse)."""
    check_topology_value(entry.topology)
    registration_key(entry.cluster, entry.instance_id)
    document = {
        "schema": REGISTRATION_SCHEMA,
        "cluster": entry.cluster,
        "instance_id": entry.instance_id,
        "topology": entry.topology,
        "generation": entry.generation,
        "plan_sha256": entry.plan_sha256,
    }
    return canonical_json(document)


def parse_registration(body: bytes, cluster: str, instance_id: str) -> Registration:
    """The entry in ``body`` if it is ``cluster``'s entry for ``instance_id`` and safe; else RegistrationError."""
    if len(body) > MAX_REGISTRATION_BYTES:
        raise RegistrationError("entry: larger than %d bytes" % MAX_REGISTRATION_BYTES)
    try:
        document = json.loads(body.decode("utf-8"))
    except (ValueError, RecursionError):
        raise RegistrationError("entry: not JSON text") from None
    if not isinstance(document, dict) or sorted(document) != sorted(_REGISTRATION_KEYS):
        raise RegistrationError("entry: expected an object with keys %s" % ", ".join(_REGISTRATION_KEYS))
    if document["schema"] != REGISTRATION_SCHEMA:
        raise RegistrationError("schema: %s, expected %s" % (repr(document["schema"])[:60], REGISTRATION_SCHEMA))
    if document["cluster"] != cluster:
        raise RegistrationError("cluster: %s, not this node's cluster %r" % (repr(document["cluster"])[:70], cluster))
    if document["instance_id"] != instance_id:
        raise RegistrationError("instance_id: %s, not this instance" % repr(document["instance_id"])[:40])
    generation, sha = document["generation"], document["plan_sha256"]
    if isinstance(generation, bool) or not isinstance(generation, int) or generation < 0:
        raise RegistrationError("generation: expected an integer >= 0")
    if not isinstance(sha, str) or not re.fullmatch(r"[0-9a-f]{64}", sha):
        raise RegistrationError("plan_sha256: expected 64 hex digits")
    return Registration(cluster, instance_id, check_topology_value(document["topology"]), generation, sha)
