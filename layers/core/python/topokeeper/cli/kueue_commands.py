"""``topokeeper kueue`` and ``topokeeper labels``: from a snapshot file, a NodeList file, or a live EKS cluster."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from topokeeper.cli.options import add_endpoint_option
from topokeeper.contract.errors import InputError

if TYPE_CHECKING:  # the planner's models (pydantic) load where a command runs, not for its --help
    from topokeeper.domain.models import Node
    from topokeeper.engine.snapshot import AwsSnapshot
    from topokeeper.kueue.drift import LabelDrift
    from topokeeper.kueue.node_list import KubeNode
    from topokeeper.kueue.objects import KueuePlan

EXIT_OK = 0


@dataclass(frozen=True)
class EksInputs:
    facts: tuple[Node, ...]  # DescribeInstanceTopology facts when a snapshot was given, else the labels' view
    kube_nodes: tuple[KubeNode, ...] | None
    from_snapshot: bool
    warnings: tuple[str, ...]

    def plan(self) -> KueuePlan:
        from topokeeper.domain.catalog import ec2_instance_type  # noqa: PLC0415
        from topokeeper.kueue.node_list import INSTANCE_TYPE_LABEL  # noqa: PLC0415
        from topokeeper.kueue.objects import plan_kueue  # noqa: PLC0415

        type_labels = {
            ec2_instance_type(kube.labels[INSTANCE_TYPE_LABEL]): kube.labels[INSTANCE_TYPE_LABEL]
            for kube in self.kube_nodes or ()
            if kube.labels.get(INSTANCE_TYPE_LABEL)
        }
        return plan_kueue(self.facts, type_labels)

    def drift(self, plan: KueuePlan) -> tuple[LabelDrift, ...]:
        from topokeeper.kueue.drift import label_drift  # noqa: PLC0415

        if self.kube_nodes is None:
            return ()
        return label_drift(self.kube_nodes, self.facts if self.from_snapshot else None, plan)


def read_cluster(cluster: str) -> AwsSnapshot:
    """ListClusterNodes pages and DescribeInstanceTopology batches of 100: no call per node."""
    # boto3 only for --cluster: the offline commands never load it.
    from topokeeper.adapters.aws import client  # noqa: PLC0415
    from topokeeper.adapters.ec2 import InstanceTopologyReader, LocalRateLimiter, MemoryNodeFactsCache  # noqa: PLC0415
    from topokeeper.adapters.hyperpod import HyperPodFacts  # noqa: PLC0415

    reader = InstanceTopologyReader(
        client("ec2"), MemoryNodeFactsCache(), LocalRateLimiter(), lambda: datetime.now(UTC)
    )
    return HyperPodFacts(client("sagemaker"), client("s3"), reader).read(cluster)


def load_inputs(snapshot: Path | None, nodes: Path | None, cluster: str | None = None) -> EksInputs:
    from topokeeper.contract.operator_files import read_mapping  # noqa: PLC0415
    from topokeeper.engine.snapshot import eks_nodes, parse_snapshot_document  # noqa: PLC0415
    from topokeeper.kueue.node_list import merge_facts, nodes_from_labels, parse_node_list  # noqa: PLC0415

    if snapshot is None and nodes is None and cluster is None:
        raise InputError("--snapshot", "give --snapshot FILE or --cluster NAME, --nodes NODES.json, or both")
    if snapshot is not None and cluster is not None:
        raise InputError("--cluster", "give --snapshot FILE or --cluster NAME, not both")
    kube_nodes = parse_node_list(read_mapping(nodes, "--nodes")) if nodes else None
    if cluster is not None:
        raw: AwsSnapshot | None = read_cluster(cluster)
    elif snapshot is not None:
        raw = parse_snapshot_document(read_mapping(snapshot, "--snapshot"))
    else:
        raw = None
    if raw is None:
        if kube_nodes is None:  # unreachable: one input was given
            raise InputError("--nodes", "missing")
        facts, label_warnings = nodes_from_labels(kube_nodes)
        return EksInputs(facts, kube_nodes, False, label_warnings)
    warnings = []
    if raw.describe_cluster.Orchestrator and "Eks" not in raw.describe_cluster.Orchestrator:
        warnings.append(f"{raw.describe_cluster.ClusterName} is not EKS-orchestrated; Kueue does not schedule it")
    facts = eks_nodes(raw)
    if kube_nodes is not None:
        facts = merge_facts(facts, kube_nodes)
    return EksInputs(facts, kube_nodes, True, tuple(warnings))


def _short_nodes(plan: KueuePlan) -> str:
    short = plan.nodes_without_topology_data
    if not short:
        return ""
    shown = ", ".join(short[:5]) + (f" (+{len(short) - 5})" if len(short) > 5 else "")
    return f"nodes without the topology data their flavor's Topology needs: {len(short)}: {shown}\n"


def _cmd_labels(args: argparse.Namespace) -> int:
    from topokeeper.kueue.drift import render_drift  # noqa: PLC0415
    from topokeeper.kueue.fleet import fleet_json, render_mermaid, render_table  # noqa: PLC0415

    inputs = load_inputs(args.snapshot, args.nodes, args.cluster)
    plan = inputs.plan()
    findings = inputs.drift(plan)
    if args.json:
        document: dict[str, Any] = fleet_json(plan.fleet)
        document["drift"] = [asdict(finding) for finding in findings]
        document["warnings"] = [*inputs.warnings, *plan.warnings]
        document["nodes_without_topology_data"] = list(plan.nodes_without_topology_data)
        json.dump(document, sys.stdout, indent=2, sort_keys=True)
        sys.stdout.write("\n")
        return EXIT_OK
    sys.stdout.write(render_mermaid(plan.fleet) if args.mermaid else render_table(plan.fleet))
    if not args.mermaid:
        sys.stdout.write(_short_nodes(plan) + render_drift(findings))
        for warning in (*inputs.warnings, *plan.warnings):
            print(f"warning: {warning}")
    return EXIT_OK


def _cmd_kueue(args: argparse.Namespace) -> int:
    from topokeeper.contract.operator_files import write_files  # noqa: PLC0415
    from topokeeper.kueue.drift import render_drift  # noqa: PLC0415
    from topokeeper.kueue.fleet import render_mermaid, render_table  # noqa: PLC0415
    from topokeeper.kueue.objects import render_kueue  # noqa: PLC0415

    inputs = load_inputs(args.snapshot, args.nodes, args.cluster)
    plan = inputs.plan()
    findings = inputs.drift(plan)
    files = render_kueue(plan, args.queue)
    files["layers.mmd"] = render_mermaid(plan.fleet)
    files["labels.txt"] = render_table(plan.fleet) + _short_nodes(plan) + render_drift(findings)
    write_files(args.out, files)
    for name in sorted(files):
        print(f"wrote {args.out / name}")
    for flavor in plan.flavors:
        print(f"flavor {flavor.name}: {len(flavor.nodes)} nodes, topology {flavor.topology or '-'}")
    if findings:
        print(f"label drift: {len(findings)} findings (see {args.out / 'labels.txt'})")
    for warning in (*inputs.warnings, *plan.warnings):
        print(f"warning: {warning}")
    return EXIT_OK


def _add_inputs(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--snapshot", type=Path, help="snapshot JSON of AWS responses (DescribeInstanceTopology facts)")
    parser.add_argument("--cluster", help="read an EKS-orchestrated HyperPod cluster from AWS instead of --snapshot")
    add_endpoint_option(parser, argparse.SUPPRESS)  # with --cluster, also after the subcommand
    parser.add_argument("--nodes", type=Path, help="`kubectl get nodes -o json` output (the labels as they are)")


def register(commands: Any) -> None:
    kueue = commands.add_parser("kueue", help="Kueue Topologies, ResourceFlavors and example jobs for an EKS cluster")
    _add_inputs(kueue)
    kueue.add_argument("--out", type=Path, required=True, help="directory for the YAML files and README.md")
    kueue.add_argument("--queue", default="user-queue", help="LocalQueue the example jobs name (default user-queue)")
    kueue.set_defaults(run=_cmd_kueue)
    labels = commands.add_parser("labels", help="which nodes share which network layer, and label drift")
    _add_inputs(labels)
    output = labels.add_mutually_exclusive_group()
    output.add_argument("--json", action="store_true", help="print JSON")
    output.add_argument("--mermaid", action="store_true", help="print the Mermaid layer map")
    labels.set_defaults(run=_cmd_labels)
