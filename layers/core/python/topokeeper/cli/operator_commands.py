"""Operator commands against a real account (or the emulator via ``--endpoint-url``): snapshot, diff,
apply, drift, audit. They build the same ``Runtime`` as the Lambdas and call the same services."""

from __future__ import annotations

import argparse
import difflib
import json
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from topokeeper.adapters.aws import client
from topokeeper.adapters.ec2 import Ec2ClusterFacts, InstanceTopologyReader, LocalRateLimiter, MemoryNodeFactsCache
from topokeeper.adapters.hyperpod import HyperPodFacts
from topokeeper.adapters.metrics import NoMetrics
from topokeeper.adapters.ssm_channel import SsmChannel
from topokeeper.cli.options import add_endpoint_option
from topokeeper.contract.config import PARALLELCLUSTER_DISCOVERY, ClusterConfig, Ec2Discovery, Mode, Orchestrator
from topokeeper.contract.deployment import Deployment, read_deployment
from topokeeper.contract.errors import InputError
from topokeeper.contract.operator_files import check_out_file, read_mapping, write_text_file
from topokeeper.contract.ports import FactsSource, Outcome, ReconcileRequest, Trigger
from topokeeper.engine.snapshot import parse_scontrol_nodes, with_node_table
from topokeeper.render.bundle import Bundle
from topokeeper.render.narrate import record_text
from topokeeper.service.controller import check_drift, reconcile
from topokeeper.service.reconcile import plan_cluster
from topokeeper.service.signing import for_reading
from topokeeper.wiring.runtime import Runtime

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT, EXIT_DRIFT = 0, 1, 2, 3


@contextmanager
def progress(message: str) -> Iterator[None]:
    """A ticking status line on stderr while something slow runs (only on a terminal)."""
    if not sys.stderr.isatty():
        yield
        return
    done = threading.Event()
    started = time.monotonic()

    def tick() -> None:
        while not done.wait(0.5):
            sys.stderr.write(f"\r{message} ... {time.monotonic() - started:4.0f}s")
            sys.stderr.flush()

    ticker = threading.Thread(target=tick, daemon=True)
    ticker.start()
    try:
        yield
    finally:
        done.set()
        ticker.join()
        sys.stderr.write(f"\r{message} ... done in {time.monotonic() - started:.1f}s\n")


def _color(text: str, code: str, enabled: bool) -> str:
    return f"\033[{code}m{text}\033[0m" if enabled else text


def deployment_from_args(args: argparse.Namespace) -> Deployment:
    """The deployment ``--deployment FILE`` or ``--stack-name NAME`` names (the operator commands and preflight)."""
    if args.deployment:
        return read_deployment(args.deployment)
    if args.stack_name:
        return Deployment.from_stack(client("cloudformation"), client("lambda"), args.stack_name)
    raise InputError("--deployment", "give --deployment FILE or --stack-name NAME")


def _runtime_and_cluster(args: argparse.Namespace) -> tuple[Runtime, ClusterConfig]:
    deployment = deployment_from_args(args)
    cluster = deployment.settings.cluster(args.cluster)
    if cluster is None:
        raise InputError("--cluster", f"{args.cluster} is not managed by this deployment")
    return Runtime.from_environment(deployment.environment(), metrics=NoMetrics()), cluster


def _emit(args: argparse.Namespace, document: Any, human: Callable[[], str]) -> None:
    print(json.dumps(document, indent=2, default=str) if args.json else human())


