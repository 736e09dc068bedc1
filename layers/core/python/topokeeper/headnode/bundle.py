"""The bundle: everything the head node would otherwise have to trust is checked here (schema, hashes, names)."""

from __future__ import annotations

import json
import re
from typing import (
    Any,
    Dict,
    List,
    Mapping,
    NamedTuple,
    Optional,
    Tuple,
)

from topokeeper.headnode.failures import BadSignature, Refused
from topokeeper.wire import (
    BUNDLE_SCHEMAS,
    CONF_FORMAT,
    REGISTERING_KEY,
    SIGNATURE_ALGORITHM,
    YAML_FORMAT,
    bindings_sha256,
    content_sha256,
    sha256_text,
    signed_bytes,
)

_GENERATION_MAX = 2**63 - 1
MANAGED_BY = ("parallelcluster",)  # who else may write the live topology file (managed_by's values)


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
_OPTIONAL_KEYS = frozenset(["bindings", "bindings_sha256", "replace_managed", REGISTERING_KEY])


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
    replace_managed: Optional[str] = None  # a managed_by value whose topology file an apply may replace
    registering: Tuple[str, ...] = ()  # nodes whose instance has a registration entry (wire.REGISTERING_KEY)


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


def _document(text: str) -> Dict[str, Any]:
    """The bundle as a JSON object of this schema with exactly the keys it may have."""
    try:
        document = json.loads(text, object_pairs_hook=_no_duplicate_keys)
    except ValueError as error:
        raise Refused("bundle is not valid JSON (truncated?): %s" % error) from None
    except RecursionError:  # json recurses per nesting level
        raise Refused("bundle is nested too deeply") from None
    document = _object(document, "bundle")
    # /3 marks a bundle with REGISTERING_KEY; a /2 one may carry it too (the release before /3 sent it so).
    if document.get("schema") not in BUNDLE_SCHEMAS:
        schemas = " or ".join(BUNDLE_SCHEMAS)
        raise Refused("bundle.schema: expected %s, got %r" % (schemas, str(document.get("schema"))[:80]))
    missing = sorted(_BUNDLE_KEYS - set(document))
    unknown = sorted(set(document) - _BUNDLE_KEYS - _SIGNING_KEYS - _OPTIONAL_KEYS)
    if missing or unknown:
        raise Refused("bundle: missing keys %s, unknown keys %s" % (missing, [key[:40] for key in unknown[:5]]))
    return document


def _format_and_plugin(document: Mapping[str, Any]) -> Tuple[str, Optional[str]]:
    slurm_format = document["slurm_format"]
    if slurm_format not in (YAML_FORMAT, CONF_FORMAT):
        raise Refused("bundle.slurm_format: expected %s or %s" % (YAML_FORMAT, CONF_FORMAT))
    plugin = document["topology_plugin"]
    if slurm_format == YAML_FORMAT and plugin is not None:
        raise Refused("bundle.topology_plugin: must be null for topology.yaml (Slurm ignores it there)")
    if slurm_format == CONF_FORMAT and not (isinstance(plugin, str) and _PLUGIN.match(plugin)):
        raise Refused("bundle.topology_plugin: expected topology/<name> for topology.conf, got %r" % str(plugin)[:80])
    return slurm_format, plugin


def _files(document: Mapping[str, Any], slurm_format: str) -> Dict[str, str]:
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
    return contents


def _partitions(document: Mapping[str, Any], slurm_format: str) -> Dict[str, Optional[str]]:
    partitions: Dict[str, Optional[str]] = {}
    for name, value in _object(document["partitions"], "bundle.partitions").items():
        where = "bundle.partitions.%s" % _safe_name(name, "bundle.partitions")
        if value is not None and slurm_format == CONF_FORMAT:
            raise Refused("%s: Topology= on a partition line is fatal before Slurm 25.05" % where)
        partitions[name] = None if value is None else _safe_name(value, where)
    return partitions


def _topologies(document: Mapping[str, Any]) -> Dict[str, Dict[str, ExpectedUnit]]:
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
    return topologies


def _bindings(document: Mapping[str, Any]) -> Dict[str, str]:
    bindings = _object(document.get("bindings", {}), "bundle.bindings")
    for name, address in bindings.items():
        if not isinstance(address, str):
            raise Refused("bundle.bindings.%s: expected a string" % _safe_name(name, "bundle.bindings"))
    if set(document) & {"bindings", "bindings_sha256"} and bindings_sha256(bindings) != document.get("bindings_sha256"):
        raise Refused("bundle.bindings_sha256: does not match the bundle's bindings (tampered?)")
    return bindings


def parse_bundle(text: str) -> Bundle:
    """Check everything the applier would otherwise have to trust: schema, hashes, names."""
    document = _document(text)
    slurm_format, plugin = _format_and_plugin(document)
    contents = _files(document, slurm_format)
    partitions = _partitions(document, slurm_format)
    topologies = _topologies(document)
    plan_sha256 = document["plan_sha256"]
    if not isinstance(plan_sha256, str) or not _SHA256_HEX.match(plan_sha256):
        raise Refused("bundle.plan_sha256: expected 64 lowercase hex digits")
    if content_sha256(slurm_format, plugin, contents, partitions) != plan_sha256:
        raise Refused("bundle.plan_sha256: does not match the bundle's files, partitions and plugin (tampered?)")
    if not isinstance(document["cluster_name"], str):
        raise Refused("bundle.cluster_name: expected a string")
    signing = parse_signing(document)
    bindings = _bindings(document)
    replace_managed = document.get("replace_managed")
    if replace_managed is not None and replace_managed not in MANAGED_BY:
        raise Refused("bundle.replace_managed: expected null or one of %s" % ", ".join(MANAGED_BY))
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
        replace_managed=replace_managed,
        registering=tuple(_safe_names(document.get(REGISTERING_KEY, []), "bundle.%s" % REGISTERING_KEY)),
        **signing,
    )


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
