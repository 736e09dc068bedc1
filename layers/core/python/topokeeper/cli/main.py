"""The ``topokeeper`` command line."""

from __future__ import annotations

import argparse
import atexit
import contextlib
import gc
import importlib
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

from topokeeper.cli.options import add_endpoint_option, apply_endpoint_option
from topokeeper.contract.errors import InputError

EXIT_OK = 0
EXIT_BAD_INPUT = 2
EXIT_FLUSH_FAILED = 120  # as Python exits when flushing its output fails
# Commands that plan from a file: run without cycle collection, outside botocore's error translation.
PLANNING_COMMANDS = frozenset({"plan", "show", "head-node-program", "hostfile", "nccl-check", "placement"})
_MAIN = "topokeeper.cli.main"
# Every command: the function that registers it ("module:function", called with the subparsers; it registers all
# the commands it is named for here) and its line in ``topokeeper --help``. Only the module of the command run is
# imported: all of them load pydantic, boto3 and moto (~0.5 s). A new command is one line here;
# tests/unit/test_cli_imports.py checks each line against what its function registers.
COMMANDS: dict[str, tuple[str, str]] = {
    "plan": (f"{_MAIN}:register_plan", "plan and render the topology files"),
    "show": (f"{_MAIN}:register_plan", "print the plan table only"),
    "head-node-program": (
        f"{_MAIN}:register_head_node_program",
        "write the head-node program (topokeeper-head-node.pyz) and print its sha256",
    ),
    "hostfile": (
        f"{_MAIN}:register_hostfile",
        "a job's nodes in topology order (each leaf or block together), for a host file or rank map",
    ),
    "nccl-check": (
        f"{_MAIN}:register_nccl_check",
        "write an all_reduce_perf sbatch script per leaf and block; --results: flag the slow ones",
    ),
    "placement": (
        f"{_MAIN}:register_placement",
        "where jobs landed, the largest job one leaf or block can start now, why a job waits",
    ),
    "snapshot": ("topokeeper.cli.operator_commands:register", "write a snapshot file from live AWS APIs"),
    "diff": ("topokeeper.cli.operator_commands:register", "desired vs last applied vs live"),
    "drift": ("topokeeper.cli.operator_commands:register", "check drift now (exit 3 on drift)"),
    "audit": ("topokeeper.cli.operator_commands:register", "UpdatePartitionTopology history, newest first"),
    "apply": ("topokeeper.cli.operator_commands:register", "reconcile now (or --dry-run on the head node)"),
    "preflight": ("topokeeper.cli.preflight:register", "read-only checks of the account before deploying"),
    "cost": ("topokeeper.cli.cost:register", "the monthly cost of a synthesized stack (make synth writes it)"),
    "verify": (
        "topokeeper.cli.readonly_commands:register",
        "read-only, before deploying: plan from a snapshot, then the head node's dry-run diff and live verify",
    ),
    "agent": ("topokeeper.cli.agent_install:add_agent_commands", "the head-node pull agent (HyperPod)"),
    "simulate": (
        "topokeeper.sim.commands:register",
        "play a scenario against emulated AWS and a real slurmctld (a file-only stand-in where it cannot run)",
    ),
    "demo": ("topokeeper.sim.commands:register", "the demo story (simulate the embedded demo scenario)"),
    "emulator": (
        "topokeeper.sim.commands:register",
        "emulated AWS with a deployed stack and a cluster, for the operator CLI (until Ctrl-C)",
    ),
    "kueue": (
        "topokeeper.cli.kueue_commands:register",
        "Kueue Topologies, ResourceFlavors and example jobs for an EKS cluster",
    ),
    "labels": ("topokeeper.cli.kueue_commands:register", "which nodes share which network layer, and label drift"),
    "login": ("topokeeper.cli.login_commands:register", "the login endpoint's single SSH host identity"),
}
ALL = "*"  # build_parser: every command registered