def _snapshot_source(args: argparse.Namespace) -> tuple[FactsSource, Orchestrator, Ec2Discovery]:
    """Where ``snapshot`` reads: the deployment's cluster as configured, else the options."""
    chosen = Orchestrator(args.orchestrator) if args.orchestrator else None
    if args.parallelcluster and chosen not in (None, Orchestrator.EC2):
        raise InputError("--parallelcluster", f"ParallelCluster is Slurm on EC2: not with --orchestrator {chosen}")
    if args.deployment or args.stack_name:
        if args.parallelcluster or chosen:
            flag = "--parallelcluster" if args.parallelcluster else "--orchestrator"
            raise InputError(flag, "with a deployment its config says how to find the cluster (orchestrator, ec2)")
        runtime, cluster = _runtime_and_cluster(args)
        return runtime.facts(cluster), cluster.orchestrator, cluster.ec2
    reader = InstanceTopologyReader(
        client("ec2"), MemoryNodeFactsCache(), LocalRateLimiter(), lambda: datetime.now(UTC)
    )
    if args.parallelcluster or chosen is Orchestrator.EC2:
        discovery = PARALLELCLUSTER_DISCOVERY if args.parallelcluster else Ec2Discovery()
        return Ec2ClusterFacts(client("ec2"), reader, discovery), Orchestrator.EC2, discovery
    return HyperPodFacts(client("sagemaker"), client("s3"), reader), chosen or Orchestrator.HYPERPOD, Ec2Discovery()


def _nothing_tagged(cluster: str, discovery: Ec2Discovery) -> InputError:
    region = client("ec2").meta.region_name
    hint = "" if discovery.cluster_tag != Ec2Discovery().cluster_tag else "; ParallelCluster's tags: --parallelcluster"
    return InputError("--cluster", f"no EC2 instance in {region} has the tag {discovery.cluster_tag}={cluster}{hint}")


def cmd_snapshot(args: argparse.Namespace) -> int:
    if args.out:
        check_out_file(args.out)
    # Read first: a wrong file is told before AWS is asked anything.
    table = (
        parse_scontrol_nodes(read_mapping(args.slurm_nodes, "--slurm-nodes"), "--slurm-nodes")
        if args.slurm_nodes
        else None
    )
    facts, orchestrator, discovery = _snapshot_source(args)
    with progress(f"reading {args.cluster} from AWS"):
        snapshot = facts.read(args.cluster)
    if orchestrator is Orchestrator.EC2 and not snapshot.nodes:
        raise _nothing_tagged(args.cluster, discovery)
    if table is not None:
        snapshot = with_node_table(snapshot, table.nodes, table.version)
    text = json.dumps(snapshot.model_dump(mode="json", exclude_none=True), indent=2, sort_keys=True) + "\n"
    if args.out:
        write_text_file(args.out, text)
        named = f", named from {len(table.nodes)} Slurm nodes" if table is not None else ""
        print(f"wrote {args.out}: {len(snapshot.nodes)} nodes, {len(snapshot.instance_topology)} with topology{named}")
        if orchestrator is Orchestrator.EC2 and table is None:
            print(
                "nodes are named by host name: for slurmctld's names (ParallelCluster's q1-st-p5-1), add"
                " --slurm-nodes FILE, the output of `scontrol show nodes --json` on the head node"
            )
    else:
        sys.stdout.write(text)
    return EXIT_OK


def _topology_text(bundle: Bundle | None) -> list[str]:
    if bundle is None:
        return []
    lines = [line for file in bundle.files.values() for line in file.content.splitlines()]
    return lines + [f"# Topology= {p}: {t or '(none)'}" for p, t in sorted(bundle.partitions.items())]


