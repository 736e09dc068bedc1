"""``topokeeper simulate`` and ``topokeeper demo``: the scenario simulator from the command line."""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

from topokeeper.operator_files import prepare_out_dir
from topokeeper.sim.scenario import load_scenario

SCENARIOS = Path(__file__).resolve().parent / "scenarios"
DEMO_SCENARIO = SCENARIOS / "demo.yaml"


class _Story(logging.Handler):
    """The world's timeline, as readable lines on stderr while it plays."""

    def emit(self, record: logging.LogRecord) -> None:
        sys.stderr.write(self.format(record) + "\n")


def _quiet_libraries() -> None:
    for name in ("werkzeug", "botocore", "boto3", "urllib3", "moto"):
        logging.getLogger(name).setLevel(logging.WARNING)
    # The functions log JSON for CloudWatch; on a terminal the timeline says the same in one line.
    logging.getLogger("topokeeper").setLevel(logging.WARNING)
    logging.getLogger("topokeeper.sim").setLevel(logging.INFO)


def _print_step(step: Any, show: bool) -> None:
    converged = {True: "yes", False: "NO", None: "n/a (verify mode)"}[step.converged]
    seconds = f" in {step.convergence_seconds:.1f}s" if step.convergence_seconds is not None else ""
    print(
        f"== {step.step}: t={step.started_at:.0f}s..{step.ended_at:.0f}s  events {step.events_sent}"
        f" (lost {step.events_lost}, duplicated {step.events_duplicated})  reconciles {step.reconciles}"
        f"  head-node writes {step.head_node_writes}  AWS calls {sum(step.aws_calls.values())}"
        f"  converged {converged}{seconds}  drift {step.drift if step.drift is not None else '-'}"
        f"  alarm {'raised, now ' if step.alarm_raised else ''}{step.alarm}"
    )
    latency = step.node_latency_seconds
    if latency is not None and latency.max is not None:
        print(
            f"   node to live topology: {latency.nodes} nodes, p50 {latency.p50:.1f}s, max {latency.max:.1f}s"
            f" ({latency.slowest}), not placed yet {latency.unplaced}"
        )
    if not show:
        return
    for record in step.audit_records:
        print(
            f"   UpdatePartitionTopology {record['partition']:<12} {record['reason']:<12} {record['outcome']:<8}"
            f" {record['kind']:<5} nodes {record['node_count']:>4} +{record['nodes_added_count']}"
            f"/-{record['nodes_removed_count']}  {str(record['before_sha256'] or '-')[:12]}"
            f" -> {record['after_sha256'][:12]}"
        )
    for partition, text in sorted(step.live_topology.items()):
        lines = text.splitlines() or ["(flat: no switches or blocks)"]
        print(f"   scontrol show topology ({partition}):")
        for line in lines[:12]:
            print(f"     {line[:150]}")
        if len(lines) > 12:
            print(f"     ... {len(lines) - 12} more lines")


def run(scenario_path: Path, out: Path, *, show: bool, baseline: str | None = None) -> int:
    # Bad input is refused before anything loads or starts (choosing the head node may start a chroot).
    scenario = load_scenario(scenario_path)
    prepare_out_dir(out)
    # The functions log JSON for CloudWatch; here the story prints the same in readable lines.
    os.environ.setdefault("POWERTOOLS_LOG_LEVEL", "WARNING")
    # Imported here, not at the top: the simulator needs moto (the sim extra), which plan and show do not.
    from topokeeper.sim.head_node import choose_head_node  # noqa: PLC0415
    from topokeeper.sim.lambda_host import functions_dir  # noqa: PLC0415
    from topokeeper.sim.report import write_report  # noqa: PLC0415
    from topokeeper.sim.simulator import simulate, write_result  # noqa: PLC0415
    from topokeeper.sim.slurm_chroot import HarnessError  # noqa: PLC0415

    try:
        functions_dir()
        head_node = choose_head_node()
    except HarnessError as error:
        print(f"topokeeper: {error}", file=sys.stderr)
        return 1
    if head_node.note:
        print(f"topokeeper: {head_node.note}", file=sys.stderr)
    _quiet_libraries()
    handler = _Story()
    handler.setFormatter(logging.Formatter("%(message)s"))
    story = logging.getLogger("topokeeper.sim")
    story.addHandler(handler)
    story.propagate = False  # not also through the functions' JSON handler on the parent logger
    started = time.monotonic()
    try:
        result = simulate(
            scenario,
            progress=lambda message: print(f"-- {message}", file=sys.stderr),
            head_node=head_node.kind,
            baseline="full-rescan" if baseline == "full-rescan" else None,
        )
    finally:
        story.removeHandler(handler)
        story.propagate = True
    for step in result.steps:
        _print_step(step, show)
    outputs = [write_result(result, out), write_report(result, out)]
    totals = result.totals
    print(
        f"{scenario.cluster.name}: {totals['simulated_seconds']:.0f}s simulated in {time.monotonic() - started:.1f}s,"
        f" {totals['head_node_writes']} head-node writes, {totals['audit_records']} audit records,"
        f" converged: {totals['converged']}"
    )
    for output in outputs:
        print(f"wrote {output}")
    return 0 if totals["converged"] is not False else 1


def _cmd_simulate(args: argparse.Namespace) -> int:
    return run(args.scenario, args.out, show=args.show, baseline=args.baseline)


def _cmd_demo(args: argparse.Namespace) -> int:
    return run(DEMO_SCENARIO, args.out, show=True)


def register(commands: Any) -> None:
    simulate = commands.add_parser(
        "simulate",
        help="play a scenario against emulated AWS and a real slurmctld (a file-only stand-in where it cannot run)",
    )
    simulate.add_argument("--scenario", type=Path, required=True, help="scenario YAML")
    simulate.add_argument("--out", type=Path, required=True, help="directory for result.json and report.html")
    simulate.add_argument("--show", action="store_true", help="print live topology and audit records per step")
    simulate.add_argument(
        "--baseline",
        choices=["full-rescan"],
        help="play it as the public generators would: rescan, rewrite and reconfigure on every event",
    )
    simulate.set_defaults(run=_cmd_simulate)
    demo = commands.add_parser("demo", help="the demo story (simulate the embedded demo scenario)")
    demo.add_argument("--out", type=Path, default=Path("out/demo"), help="directory for the report")
    demo.set_defaults(run=_cmd_demo)