def _cmd_plan(args: argparse.Namespace) -> int:
    from topokeeper.cli.planning import plan_from_files, plan_table  # noqa: PLC0415 (pydantic: see COMMANDS)
    from topokeeper.contract.operator_files import write_files  # noqa: PLC0415
    from topokeeper.render.bundle import json_text  # noqa: PLC0415

    rendered = plan_from_files(args.snapshot, args.config, args.slurm_version)
    written = write_files(args.out, rendered.files())
    if args.json:
        print(json_text({"written": [str(path) for path in written], "plan": rendered.plan_document()}), end="")
    else:
        print(plan_table(rendered))
        print("\n".join(f"wrote {path}" for path in written))
    return EXIT_OK


def _cmd_show(args: argparse.Namespace) -> int:
    from topokeeper.cli.planning import plan_from_files, plan_table  # noqa: PLC0415 (pydantic: see COMMANDS)
    from topokeeper.render.bundle import json_text  # noqa: PLC0415
    from topokeeper.render.narrate import leaf_table  # noqa: PLC0415

    rendered = plan_from_files(args.snapshot, args.config, args.slurm_version)
    if args.json:
        print(json_text(rendered.plan_document()), end="")
    else:
        leaves = "\n" + leaf_table(rendered.plan_document()["partitions"]) if args.leaves else ""
        print(plan_table(rendered) + leaves)
    return EXIT_OK


def _cmd_head_node_program(args: argparse.Namespace) -> int:
    """Write the head-node program; print its sha256 as sha256sum does (compare it with HeadNodeProgramSha256)."""
    from topokeeper.contract.head_node_program import program_bytes, program_sha256  # noqa: PLC0415
    from topokeeper.contract.operator_files import check_out_file, write_text_file  # noqa: PLC0415

    check_out_file(args.out)
    write_text_file(args.out, program_bytes())
    print(f"{program_sha256()}  {args.out}")
    return EXIT_OK


def _cmd_hostfile(args: argparse.Namespace) -> int:
    """As the head-node program's ``hostfile`` on a compute node, from saved ``scontrol show topology`` output."""
    from topokeeper.computenode import hostfile  # noqa: PLC0415 (see COMMANDS)

    try:
        units = hostfile.read_topology_file(str(args.topology_file))
        nodes = hostfile.order_hosts(hostfile.job_nodelist(args.nodelist, os.environ), units)
        print(hostfile.render(nodes, args.format), end="")
    except hostfile.HostfileError as error:
        raise InputError("hostfile", str(error)) from None
    return EXIT_OK


