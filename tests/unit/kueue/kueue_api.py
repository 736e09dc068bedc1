"""What Kueue v0.19.2's API server accepts for the objects topokeeper generates.

Facts encoded from the release's CRDs (``config/components/crd/bases/kueue.x-k8s.io_topologies.yaml`` and
``..._resourceflavors.yaml``, served version v1beta2): a JSON Schema for the fields we generate (types,
required fields, lengths, patterns, item limits) and the ``x-kubernetes-validations`` rules, evaluated as CEL
with cel-python. Rules that read ``oldSelf`` are transition rules: the API server runs them on update only.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import celpy
from jsonschema import Draft202012Validator

LABEL_KEY_PATTERN = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$"
)
DNS_SUBDOMAIN_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
_METADATA = {
    "type": "object",
    "required": ["name"],
    "properties": {"name": {"type": "string", "maxLength": 253, "pattern": DNS_SUBDOMAIN_PATTERN}},
}


def _kueue_object(kind: str, spec: dict[str, Any], *, spec_required: bool) -> dict[str, Any]:
    return {
        "type": "object",
        "required": ["apiVersion", "kind", "metadata", *(["spec"] if spec_required else [])],
        "additionalProperties": False,
        "properties": {
            "apiVersion": {"const": "kueue.x-k8s.io/v1beta2"},
            "kind": {"const": kind},
            "metadata": _METADATA,
            "spec": {"type": "object", "additionalProperties": False, **spec},
        },
    }


_NODE_LABEL = {"type": "string", "minLength": 1, "maxLength": 316, "pattern": LABEL_KEY_PATTERN}
_LEVEL = {
    "type": "object",
    "required": ["nodeLabel"],
    "additionalProperties": False,
    "properties": {"nodeLabel": _NODE_LABEL},
}
TOPOLOGY_SCHEMA = _kueue_object(
    "Topology",
    {
        "required": ["levels"],
        "properties": {"levels": {"type": "array", "minItems": 1, "maxItems": 16, "items": _LEVEL}},
    },
    spec_required=True,
)
RESOURCE_FLAVOR_SCHEMA = _kueue_object(
    "ResourceFlavor",
    {
        "properties": {
            "nodeLabels": {"type": "object", "maxProperties": 8, "additionalProperties": {"type": "string"}},
            "nodeTaints": {"type": "array", "maxItems": 8},
            "tolerations": {"type": "array", "maxItems": 8},
            "topologyName": {"type": "string", "maxLength": 253, "pattern": DNS_SUBDOMAIN_PATTERN},
        }
    },
    spec_required=False,
)


@dataclass(frozen=True)
class Rule:
    path: tuple[str, ...]  # where ``self`` points, from the object's root
    rule: str
    message: str

    @property
    def transition(self) -> bool:
        return "oldSelf" in self.rule


RULES: dict[str, tuple[Rule, ...]] = {
    "Topology": (
        Rule(("spec", "levels"), "self == oldSelf", "field is immutable"),
        Rule(("spec", "levels"), "size(self.filter(i, size(self.filter(j, j == i)) > 1)) == 0", "must be unique"),
        Rule(
            ("spec", "levels"),
            "size(self.filter(i, i.nodeLabel == 'kubernetes.io/hostname')) == 0"
            " || self[size(self) - 1].nodeLabel == 'kubernetes.io/hostname'",
            "the kubernetes.io/hostname label can only be used at the lowest level of topology",
        ),
    ),
    "ResourceFlavor": (
        Rule(
            ("spec",),
            "!has(self.topologyName) || self.nodeLabels.size() >= 1",
            "at least one nodeLabel is required when topology is set",
        ),
        Rule(
            ("spec",),
            "!has(oldSelf.topologyName) || self == oldSelf",
            "resourceFlavorSpec are immutable when topologyName is set",
        ),
    ),
}
SCHEMAS = {"Topology": TOPOLOGY_SCHEMA, "ResourceFlavor": RESOURCE_FLAVOR_SCHEMA}
_CEL = celpy.Environment()
_PROGRAMS = {rule.rule: _CEL.program(_CEL.compile(rule.rule)) for rules in RULES.values() for rule in rules}
_MISSING = object()


def _at(document: Mapping[str, Any], path: tuple[str, ...]) -> Any:
    value: Any = document
    for key in path:
        if not isinstance(value, Mapping) or key not in value:
            return _MISSING
        value = value[key]
    return value


def _holds(rule: Rule, self_value: Any, old_value: Any) -> bool:
    activation = {"self": celpy.json_to_cel(self_value)}
    if rule.transition:
        activation["oldSelf"] = celpy.json_to_cel(old_value)
    try:
        result = _PROGRAMS[rule.rule].evaluate(activation)
    except celpy.CELEvalError:
        return False  # the API server rejects an object whose rule cannot be evaluated (e.g. a missing field)
    return result is True or result == celpy.celtypes.BoolType(True)


def api_errors(document: Mapping[str, Any], old: Mapping[str, Any] | None = None) -> list[str]:
    """The API server's errors for creating ``document`` (or updating ``old`` to it); empty: accepted."""
    kind = document.get("kind")
    if kind not in SCHEMAS:
        return [f"kind: no CRD for {kind!r}"]
    errors = [
        f"{'.'.join(str(p) for p in error.absolute_path) or '<root>'}: {error.message}"
        for error in sorted(Draft202012Validator(SCHEMAS[kind]).iter_errors(document), key=str)
    ]
    if errors:
        return errors  # CEL rules run on objects that passed the structural schema
    for rule in RULES[kind]:
        value = _at(document, rule.path)
        old_value = _at(old, rule.path) if old is not None else _MISSING
        if value is _MISSING or (rule.transition and old_value is _MISSING):
            continue
        if not _holds(rule, value, old_value):
            errors.append(f"{'.'.join(rule.path)}: {rule.message}")
    return errors
