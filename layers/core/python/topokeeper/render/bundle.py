"""Plan -> the files topokeeper writes: plan.json, topology.yaml|conf, topology.mmd, bundle.json.

``bundle.json`` is the head-node applier's whole input. Its ``plan_sha256`` is content-addressed: it
covers exactly what the applier makes live (topology files, ``Topology=`` assignments, the plugin),
so two plans with the same hash need no write.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic_core import PydanticSerializationError, to_json

from topokeeper.domain.models import (
    PLAN_SCHEMA,
    BlockTopology,
    PartitionPlan,
    Plan,
    SlurmFormat,
    Topology,
    TreeTopology,
    empty_list,
)
from topokeeper.render.mermaid import render_mermaid
from topokeeper.render.slurm_conf import render_conf
from topokeeper.render.slurm_yaml import render_entry, render_yaml
from topokeeper.wire import (
    BUNDLE_SCHEMA,
    BUNDLE_SCHEMAS,
    REGISTERING_BUNDLE_SCHEMA,
    bindings_sha256,
    content_sha256,
    sha256_text,
)


def json_text(document: Any, *, sort_keys: bool = False) -> str:
    """``json.dumps(document, indent=2, sort_keys=sort_keys) + "\\n"``, the same bytes, for documents of str, int,
    bool, None, list and dict (no float): encoded by pydantic-core, 10x faster than json's indenting encoder, which is
    pure Python (0.6 s for plan.json and bundle.json at 100,000 nodes)."""
    if sort_keys:
        document = _keys_sorted(document)
    try:
        text = to_json(document, indent=2, ensure_ascii=True).decode("ascii")
    except PydanticSerializationError:  # a lone surrogate: json escapes it, pydantic-core refuses it
        return json.dumps(document, indent=2) + "\n"
    if "\x7f" in text:  # the one character json escapes and pydantic-core does not
        return json.dumps(document, indent=2) + "\n"
    return text + "\n"


def _keys_sorted(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: _keys_sorted(value[key]) for key in sorted(value)}
    if isinstance(value, list) and not {*map(type, value)} <= _SCALARS:
        return [_keys_sorted(item) for item in value]
    return value


_SCALARS = frozenset({str, int, bool, type(None)})


class BundleFile(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    content: str
    sha256: str


class ExpectedUnit(BaseModel):
    """What ``scontrol show topology`` must list for one switch or block: its nodes, or its child switches."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    kind: Literal["switch", "block"]
    nodes: list[str] = Field(default_factory=empty_list)
    switches: list[str] = Field(default_factory=empty_list)


class BundleSignature(BaseModel):
    """The KMS signature of the bundle's canonical bytes (``applier.signed_bytes``: everything but this)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    algorithm: Literal["RSASSA_PKCS1_V1_5_SHA_256"]
    key_id: str
    value: str  # base64


PLAN_BUNDLE_SCHEMA_1 = "topokeeper.bundle/1"
SIGNING_FIELDS = frozenset({"generation", "purpose", "signature"})


class Bundle(BaseModel):
    """What the applier needs, and nothing it would have to trust without checking. A plan's bundle is
    unsigned (content-addressed); a delivered one carries a generation, its purpose and the signature."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def _known_schema(cls, data: Any) -> Any:
        """A document's schema is checked, then dropped: what the fields hold says which one it is (``schema_``).
        A /1 bundle is a /2 bundle without signing fields (plans stored before them)."""
        if isinstance(data, dict) and "schema" in data:
            if data["schema"] not in (PLAN_BUNDLE_SCHEMA_1, *BUNDLE_SCHEMAS):
                raise ValueError(f"schema: expected one of {', '.join(BUNDLE_SCHEMAS)}, got {data['schema']!r}")
            data = {key: value for key, value in data.items() if key != "schema"}
        return data

    cluster_name: str
    plan_sha256: str
    slurm_format: SlurmFormat
    topology_plugin: str | None
    files: dict[str, BundleFile]
    partitions: dict[str, str | None]  # partition -> Topology= value; None removes the key
    nodes: list[str]
    # The live read-back to expect, per topology name; Slurm < 25.05 has one, read without a name.
    topologies: dict[str, dict[str, ExpectedUnit]]
    # The NodeName -> NodeAddr bindings the plan assumed (ParallelCluster), hashed apart from plan_sha256:
    # the applier defers a node whose binding no longer holds (headnode/deferral.py). Absent when nodes are named
    # by host name.
    bindings: dict[str, str] | None = None
    bindings_sha256: str | None = None
    # Set at delivery for a cluster configured with replace_parallelcluster_topology: the applier may replace a
    # topology file that tool generated (managed_by). Absent otherwise, so a bundle without it keeps its bytes.
    replace_managed: Literal["parallelcluster"] | None = None
    # Set at delivery on Slurm 25.11 (service/registration.py): the nodes whose instance has a registration entry,
    # sorted; the head node leaves those not registered yet to their slurmd for a while (wire.REGISTERING_KEY).
    registering: list[str] | None = None
    generation: int | None = Field(None, ge=1)
    purpose: Literal["apply", "verify"] | None = None
    signature: BundleSignature | None = None

    @property
    def schema_(self) -> str:
        """/3 when it lists nodes left to registration: an agent whose program predates that key refuses it as newer
        than it knows (agent_outdated, whose alarm says to upgrade), not as an unknown key; /2 without it, so head
        nodes that never need registration keep working unupgraded."""
        return BUNDLE_SCHEMA if self.registering is None else REGISTERING_BUNDLE_SCHEMA

    def document(self) -> dict[str, Any]:
        """The bundle's JSON document, what is signed and sent: absent bindings and signing fields are left out, so
        a bundle without them keeps its bytes."""
        document = self.model_dump(mode="json", by_alias=True)
        optional = SIGNING_FIELDS | {"bindings", "bindings_sha256", "replace_managed", "registering"}
        return {"schema": self.schema_, **{k: v for k, v in document.items() if k not in optional or v is not None}}

    def unsigned(self) -> Bundle:
        """The plan's own bundle: what the plans store keeps, content-addressed."""
        return self.model_copy(update=dict.fromkeys(SIGNING_FIELDS))


