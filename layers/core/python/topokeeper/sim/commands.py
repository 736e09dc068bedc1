"""``topokeeper simulate`` and ``topokeeper demo``: the scenario simulator from the command line."""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the scenario (pydantic, botocore) and the rest load when a command runs, not for its --help
    from topokeeper.sim.scenario import Scenario

SCENARIOS = Path(__file__).resolve().parent / "scenarios"
DEMO_SCENARIO = SCENARIOS / "demo.yaml"
VERIFY_SCENARIO = SCENARIOS / "verify-mode.yaml"


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


_SHOWN_LINES, _SHOWN_WIDTH = 12, 150  # of scontrol show topology per partition and step


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
    for entry in step.timeline:
        # What HyperPod did itself and what topokeeper's verify compared and concluded (verify mode's story;
        # drift lines are in the story already).
        if entry["kind"] in ("hyperpod", "bug", "verify"):
            print(f"   t={entry['t']:.0f}s {entry['kind']}: {entry['text']}")
    if step.kueue is not None:
        _print_kueue(step.kueue, show)
    if step.login is not None:
        login = step.login
        targets = ", ".join(f"{ip} {state}" for ip, state in login.targets.items()) or "none"
        print(f"   login endpoint {'in sync' if login.in_sync else 'NOT in sync'}: targets {targets}")
        for record in login.audit_records:
            print(
                f"   UpdateLoginTargets registered {', '.join(record['registered']) or '-'}"
                f" deregistered {', '.join(record['deregistered']) or '-'} -> {record['target_count']} targets"
            )
    latency = step.node_latency_seconds
    if latency is not None and latency.max is not None:
        print(
            f"   node to live topology: {latency.nodes} nodes, p50 {latency.p50:.1f}s, max {latency.max:.1f}s"
            f" ({latency.slowest}), not placed yet {latency.unplaced}"
        )
    if not show:
        return
    from topokeeper.render.narrate import cut, record_text  # noqa: PLC0415

    for record in step.audit_records:
        print(
            f"   UpdatePartitionTopology {str(record['before_sha256'] or '-')[:12]} -> {record['after_sha256'][:12]}"
            f" {record_text(record)}"
        )
    for partition, text in sorted(step.live_topology.items()):
        lines = text.splitlines() or ["(flat: no switches or blocks)"]
        print(f"   scontrol show topology ({partition}):")
        for line in lines[:_SHOWN_LINES]:
            print(f"     {cut(line, _SHOWN_WIDTH)}")
        if len(lines) > _SHOWN_LINES:
            print(f"     [... {len(lines) - _SHOWN_LINES} more lines: result.json has them all]")


def _print_kueue(kueue: Any, show: bool) -> None:
    alarm = f"{'raised, now ' if kueue.alarm_raised else ''}{kueue.alarm}"
    print(f"   NodesWithoutTopologyData peak {kueue.nodes_without_topology_data}  alarm {alarm}")
    for record in kueue.audit_records:
        print(
            f"   UpdateKueueTopology {str(record['previous_plan_sha256'] or '-')[:12]} -> {record['plan_sha256'][:12]}"
            f" nodes {record['node_count']:>4} +{record['nodes_added_count']}/-{record['nodes_removed_count']}"
            f" relabeled {record['nodes_relabeled_count']}"
            f" without topology {record['nodes_without_topology_data_count']}"
            f"  changed: {', '.join(record['objects_changed']) or '-'}"
        )
    if show:
        print("   published kueue-topology.yaml:")
        print("\n".join(f"     {line}" for line in kueue.topology_yaml.splitlines()))
        print("\n".join(f"   {line}" for line in kueue.labels_table.splitlines()))


def _prepare(scenario_path: Path, out: Path) -> tuple[Scenario, str | None]:
    """The scenario and the head node kind ("chroot" or "file"), or None when it cannot run (said on stderr).
    Bad input is refused before anything loads or starts (choosing the head node may start a chroot)."""
    from topokeeper.contract.operator_files import prepare_out_dir  # noqa: PLC0415
    from topokeeper.sim.scenario import load_scenario  # noqa: PLC0415

    scenario = load_scenario(scenario_path)
    prepare_out_dir(out)
    # The functions log JSON for CloudWatch; here the story prints the same in readable lines.
    os.environ.setdefault("POWERTOOLS_LOG_LEVEL", "WARNING")
    # Imported here, not at the top: the simulator needs moto (the sim extra), which plan and show do not.
    from topokeeper.sim.head_node import choose_head_node  # noqa: PLC0415
    from topokeeper.sim.lambda_host import functions_dir  # noqa: PLC0415
    from topokeeper.sim.parallelcluster import NEEDS_SLURMCTLD  # noqa: PLC0415
    from topokeeper.sim.slurm_chroot import HarnessError  # noqa: PLC0415

    try:
        functions_dir()
        head_node = choose_head_node()
        if head_node.kind == "file" and scenario.cluster.orchestrator == "parallelcluster":
            raise HarnessError(f"{NEEDS_SLURMCTLD} ({head_node.note})")
    except HarnessError as error:
        print(f"topokeeper: {error}", file=sys.stderr)
        return scenario, None
    if head_node.note:
        print(f"topokeeper: {head_node.note}", file=sys.stderr)
    _quiet_libraries()
    return scenario, head_node.kind


@contextlib.contextmanager
def _story_on_stderr() -> Iterator[None]:
    handler = _Story()
    handler.setFormatter(logging.Formatter("%(message)s"))
    story = logging.getLogger("topokeeper.sim")
    story.addHandler(handler)
    story.propagate = False  # not also through the functions' JSON handler on the parent logger
    try:
        yield
    finally:
        story.removeHandler(handler)
        story.propagate = True


