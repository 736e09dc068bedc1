"""Kueue's admission rules for topology annotations on a pod set (``ValidateTASPodSetRequest`` in
``pkg/controller/jobframework/tas_validation.go``, v0.19.2), and where a job kind keeps its pod sets.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

PREFIX = "kueue.x-k8s.io/"
REQUIRED = PREFIX + "podset-required-topology"
PREFERRED = PREFIX + "podset-preferred-topology"
UNCONSTRAINED = PREFIX + "podset-unconstrained-topology"
SLICE_REQUIRED = PREFIX + "podset-slice-required-topology"
SLICE_SIZE = PREFIX + "podset-slice-size"
GROUP_NAME = PREFIX + "podset-group-name"
POD_INDEX_OFFSET = PREFIX + "pod-index-offset"
SLICE_CONSTRAINTS = PREFIX + "podset-slice-required-topology-constraints"
_MAX_SLICE_CONSTRAINTS = 3
_INT32_MAX = 2**31 - 1

# apimachinery IsQualifiedName: optional DNS-subdomain prefix (<= 253) and "/", then a name (<= 63).
_NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_GO_BOOLS = frozenset({"1", "t", "T", "TRUE", "true", "True", "0", "f", "F", "FALSE", "false", "False"})
_GO_INT = re.compile(r"[+-]?[0-9]+")


def label_name_errors(value: str) -> list[str]:
    """apimachinery ``ValidateLabelName`` (IsQualifiedName)."""
    prefix, slash, name = value.rpartition("/")
    if not slash:
        prefix, name = "", value
    errors = []
    if slash and (not prefix or len(prefix) > 253 or not _DNS_SUBDOMAIN.fullmatch(prefix)):
        errors.append("prefix must be a DNS subdomain of at most 253 characters")
    if not name or len(name) > 63 or not _NAME.fullmatch(name):
        errors.append("name part must be 1-63 alphanumerics, '-', '_' or '.', starting and ending alphanumeric")
    return errors


def _int32(value: str) -> int | None:
    if not _GO_INT.fullmatch(value):
        return None
    number = int(value)
    return number if -_INT32_MAX - 1 <= number <= _INT32_MAX else None


def podset_errors(annotations: Mapping[str, str], where: str = "annotations") -> list[str]:
    """The errors Kueue's webhook would return for one pod set's annotations (empty: admitted)."""
    errors: list[str] = []

    def error(key: str, message: str) -> None:
        errors.append(f"{where}[{key}]: {message}" if key else f"{where}: {message}")

    if sum(key in annotations for key in (REQUIRED, PREFERRED, UNCONSTRAINED)) > 1:
        error("", f"must not contain more than one topology annotation: [{REQUIRED}, {PREFERRED}, {UNCONSTRAINED}]")
    for key in (REQUIRED, PREFERRED, SLICE_REQUIRED):
        if key in annotations:
            errors += [f"{where}[{key}]: {message}" for message in label_name_errors(annotations[key])]
    group = GROUP_NAME in annotations
    if group:
        errors += _group_name_errors(annotations, where)
    errors += _number_errors(annotations, where, group)
    if SLICE_REQUIRED in annotations and SLICE_SIZE not in annotations:
        error(SLICE_SIZE, f"must be set when '{SLICE_REQUIRED}' is specified")
    if SLICE_REQUIRED not in annotations and SLICE_SIZE in annotations:
        error(SLICE_SIZE, f"may not be set when '{SLICE_REQUIRED}' is not specified")
    errors += _slice_constraint_errors(annotations, where, group)
    return errors


def _group_name_errors(annotations: Mapping[str, str], where: str) -> list[str]:
    here = f"{where}[{GROUP_NAME}]"
    errors = []
    if re.fullmatch(r"[0-9]+", annotations[GROUP_NAME]) and int(annotations[GROUP_NAME]) < 2**64:
        errors.append(f"{here}: must not be a number")
    errors += [
        f"{here}: may not be set when '{key}' is specified"
        for key in (SLICE_SIZE, SLICE_REQUIRED)
        if key in annotations
    ]
    if REQUIRED not in annotations and PREFERRED not in annotations:
        errors.append(f"{here}: may not be set when neither '{PREFERRED}' nor '{REQUIRED}' is specified")
    return errors


def _number_errors(annotations: Mapping[str, str], where: str, group: bool) -> list[str]:
    """The boolean and integer annotations."""
    errors = []
    if UNCONSTRAINED in annotations and annotations[UNCONSTRAINED] not in _GO_BOOLS:
        errors.append(f"{where}[{UNCONSTRAINED}]: must be a boolean value")
    if SLICE_SIZE in annotations:
        size = _int32(annotations[SLICE_SIZE])
        if size is None:
            errors.append(f"{where}[{SLICE_SIZE}]: must be a numeric value")
        elif size < 1:
            errors.append(f"{where}[{SLICE_SIZE}]: must be greater than or equal to 1")
    if POD_INDEX_OFFSET in annotations:
        offset = _int32(annotations[POD_INDEX_OFFSET])
        if group:
            errors.append(f"{where}[{POD_INDEX_OFFSET}]: may not be set when '{GROUP_NAME}' is specified")
        elif offset is None or offset < 0:
            errors.append(f"{where}[{POD_INDEX_OFFSET}]: must be a non-negative integer")
    return errors


def _slice_constraint_errors(annotations: Mapping[str, str], where: str, group: bool) -> list[str]:
    """The multi-layer constraints annotation (feature gate TASMultiLayerTopology, assumed on)."""
    if SLICE_CONSTRAINTS not in annotations:
        return []
    here = f"{where}[{SLICE_CONSTRAINTS}]"
    errors = [
        f"{here}: may not be set when '{key}' is specified"
        for key in (SLICE_REQUIRED, SLICE_SIZE)
        if key in annotations
    ]
    if group:
        errors.append(f"{where}[{GROUP_NAME}]: may not be set when '{SLICE_CONSTRAINTS}' is specified")
    try:
        constraints = json.loads(annotations[SLICE_CONSTRAINTS])
    except json.JSONDecodeError as decode_error:
        return [*errors, f"{here}: must be a valid JSON array: {decode_error.msg}"]
    if not isinstance(constraints, list) or not all(isinstance(c, dict) for c in constraints):
        return [*errors, f"{here}: must be a valid JSON array of objects"]
    if not 1 <= len(constraints) <= _MAX_SLICE_CONSTRAINTS:
        return [*errors, f"{here}: must have between 1 and {_MAX_SLICE_CONSTRAINTS} layers"]
    sizes: list[int] = []
    seen: dict[str, int] = {}
    for index, constraint in enumerate(constraints):
        topology, size = str(constraint.get("topology", "")), constraint.get("size", 0)
        errors += [f"{here}[{index}].topology: {message}" for message in label_name_errors(topology)]
        size = size if isinstance(size, int) else 0
        if size < 1:
            errors.append(f"{here}[{index}].size: must be greater than or equal to 1")
        if topology in seen:
            errors.append(f"{here}[{index}].topology: duplicate {topology} (also at index {seen[topology]})")
        seen.setdefault(topology, index)
        sizes.append(size)
    for index in range(len(sizes) - 1):
        if sizes[index + 1] > 0 and sizes[index] % sizes[index + 1]:
            errors.append(f"{here}[{index + 1}].size: must evenly divide the parent layer size {sizes[index]}")
    return errors


def podsets(manifest: Mapping[str, Any]) -> dict[str, Mapping[str, str]]:
    """Pod-set path -> its template's annotations, for the job kinds the examples use."""
    kind = manifest.get("kind")
    spec = manifest.get("spec") or {}
    if kind == "Job":
        return {"spec.template.metadata": _annotations(spec.get("template"))}
    if kind == "PyTorchJob":
        replicas = spec.get("pytorchReplicaSpecs") or {}
        return {
            f"spec.pytorchReplicaSpecs.{name}.template.metadata": _annotations(replica.get("template"))
            for name, replica in sorted(replicas.items())
        }
    raise ValueError(f"no pod-set rules for kind {kind!r}")


def _annotations(template: Any) -> Mapping[str, str]:
    metadata = (template or {}).get("metadata") or {}
    return metadata.get("annotations") or {}


def manifest_errors(manifest: Mapping[str, Any]) -> list[str]:
    return [
        error
        for path, annotations in podsets(manifest).items()
        for error in podset_errors(annotations, path + ".annotations")
    ]
