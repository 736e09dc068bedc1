"""``topokeeper verify``: what topokeeper would do on a real cluster, and what is live, without writing anything.

Before anything is deployed (no stack, no bucket, no agent): plan from a snapshot file (``topokeeper snapshot``),
then either run the applier's ``dry-run`` and ``verify`` on an EC2 / ParallelCluster head node over SSM Run
Command (``--head-node i-...``), or, where Run Command cannot reach the head node (HyperPod), write the bundle
and the applier to a directory and print the two commands to run on the controller. Both applier modes only
read: no file is written, no lock taken, slurmctld is not reconfigured.
"""

from __future__ import annotations

import argparse
import json
import shlex
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from topokeeper.cli.options import add_endpoint_option
from topokeeper.contract.errors import InputError
from topokeeper.contract.head_node_program import PROGRAM_NAME, program_bytes, program_sha256

if TYPE_CHECKING:  # the planner (pydantic) and boto3 load where verify runs, not for its --help
    from topokeeper.contract.ports import ApplyResult
    from topokeeper.render.bundle import RenderedPlan

EXIT_OK, EXIT_FAILED, EXIT_DRIFT = 0, 1, 3


class _NoBucket:
    """Without a stack there is no plan bucket: what does not fit an inline command cannot be sent."""

    def generate_presigned_url(self, *_: Any, **__: Any) -> str:
        self.put_object()
        return ""

    def put_object(self, **_: Any) -> None:
        raise InputError(
            "--bucket",
            "the applier (and a large bundle) do not fit an inline SSM command and there is no plan bucket before "
            "deploying: name an S3 bucket of yours in the head node's region with --bucket (the command fetches "
            "them by presigned URL, pinned by sha256), or use --bundle-out and run the printed commands",
        )


def result_lines(mode: str, result: ApplyResult) -> list[str]:
    """The applier's answer to one mode: its outcome, the dry-run's diff, each drift entry (kind, what, name)."""
    lines = [f"{mode}: {result.outcome.value}" + (f" ({result.error})" if result.error else "")]
    if mode == "dry-run":
        lines += (result.diff or "(no change)").rstrip("\n").splitlines()
    for item in result.drift[:20]:
        kind, what = item.get("kind"), item.get("what")
        label = " ".join(str(word) for word in dict.fromkeys((kind, what)) if word)  # "grouping" once, not twice
        lines.append(f"  {label} {item.get('name', '')}: {item.get('detail', '')}")
    if len(result.drift) > 20:
        lines.append(f"  ... {len(result.drift) - 20} more")
    return lines


def _on_head_node(rendered: RenderedPlan, head_node: str, bucket: str | None) -> tuple[dict[str, Any], list[str], int]:
    from topokeeper.adapters.aws import SEND_COMMAND_CONFIG, bucket_region, client, presigning_s3  # noqa: PLC0415
    from topokeeper.adapters.ssm_channel import SsmChannel  # noqa: PLC0415
    from topokeeper.contract.ports import Outcome  # noqa: PLC0415

    channel = SsmChannel(
        client("ssm"),
        presigning_s3(bucket_region(bucket)) if bucket else _NoBucket(),
        bucket or "",
        head_node,
        cluster=rendered.bundle.cluster_name,
        now=lambda: datetime.now(UTC),
        sender=client("ssm", None, SEND_COMMAND_CONFIG),
    )
    results = {mode: channel.run(rendered.bundle, mode) for mode in ("dry-run", "verify")}
    document = {mode: result.model_dump(mode="json") for mode, result in results.items()}
    lines = [line for mode, result in results.items() for line in result_lines(mode, result)]
    answered = {Outcome.WOULD_APPLY, Outcome.UNCHANGED, Outcome.IN_SYNC, Outcome.DRIFT}
    failed = any(result.outcome not in answered for result in results.values())
    drift = results["verify"].outcome is Outcome.DRIFT
    return document, lines, EXIT_FAILED if failed else EXIT_DRIFT if drift else EXIT_OK


def _commands_for(rendered: RenderedPlan, out: Path) -> tuple[dict[str, Any], list[str]]:
    from topokeeper.contract.operator_files import write_files  # noqa: PLC0415

    files: dict[str, str | bytes] = {"bundle.json": rendered.files()["bundle.json"], PROGRAM_NAME: program_bytes()}
    written = write_files(out, files, "--bundle-out")
    commands = [
        f"sudo python3 {PROGRAM_NAME} {mode} bundle.json   # {what}"
        for mode, what in (
            ("dry-run", "what topokeeper would change: a unified diff of every file, slurm.conf included"),
            ("verify", "what is live, compared with the plan (grouping and naming drift)"),
        )
    ]
    inspect = [
        f"sha256sum {PROGRAM_NAME}   # {program_sha256()}: the stack's output HeadNodeProgramSha256",
        f"python3 -m zipfile -l {PROGRAM_NAME}   # its sources (standard library only, stored uncompressed)",
        f"unzip -p {PROGRAM_NAME} topokeeper/headnode/modes.py   # read one (or python3 -m zipfile -e it DIR)",
    ]
    lines = [f"wrote {path}" for path in written]
    lines += [
        "before running it as root, check the program and read it if you like:",
        *(f"  {command}" for command in inspect),
        f"copy {shlex.quote(str(out))}/bundle.json and {PROGRAM_NAME} to the head node (Slurm controller) and run"
        " there, in that directory (both only read; Python 3.8+, nothing else):",
        *(f"  {command}" for command in commands),
    ]
    return {"written": [str(path) for path in written], "commands": commands, "inspect": inspect}, lines


def cmd_verify(args: argparse.Namespace) -> int:
    from topokeeper.adapters.aws import aws_setup_errors  # noqa: PLC0415
    from topokeeper.cli.planning import plan_from_files, plan_table  # noqa: PLC0415

    rendered = plan_from_files(args.snapshot, args.config, args.slurm_version)
    document: dict[str, Any] = {"plan_sha256": rendered.sha256, "plan": rendered.plan_document()}
    lines = [plan_table(rendered)]
    code = EXIT_OK
    if args.head_node:
        with aws_setup_errors():
            found, shown, code = _on_head_node(rendered, args.head_node, args.bucket)
        document.update(found)
        lines += shown
    else:
        found, shown = _commands_for(rendered, args.bundle_out)
        document.update(found)
        lines += shown
    print(json.dumps(document, indent=2) if args.json else "\n".join(lines))
    return code


def register(commands: Any) -> None:
    parser = commands.add_parser(
        "verify",
        help="read-only, before deploying: plan from a snapshot, then the head node's dry-run diff and live verify",
    )
    parser.add_argument("--snapshot", type=Path, required=True, help="snapshot JSON (topokeeper snapshot)")
    parser.add_argument("--config", type=Path, help="per-partition overrides (YAML or JSON)")
    parser.add_argument("--slurm-version", help="e.g. 24.11 or 26.05 (default: the snapshot's)")
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--head-node", help="an EC2 (i-) or SSM managed (mi-) head node: dry-run and verify over SSM")
    where.add_argument(
        "--bundle-out",
        type=Path,
        help=f"no Run Command (HyperPod): write bundle.json and {PROGRAM_NAME} here, print how",
    )
    parser.add_argument(
        "--bucket",
        help="with --head-node: an S3 bucket of yours in its region, where the command fetches the applier from",
    )
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    add_endpoint_option(parser, argparse.SUPPRESS)  # also after the subcommand
    parser.set_defaults(run=cmd_verify)