def run(scenario_path: Path, out: Path, *, show: bool, as_json: bool = False, baseline: str | None = None) -> int:
    """Play a scenario; with ``as_json`` stdout is one JSON document (``{"written": [...], "result": {...}}``,
    the result as result.json holds it) and the story stays on stderr; ``baseline`` "full-rescan" plays it as
    the public generators would."""
    scenario, head_node = _prepare(scenario_path, out)
    if head_node is None:
        return 1
    from topokeeper.sim.report import write_report  # noqa: PLC0415 (moto: see _prepare)
    from topokeeper.sim.simulator import simulate, write_result  # noqa: PLC0415

    started = time.monotonic()
    with _story_on_stderr():
        result = simulate(
            scenario,
            progress=lambda message: print(f"-- {message}", file=sys.stderr),
            head_node=head_node,
            on_step=(lambda _: None) if as_json else (lambda step: _print_step(step, show)),
            baseline="full-rescan" if baseline == "full-rescan" else None,
        )
    outputs = [write_result(result, out), write_report(result, out)]
    totals = result.totals
    if as_json:
        document = {"written": [str(path) for path in outputs], "result": result.model_dump(mode="json")}
        print(json.dumps(document, indent=2))
        return 0 if totals["converged"] is not False else 1
    print(
        f"{scenario.cluster.name}: {totals['simulated_seconds']:.0f}s simulated in {time.monotonic() - started:.1f}s,"
        f" {totals['head_node_writes']} head-node writes, {totals['audit_records']} audit records,"
        f" converged: {totals['converged']}"
    )
    for output in outputs:
        print(f"wrote {output}")
    return 0 if totals["converged"] is not False else 1


def _cmd_simulate(args: argparse.Namespace) -> int:
    return run(args.scenario, args.out, show=args.show, as_json=args.json, baseline=args.baseline)


def run_emulator(scenario_path: Path, out: Path) -> int:
    """``topokeeper emulator``: the scenario's cluster created and its first plan applied on emulated AWS and a
    head node, then kept running (its clock in step with the wall clock) for the operator CLI until SIGINT or
    SIGTERM. SSM commands run on the head node at once."""
    scenario, head_node = _prepare(scenario_path, out)
    if head_node is None:
        return 1
    from topokeeper.sim.world import running  # noqa: PLC0415 (moto: see _prepare)

    stop = threading.Event()
    for number in (signal.SIGINT, signal.SIGTERM):
        signal.signal(number, lambda *_: stop.set())
    with _story_on_stderr(), running(scenario, head_node=head_node) as world:
        world.settle()
        world.ssm_synchronous = True  # the CLI waits in real time, outside simulated time
        deployment = out / "deployment.json"
        deployment.write_text(world.stack.deployment.model_dump_json(indent=2) + "\n")
        environment = " ".join(f"{key}={value}" for key, value in sorted(world.emulator.env().items()))
        name = world.cluster.name
        print(f"emulated AWS at {world.emulator.endpoint_url}: cluster {name}, head node {world.head_node_id}")
        print(f"  ({world.head.description}), plan {str(world.runtime.state.get(name).applied_sha256)[:12]} applied")
        print(f"wrote {deployment}")
        print(f"in another shell:\n  export {environment}")
        print(f"  topokeeper audit --cluster {name} --deployment {deployment}")
        print("Ctrl-C stops the emulator.", flush=True)
        while not stop.wait(_TICK_SECONDS):
            world.clock.advance(_TICK_SECONDS)  # DescribeInstanceTopology's token bucket refills as in AWS
    return 0


_TICK_SECONDS = 0.5


def _cmd_emulator(args: argparse.Namespace) -> int:
    return run_emulator(args.scenario, args.out)


def _cmd_demo(args: argparse.Namespace) -> int:
    return run(VERIFY_SCENARIO if args.mode == "verify" else DEMO_SCENARIO, args.out, show=True)


def register(commands: Any) -> None:
    simulate = commands.add_parser(
        "simulate",
        help="play a scenario against emulated AWS and a real slurmctld (a file-only stand-in where it cannot run)",
    )
    simulate.add_argument("--scenario", type=Path, required=True, help="scenario YAML")
    simulate.add_argument("--out", type=Path, required=True, help="directory for result.json and report.html")
    simulate.add_argument("--show", action="store_true", help="print live topology and audit records per step")
    simulate.add_argument(
        "--json", action="store_true", help='print {"written": [paths], "result": result.json\'s document} instead'
    )
    simulate.add_argument(
        "--baseline",
        choices=["full-rescan"],
        help="play it as the public generators would: rescan, rewrite and reconfigure on every event",
    )
    simulate.set_defaults(run=_cmd_simulate)
    demo = commands.add_parser("demo", help="the demo story (simulate the embedded demo scenario)")
    demo.add_argument("--out", type=Path, default=Path("out/demo"), help="directory for the report")
    demo.add_argument(
        "--mode",
        choices=("enforce", "verify"),
        default="enforce",
        help="enforce: topokeeper writes the topology; verify: HyperPod writes it (emulated), topokeeper verifies",
    )
    demo.set_defaults(run=_cmd_demo)
    emulator = commands.add_parser(
        "emulator", help="emulated AWS with a deployed stack and a cluster, for the operator CLI (until Ctrl-C)"
    )
    emulator.add_argument(
        "--scenario", type=Path, default=DEMO_SCENARIO, help="the cluster to create (default: the demo's)"
    )
    emulator.add_argument("--out", type=Path, default=Path("out/emulator"), help="directory for deployment.json")
    emulator.set_defaults(run=_cmd_emulator)