def partition_sha256(partition: PartitionPlan) -> str:
    return sha256_text(render_entry(partition.topology))


def expected_units(topology: Topology) -> dict[str, ExpectedUnit]:
    if isinstance(topology, TreeTopology):
        return {
            s.name: ExpectedUnit(kind="switch", nodes=sorted(s.nodes))
            if s.nodes
            else ExpectedUnit(kind="switch", switches=sorted(s.switches))
            for s in topology.switches
        }
    if isinstance(topology, BlockTopology):
        return {b.name: ExpectedUnit(kind="block", nodes=sorted(b.nodes)) for b in topology.blocks}
    return {}


def _topology_document(topology: Topology) -> dict[str, Any]:
    if isinstance(topology, TreeTopology):
        return {
            "switches": [
                {"name": s.name, "switches": list(s.switches), "nodes": list(s.nodes)} for s in topology.switches
            ]
        }
    if isinstance(topology, BlockTopology):
        return {
            "block_sizes": list(topology.block_sizes),
            "blocks": [{"name": b.name, "nodes": list(b.nodes)} for b in topology.blocks],
        }
    return {}


def leaf_units(partition: Mapping[str, Any]) -> list[tuple[str, list[str]]]:
    """(name, nodes) of each leaf switch or block of a plan document partition; none for a flat one."""
    if partition.get("blocks"):
        return [(block["name"], list(block["nodes"])) for block in partition["blocks"]]
    return [(s["name"], list(s["nodes"])) for s in partition.get("switches", []) if not s.get("switches")]


class RenderedPlan(BaseModel):
    model_config = ConfigDict(frozen=True)

    plan: Plan
    bundle: Bundle
    mermaid: str
    partition_sha256: dict[str, str]

    @property
    def sha256(self) -> str:
        return self.bundle.plan_sha256

    @property
    def topology_text(self) -> str:
        return self.bundle.files[self.plan.slurm_format.value].content

    def plan_document(self) -> dict[str, Any]:
        plan = self.plan
        return {
            "schema": PLAN_SCHEMA,
            "cluster": {"name": plan.cluster_name, "arn": plan.cluster_arn},
            "slurm": {
                "version": str(plan.slurm_version),
                "format": plan.slurm_format.value,
                "topology_plugin": plan.topology_plugin,
            },
            "partitions": [
                {
                    "name": p.partition,
                    "kind": p.kind.value,
                    "topology": p.topology.name,
                    "assignment": p.assignment,
                    "node_count": len(p.nodes),
                    "nodes": list(p.nodes),
                    **_topology_document(p.topology),
                    "nodes_without_topology": list(p.nodes_without_topology),
                    # Only where Slurm nodes have no instance (ParallelCluster): other plans keep their bytes.
                    **({"nodes_without_instance": list(p.nodes_without_instance)} if p.nodes_without_instance else {}),
                    "warnings": list(p.warnings),
                    "sha256": self.partition_sha256[p.partition],
                }
                for p in sorted(plan.partitions, key=lambda p: p.partition)
            ],
            "cluster_topology": (
                None
                if plan.cluster_topology is None
                else {
                    "kind": plan.cluster_topology.kind.value,
                    "name": plan.cluster_topology.name,
                    **_topology_document(plan.cluster_topology),
                }
            ),
            "files": {name: file.sha256 for name, file in self.bundle.files.items()},
            "warnings": list(plan.warnings),
            "sha256": self.sha256,
        }

    def files(self) -> dict[str, str]:
        """Everything ``topokeeper plan --out`` writes, by file name."""
        return {
            "plan.json": json_text(self.plan_document()),
            self.plan.slurm_format.value: self.topology_text,
            "topology.mmd": self.mermaid,
            "bundle.json": json_text(self.bundle.document(), sort_keys=True),
        }


def _expected_topologies(plan: Plan) -> dict[str, dict[str, ExpectedUnit]]:
    if plan.cluster_topology is not None:
        units = expected_units(plan.cluster_topology)
        return {plan.cluster_topology.name: units} if units else {}
    return {p.assignment: expected_units(p.topology) for p in plan.partitions if p.assignment is not None}


def render(plan: Plan) -> RenderedPlan:
    text = render_yaml(plan) if plan.slurm_format is SlurmFormat.YAML else render_conf(plan)
    topology_files = {plan.slurm_format.value: text}
    assignments = {p.partition: p.assignment for p in sorted(plan.partitions, key=lambda p: p.partition)}
    bundle = Bundle(
        cluster_name=plan.cluster_name,
        plan_sha256=content_sha256(plan.slurm_format.value, plan.topology_plugin, topology_files, assignments),
        slurm_format=plan.slurm_format,
        topology_plugin=plan.topology_plugin,
        files={
            name: BundleFile(content=content, sha256=sha256_text(content)) for name, content in topology_files.items()
        },
        partitions=assignments,
        nodes=list(plan.nodes),
        topologies=_expected_topologies(plan),
        bindings=dict(plan.bindings) if plan.bindings else None,
        bindings_sha256=bindings_sha256(plan.bindings) if plan.bindings else None,
    )
    return RenderedPlan(
        plan=plan,
        bundle=bundle,
        mermaid=render_mermaid(plan),
        partition_sha256={p.partition: partition_sha256(p) for p in plan.partitions},
    )