def cmd_diff(args: argparse.Namespace) -> int:
    runtime, cluster = _runtime_and_cluster(args)
    state = runtime.state.get(cluster.name)
    with progress("planning from AWS"):
        desired = plan_cluster(cluster, state, runtime.facts(cluster))
    applied = runtime.plans.bundle(cluster.name, state.applied_sha256) if state.applied_sha256 else None
    with progress("reading the live topology from the head node"):
        live = runtime.channel(cluster).verify(
            for_reading(desired.bundle, state.bundle_generation, runtime.signer, runtime.clock.now())
        )
    color = sys.stdout.isatty() and not args.json
    diff = list(
        difflib.unified_diff(
            _topology_text(applied), _topology_text(desired.bundle), "last applied", "desired", lineterm=""
        )
    )
    document = {
        "cluster": cluster.name,
        "desired_sha256": desired.sha256,
        "applied_sha256": state.applied_sha256,
        "live": live.model_dump(mode="json"),
        "diff": diff,
    }

    def human() -> str:
        colored = [
            _color(line, "32", color)
            if line.startswith("+")
            else _color(line, "31", color)
            if line.startswith("-")
            else line
            for line in diff
        ]
        live_line = f"live:    {live.outcome.value}" + (f" ({live.error})" if live.error else "")
        for item in live.drift[:20]:
            live_line += f"\n  drift: {item.get('what')} {item.get('name', '')} {item.get('detail', '')}"
        return "\n".join(
            [
                f"desired: {desired.sha256[:12]} ({cluster.effective_mode.value} mode)",
                f"applied: {(state.applied_sha256 or 'nothing yet')[:12]}",
                live_line,
                *(colored or ["(desired equals last applied)"]),
            ]
        )

    _emit(args, document, human)
    return EXIT_DRIFT if diff or live.outcome is Outcome.DRIFT else EXIT_OK


def cmd_apply(args: argparse.Namespace) -> int:
    runtime, cluster = _runtime_and_cluster(args)
    if cluster.effective_mode is Mode.VERIFY and not args.dry_run:
        raise InputError("--cluster", f"{cluster.name} is in verify mode: topokeeper does not write to it")
    state = runtime.state.get(cluster.name)
    if args.dry_run:
        with progress("planning from AWS"):
            desired = plan_cluster(cluster, state, runtime.facts(cluster))
        channel = runtime.channel(cluster)
        if not isinstance(channel, SsmChannel):
            raise InputError("--dry-run", "the head-node agent runs dry-runs only locally: use diff instead")
        with progress("dry-run on the head node"):
            result = channel.run(
                for_reading(desired.bundle, state.bundle_generation, runtime.signer, runtime.clock.now()), "dry-run"
            )
        _emit(args, result.model_dump(mode="json"), lambda: str(result.diff or result.outcome.value))
        return EXIT_OK if result.outcome in (Outcome.WOULD_APPLY, Outcome.UNCHANGED) else EXIT_FAILED
    now = runtime.clock.now()
    trigger = Trigger(
        source="topokeeper",
        detail_type="Operator Apply",
        event_id=f"operator-{now.isoformat()}",
        time=now,
        summary=f"topokeeper apply by {os.environ.get('USER', 'operator')}",
    )
    generation = runtime.state.record_change(cluster.name, trigger, now).generation
    deps = runtime.reconcile_deps()
    # An operator asked now: no debounce, but never overlap a delivery in flight.
    deps.settings = deps.settings.model_copy(update={"debounce_seconds": 0, "min_write_interval_seconds": 0})
    with progress("reconciling"):
        report = reconcile(ReconcileRequest(cluster=cluster.name, generation=generation, reason="operator"), deps)
    if report.defer_seconds is not None:
        print(f"not now: {report.reason}; try again in {report.defer_seconds:.0f}s", file=sys.stderr)
        return EXIT_FAILED
    _emit(
        args,
        report.model_dump(mode="json"),
        lambda: (
            f"{report.action}: plan {report.plan_sha256 or '-'}"
            + (f", delivery {report.delivery_reference}" if report.delivery_reference else "")
        ),
    )
    return EXIT_OK


def cmd_drift(args: argparse.Namespace) -> int:
    runtime, cluster = _runtime_and_cluster(args)
    with progress("checking drift"):
        report = check_drift(cluster, runtime.drift_deps())
    _emit(
        args,
        report.model_dump(mode="json"),
        lambda: (
            f"{cluster.name}: live {report.live}, AWS {report.aws}, "
            f"TopologyDrift={report.drift if report.drift is not None else 'unknown'}, action {report.action}"
        ),
    )
    return EXIT_DRIFT if report.drift == 1 else EXIT_OK


