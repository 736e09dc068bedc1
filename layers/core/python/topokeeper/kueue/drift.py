"""Label drift: NodeList labels against DescribeInstanceTopology facts and against the flavor's Topology.

Kueue places a flavor's pods only on nodes that carry every level label of its Topology; a node that
lacks one is invisible to topology-aware scheduling ("no topology domains at level"), and a job that
needs it never admits. Each finding says how to fix it; nothing here changes the cluster.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum

from topokeeper.domain.catalog import ec2_instance_type
from topokeeper.domain.models import Node
from topokeeper.kueue.node_list import (
    INSTANCE_TYPE_LABEL,
    LAYER_LABEL_PREFIX,
    ULTRASERVER_LABEL,
    KubeNode,
    topology_labels,
)
from topokeeper.kueue.objects import KueuePlan


class DriftKind(StrEnum):
    MISSING = "missing"  # DescribeInstanceTopology has a value; the node has no label
    DIFFERENT = "different"  # the label differs from DescribeInstanceTopology
    UNKNOWN_TO_AWS = "unknown-to-aws"  # a label DescribeInstanceTopology does not back
    LEVEL_MISSING = "level-missing"  # the flavor's Topology needs this level; no value is known for it


@dataclass(frozen=True)
class LabelDrift:
    node: str
    label: str
    kind: DriftKind
    have: str | None
    want: str | None
    fix: str


def _set_label(node: str, label: str, value: str) -> str:
    return f"kubectl label node {node} {label}={value} --overwrite"


def label_drift(
    kube_nodes: Iterable[KubeNode], facts: Iterable[Node] | None, plan: KueuePlan
) -> tuple[LabelDrift, ...]:
    """One finding per node and label; ``facts`` None means no snapshot: only the Topology's needs are checked."""
    by_instance: Mapping[str, Node] = (
        {node.instance_id: node for node in facts if node.instance_id} if facts is not None else {}
    )
    findings: list[LabelDrift] = []
    for kube in kube_nodes:
        fact = by_instance.get(kube.instance_id or "")
        want = topology_labels(fact) if fact else {}
        have = {k: v for k, v in kube.labels.items() if k.startswith(LAYER_LABEL_PREFIX) or k == ULTRASERVER_LABEL}
        instance_type = ec2_instance_type(kube.labels.get(INSTANCE_TYPE_LABEL, ""))
        required = plan.required_levels(instance_type)
        for label in sorted(set(want) | set(have) | set(required)):
            finding = _finding(
                kube,
                label,
                have=have.get(label),
                want=want.get(label),
                required=label in required,
                checked=facts is not None,
                fact=fact,
            )
            if finding:
                findings.append(finding)
    return tuple(findings)


def _finding(
    kube: KubeNode,
    label: str,
    *,
    have: str | None,
    want: str | None,
    required: bool,
    checked: bool,
    fact: Node | None,
) -> LabelDrift | None:
    if want is not None and have != want:
        kind = DriftKind.MISSING if have is None else DriftKind.DIFFERENT
        return LabelDrift(kube.name, label, kind, have, want, _set_label(kube.name, label, want))
    if have is not None and want is None and checked:
        why = "not in the snapshot" if fact is None else "reports no such layer"
        fix = (
            f"DescribeInstanceTopology {why} for {kube.instance_id or 'this node'}: "
            f"take a fresh snapshot, or `kubectl label node {kube.name} {label}-` if the layer is gone"
        )
        return LabelDrift(kube.name, label, DriftKind.UNKNOWN_TO_AWS, have, None, fix)
    if have is None and required:
        fix = (
            f"no value known for {kube.instance_id or 'this node'}: DescribeInstanceTopology does not report this "
            "layer yet (new instance, partial capacity-reservation topology, or an instance the account cannot "
            "describe); label it once it does, or keep the node out of this flavor"
        )
        return LabelDrift(kube.name, label, DriftKind.LEVEL_MISSING, None, None, fix)
    return None


def render_drift(findings: Iterable[LabelDrift]) -> str:
    lines = [
        f"{f.node}: {f.label} {f.kind.value} (have {f.have or '-'}, want {f.want or '?'}): {f.fix}" for f in findings
    ]
    return "\n".join(lines) + ("\n" if lines else "")