def _add_plan_inputs(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--snapshot", type=Path, required=True, help="snapshot JSON of AWS responses")
    parser.add_argument("--config", type=Path, help="per-partition overrides (YAML or JSON)")
    parser.add_argument("--slurm-version", help="e.g. 24.11 or 25.11 (default: the snapshot's, else 25.11)")
    parser.add_argument("--json", action="store_true", help="print the plan document (plan.json) instead of the table")


def _add_command(commands: argparse._SubParsersAction[argparse.ArgumentParser], name: str) -> argparse.ArgumentParser:
    return commands.add_parser(name, help=COMMANDS[name][1])


def register_plan(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    plan_parser = _add_command(commands, "plan")
    _add_plan_inputs(plan_parser)
    plan_parser.add_argument("--out", type=Path, required=True, help="directory for the files")
    plan_parser.set_defaults(run=_cmd_plan)

    show_parser = _add_command(commands, "show")
    _add_plan_inputs(show_parser)
    show_parser.add_argument(
        "--leaves", action="store_true", help="also each leaf switch or block: its size and full hostlist"
    )
    show_parser.set_defaults(run=_cmd_show)


def register_head_node_program(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from topokeeper.contract.head_node_program import PROGRAM_NAME  # noqa: PLC0415

    program_parser = _add_command(commands, "head-node-program")
    program_parser.add_argument("--out", type=Path, required=True, help=f"the file to write, e.g. {PROGRAM_NAME}")
    program_parser.set_defaults(run=_cmd_head_node_program)


def register_hostfile(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from topokeeper.computenode.hostfile import add_arguments  # noqa: PLC0415

    hostfile_parser = _add_command(commands, "hostfile")
    add_arguments(hostfile_parser, live=False)
    hostfile_parser.set_defaults(run=_cmd_hostfile)


def register_nccl_check(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from topokeeper.cli import nccl_check  # noqa: PLC0415

    nccl_parser = _add_command(commands, "nccl-check")
    nccl_check.add_arguments(nccl_parser)
    nccl_parser.set_defaults(run=nccl_check.run)


def register_placement(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from topokeeper.cli import placement  # noqa: PLC0415

    placement_parser = _add_command(commands, "placement")
    placement.add_arguments(placement_parser)
    placement_parser.set_defaults(run=placement.run)


def build_parser(command: str | None = ALL) -> argparse.ArgumentParser:
    """The parser with ``command`` registered by its module (and the commands beside it), every command with
    ``ALL``; the others only listed (their line of ``--help``, parsing nothing)."""
    parser = argparse.ArgumentParser(prog="topokeeper", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    chosen = COMMANDS[command][0] if command in COMMANDS else None
    registered: set[str] = set()
    for name, (registrar, text) in COMMANDS.items():
        if command == ALL or registrar == chosen:
            if registrar not in registered:  # in the table's order: it adds the commands that follow with it
                registered.add(registrar)
                module, _, function = registrar.partition(":")
                getattr(importlib.import_module(module), function)(commands)
        else:
            commands.add_parser(name, help=text, add_help=False)
    add_endpoint_option(parser)
    return parser


def _run_reaching_aws(args: argparse.Namespace) -> int:
    try:
        result: int = args.run(args)
    except Exception:
        if "botocore" not in sys.modules:  # no AWS error without it: an offline run never imports botocore
            raise
        from topokeeper.adapters.aws import aws_setup_errors  # noqa: PLC0415

        with aws_setup_errors():  # a missing region or credentials in one line
            raise
    return result


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # First which command (``--help`` and errors before it end here), then that command's own parser.
    command = build_parser(None).parse_known_args(argv)[0].command
    args = build_parser(command).parse_args(argv)
    planning = args.command in PLANNING_COMMANDS
    apply_endpoint_option(args)
    collecting = gc.isenabled()
    if planning:
        # Planning keeps nearly all it builds (about 20 objects a node) until it returns: the cycle collector's
        # passes over them find nothing and cost a third of the run at 100,000 nodes.
        gc.disable()
    try:
        code: int = args.run(args) if planning else _run_reaching_aws(args)
    except InputError as error:
        print(f"topokeeper: error: {error}", file=sys.stderr)
        return EXIT_BAD_INPUT
    finally:
        if collecting:
            gc.enable()
    return code


# Commands whose process ends without the interpreter's teardown (``end_without_teardown``): a plan of 100,000
# nodes is some two million objects (~0.15 s to free), a simulation the emulator's state and every AWS service
# model it loaded (~1.3 s, a third of a million containers).
ENDED_WITHOUT_TEARDOWN = PLANNING_COMMANDS | {"simulate", "demo"}


def end_without_teardown(code: int) -> NoReturn:
    """End the process as the interpreter's exit would, less freeing what it built (memory the exit returns anyway):
    the exit functions run (temporary directories' finalizers, logging's shutdown), the standard streams are
    flushed, and output that cannot be written is an error, never a success."""
    atexit._run_exitfuncs()  # what sys.exit would run; os._exit runs none
    try:
        for stream in (sys.stdout, sys.stderr):
            if stream is not None:  # None: started with the descriptor closed (print writes nothing)
                stream.flush()
    except OSError as error:
        # The output the flush could not write is dropped with it (a full disk, a reader gone), so no later
        # flush reports it: say so here, with the status the interpreter's own exit gives a failed flush.
        with contextlib.suppress(Exception):
            sys.stderr.write(f"topokeeper: error: cannot write the output: {error.strerror or error}\n")
            sys.stderr.flush()
        os._exit(EXIT_FLUSH_FAILED)
    os._exit(code)


def run() -> NoReturn:
    """The ``topokeeper`` command: ``main``, ended without the interpreter's teardown after the commands that
    build much and hold nothing open at their end (ENDED_WITHOUT_TEARDOWN)."""
    code = main()
    if sys.argv[1:2] and sys.argv[1] in ENDED_WITHOUT_TEARDOWN:
        end_without_teardown(code)
    sys.exit(code)


if __name__ == "__main__":
    run()