# ``topokeeper audit --kind``: each kind of record has its own history.
AUDIT_KINDS = {
    "partition": "UpdatePartitionTopology",
    "kueue": "UpdateKueueTopology",
    "login": "UpdateLoginTargets",
    "login-install": "InstallLoginHostIdentity",
}


def cmd_audit(args: argparse.Namespace) -> int:
    runtime, cluster = _runtime_and_cluster(args)
    records = runtime.audit.history(cluster.name, args.limit, event_name=AUDIT_KINDS[args.kind])
    if args.kind != "partition":  # the other kinds have their own fields: JSON lines
        _emit(args, records, lambda: "\n".join(json.dumps(r, sort_keys=True) for r in records))
        return EXIT_OK

    def human() -> str:
        rows = [("COMPLETED", "PARTITION", "KIND", "OUTCOME", "NODES", "+/-/~MOVED", "SHA256", "CHANNEL")]
        for r in records:
            rows.append(
                (
                    r["completed_at"][:19],
                    r["partition"],
                    r["kind"],
                    r["outcome"],
                    str(r["node_count"]),
                    f"+{r['nodes_added_count']}/-{r['nodes_removed_count']}/~{r.get('nodes_moved_count', 0)}",
                    r["after_sha256"][:12],
                    r["channel"],
                )
            )
        widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
        lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in rows]
        return "\n".join(lines + [f"{r['completed_at'][:19]}  {record_text(r)}" for r in records])

    _emit(args, records, human)
    return EXIT_OK


def register(commands: Any) -> None:
    """Add the operator subcommands to the ``topokeeper`` parser."""

    def common(parser: argparse.ArgumentParser, deployment: bool = True) -> None:
        parser.add_argument("--cluster", required=True, help="cluster name (or ARN)")
        # Also after the subcommand; SUPPRESS keeps a value given before it.
        add_endpoint_option(parser, argparse.SUPPRESS)
        parser.add_argument("--json", action="store_true", help="machine-readable output")
        if deployment:
            group = parser.add_mutually_exclusive_group()
            group.add_argument("--stack-name", help="the deployed topokeeper stack")
            group.add_argument("--deployment", type=Path, help="deployment JSON (the simulator writes one)")

    snapshot = commands.add_parser("snapshot", help="write a snapshot file from live AWS APIs")
    common(snapshot)
    snapshot.add_argument("--out", type=Path, help="file to write (default: stdout)")
    snapshot.add_argument(
        "--orchestrator", choices=[o.value for o in Orchestrator], help="default: hyperpod (ec2 with --parallelcluster)"
    )
    snapshot.add_argument(
        "--parallelcluster",
        action="store_true",
        help="Slurm on EC2 found by ParallelCluster's tags (parallelcluster:cluster-name, parallelcluster:queue-name)",
    )
    snapshot.add_argument(
        "--slurm-nodes",
        type=Path,
        metavar="FILE",
        help="the head node's `scontrol show nodes --json`: nodes named as slurmctld names them (ParallelCluster)",
    )
    snapshot.set_defaults(run=cmd_snapshot)

    for name, run, text in (
        ("diff", cmd_diff, "desired vs last applied vs live"),
        ("drift", cmd_drift, "check drift now (exit 3 on drift)"),
        ("audit", cmd_audit, "UpdatePartitionTopology history, newest first"),
        ("apply", cmd_apply, "reconcile now (or --dry-run on the head node)"),
    ):
        parser = commands.add_parser(name, help=text)
        common(parser)
        if name == "apply":
            parser.add_argument("--dry-run", action="store_true", help="show what would change; change nothing")
        if name == "audit":
            parser.add_argument("--limit", type=int, default=50)
            parser.add_argument("--kind", choices=sorted(AUDIT_KINDS), default="partition", help="which records")
        parser.set_defaults(run=run)  # cli.main turns a missing region or credentials into one line
