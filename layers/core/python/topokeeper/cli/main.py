"""The ``topokeeper`` command line."""

from __future__ import annotations

import argparse
import atexit
import contextlib
import gc
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

from topokeeper.cli import nccl_check, placement
from topokeeper.cli.options import add_endpoint_option, apply_endpoint_option
from topokeeper.cli.planning import plan_from_files, plan_table
from topokeeper.computenode.hostfile import HostfileError, job_nodelist, order_hosts, read_topology_file, render
from topokeeper.computenode.hostfile import add_arguments as add_hostfile_arguments
from topokeeper.contract.errors import InputError
from topokeeper.contract.head_node_program import PROGRAM_NAME, program_bytes, program_sha256
from topokeeper.contract.operator_files import check_out_file, write_files, write_text_file
from topokeeper.render.bundle import json_text
from topokeeper.render.narrate import leaf_table

EXIT_OK = 0
EXIT_BAD_INPUT = 2
EXIT_FLUSH_FAILED = 120  # as Python exits when flushing its output fails
# Commands that plan from a file: with one of these first, the others (which import botocore, ~0.5 s) stay unloaded.
PLANNING_COMMANDS = frozenset({"plan", "show", "head-node-program", "hostfile", "nccl-check", "placement"})


def _cmd_plan(args: argparse.Namespace) -> int:
    rendered = plan_from_files(args.snapshot, args.config, args.slurm_version)
    written = write_files(args.out, rendered.files())
    if args.json:
        print(json_text({"written": [str(path) for path in written], "plan": rendered.plan_document()}), end="")
    else:
        print(plan_table(rendered))
        print("\n".join(f"wrote {path}" for path in written))
    return EXIT_OK


def _cmd_show(args: argparse.Namespace) -> int:
    rendered = plan_from_files(args.snapshot, args.config, args.slurm_version)
    if args.json:
        print(json_text(rendered.plan_document()), end="")
    else:
        leaves = "\n" + leaf_table(rendered.plan_document()["partitions"]) if args.leaves else ""
        print(plan_table(rendered) + leaves)
    return EXIT_OK


def _cmd_head_node_program(args: argparse.Namespace) -> int:
    """Write the head-node program; print its sha256 as sha256sum does (compare it with HeadNodeProgramSha256)."""
    check_out_file(args.out)
    write_text_file(args.out, program_bytes())
    print(f"{program_sha256()}  {args.out}")
    return EXIT_OK


def _cmd_hostfile(args: argparse.Namespace) -> int:
    """As the head-node program's ``hostfile`` on a compute node, from saved ``scontrol show topology`` output."""
    try:
        units = read_topology_file(str(args.topology_file))
        print(render(order_hosts(job_nodelist(args.nodelist, os.environ), units), args.format), end="")
    except HostfileError as error:
        raise InputError("hostfile", str(error)) from None
    return EXIT_OK


def _add_plan_inputs(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--snapshot", type=Path, required=True, help="snapshot JSON of AWS responses")
    parser.add_argument("--config", type=Path, help="per-partition overrides (YAML or JSON)")
    parser.add_argument("--slurm-version", help="e.g. 24.11 or 25.11 (default: the snapshot's, else 25.11)")
    parser.add_argument("--json", action="store_true", help="print the plan document (plan.json) instead of the table")


def build_parser(operator_commands: bool = True) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="topokeeper", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    plan_parser = commands.add_parser("plan", help="plan and render the topology files")
    _add_plan_inputs(plan_parser)
    plan_parser.add_argument("--out", type=Path, required=True, help="directory for the files")
    plan_parser.set_defaults(run=_cmd_plan)

    show_parser = commands.add_parser("show", help="print the plan table only")
    _add_plan_inputs(show_parser)
    show_parser.add_argument(
        "--leaves", action="store_true", help="also each leaf switch or block: its size and full hostlist"
    )
    show_parser.set_defaults(run=_cmd_show)

    program_parser = commands.add_parser(
        "head-node-program", help=f"write the head-node program ({PROGRAM_NAME}) and print its sha256"
    )
    program_parser.add_argument("--out", type=Path, required=True, help=f"the file to write, e.g. {PROGRAM_NAME}")
    program_parser.set_defaults(run=_cmd_head_node_program)

    hostfile_parser = commands.add_parser(
        "hostfile", help="a job's nodes in topology order (each leaf or block together), for a host file or rank map"
    )
    add_hostfile_arguments(hostfile_parser, live=False)
    hostfile_parser.set_defaults(run=_cmd_hostfile)

    nccl_parser = commands.add_parser(
        "nccl-check", help="write an all_reduce_perf sbatch script per leaf and block; --results: flag the slow ones"
    )
    nccl_check.add_arguments(nccl_parser)
    nccl_parser.set_defaults(run=nccl_check.run)

    placement_parser = commands.add_parser(
        "placement", help="where jobs landed, the largest job one leaf or block can start now, why a job waits"
    )
    placement.add_arguments(placement_parser)
    placement_parser.set_defaults(run=placement.run)
    if operator_commands:
        _register_operator_commands(parser, commands)
    return parser


def _register_operator_commands(parser: argparse.ArgumentParser, commands: Any) -> None:
    # Imported here, only for the commands that use them (see PLANNING_COMMANDS).
    from topokeeper.cli import (  # noqa: PLC0415
        cost,
        kueue_commands,
        login_commands,
        operator_commands,
        preflight,
        readonly_commands,
    )
    from topokeeper.cli.agent_install import add_agent_commands  # noqa: PLC0415
    from topokeeper.sim import commands as sim_commands  # noqa: PLC0415

    operator_commands.register(commands)
    preflight.register(commands)
    cost.register(commands)
    readonly_commands.register(commands)
    add_endpoint_option(parser)
    add_agent_commands(commands)
    sim_commands.register(commands)
    kueue_commands.register(commands)
    login_commands.register(commands)


def _run_reaching_aws(args: argparse.Namespace) -> int:
    from topokeeper.adapters.aws import aws_setup_errors  # noqa: PLC0415 (botocore: see PLANNING_COMMANDS)

    with aws_setup_errors():  # a missing region or credentials in one line
        result: int = args.run(args)
    return result


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    planning = bool(argv) and argv[0] in PLANNING_COMMANDS
    args = build_parser(operator_commands=not planning).parse_args(argv)
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
